"""What one prompt is to another: the kind of turn (a retry, the next turn, a branch, a
rewrite, a compaction), what changed first and what of the earlier prompt after the change
the new one repeats. Pure; the history (:mod:`proxy.core.lineage`) picks which earlier prompt
to compare with, and an agent may name one itself (:func:`compare`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.core.prefix import (
    SYSTEM_ROLES,
    RenderedPrompt,
    message_index,
    shared_prefix,
    shared_suffix,
)
from proxy.core.reuse import repeated_tokens

__all__ = [
    "MIN_SHARED",
    "Changed",
    "Comparison",
    "PrefixKind",
    "Verdict",
    "classify",
    "compare",
    "continues",
]

MIN_SHARED = 8
"""A best match sharing fewer tokens than this (a template header) makes a prompt cold."""


class PrefixKind(enum.StrEnum):
    """How a prompt relates to the best-matching earlier one."""

    COLD = "cold"
    RETRY = "retry"
    EXTENDS = "extends"
    BRANCH = "branch"
    REWRITE = "rewrite"
    COMPACTION = "compaction"


class Changed(enum.StrEnum):
    """What a rewrite or a compaction changed first."""

    SYSTEM = "system"
    TOOLS = "tools"
    HISTORY = "history"


@dataclass(frozen=True, slots=True)
class Comparison:
    """How a prompt relates to one named earlier prompt (not the best match: the one an agent
    asked about): the kind, the shared prefix in tokens (no BOS), what changed and what of
    the earlier prompt after the difference this one repeats."""

    kind: PrefixKind
    shared: int
    changed: Changed | None = None
    repeated: int = 0
    section: str | None = None


def compare(prompt: RenderedPrompt, earlier: RenderedPrompt) -> Comparison:
    """``prompt`` against ``earlier``, by the rules the history's matching uses."""
    shared = shared_prefix(prompt.tokens, earlier.tokens)
    extends = shared >= earlier.generation_start() and len(prompt) > shared
    verdict = classify(prompt, earlier, shared, extends)
    if verdict.kind in (PrefixKind.RETRY, PrefixKind.EXTENDS):
        return Comparison(verdict.kind, shared)
    repeated = verdict.repeated
    if verdict.kind in (PrefixKind.BRANCH, PrefixKind.COLD):
        repeated = repeated_tokens(
            earlier.tokens, prompt.tokens, shared, len(earlier), earlier.content
        )
    section = prompt.section_at(shared)[0]
    return Comparison(verdict.kind, shared, verdict.changed, repeated, section)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What ``classify`` found: the kind, the change, the repeated tokens, and whether the
    new prompt continues a conversation the proxy did not see."""

    kind: PrefixKind
    changed: Changed | None = None
    repeated: int = 0
    unknown: bool = False


def continues(kind: PrefixKind, prompt: RenderedPrompt, earlier: RenderedPrompt) -> bool:
    """Whether ``prompt`` goes on with ``earlier``'s conversation: it repeats or extends it,
    or holds one of its messages other than the system ones (a changed clock on the next turn,
    an edited question); sharing only the system prompt and the tools is another task."""
    if kind in (PrefixKind.RETRY, PrefixKind.EXTENDS):
        return True
    return kind is not PrefixKind.COLD and _shares_history(prompt, earlier)


def _shares_history(prompt: RenderedPrompt, earlier: RenderedPrompt) -> bool:
    """Whether ``prompt`` holds one of ``earlier``'s messages other than the system ones."""
    theirs = {
        d
        for d, role in zip(earlier.messages, earlier.roles, strict=True)
        if role not in SYSTEM_ROLES
    }
    return any(
        d in theirs
        for d, role in zip(prompt.messages, prompt.roles, strict=True)
        if role not in SYSTEM_ROLES
    )


def classify(
    prompt: RenderedPrompt, earlier: RenderedPrompt | None, shared: int, extends: bool
) -> Verdict:
    if earlier is None or shared < MIN_SHARED:
        return Verdict(PrefixKind.COLD)
    if prompt.tokens == earlier.tokens:
        return Verdict(PrefixKind.RETRY)
    if extends:
        return Verdict(PrefixKind.EXTENDS)
    ours, theirs = prompt.section_at(shared)[0], earlier.section_at(shared)[0]
    ours_last, theirs_last = prompt.in_last_turn(ours), earlier.in_last_turn(theirs)
    if ours_last or theirs_last:
        # a new question on a shared prefix; with history of its own after the fork, this
        # prompt continues a conversation whose earlier turns the proxy did not see
        return _fork(prompt, shared, unknown=not ours_last)
    repeated = repeated_tokens(earlier.tokens, prompt.tokens, shared, len(earlier), earlier.content)
    if repeated == 0 and not _shares_history(prompt, earlier):
        # nothing the earlier prompt had after the difference is here, not one of its
        # messages: another task on the same prefix, whose own earlier turns were not seen
        return _fork(prompt, shared, unknown=prompt.has_history())
    changed = _what_changed(prompt, earlier, ours, theirs)
    if changed is Changed.SYSTEM and not _same_instructions(prompt, earlier, ours, theirs, shared):
        # another agent's instructions, not these changed: they share a few words only
        return _fork(prompt, shared, unknown=prompt.has_history())
    kind = PrefixKind.REWRITE
    if changed is Changed.HISTORY and _shortened(prompt, earlier, message_index(ours)):
        kind = PrefixKind.COMPACTION
    return Verdict(kind, changed, repeated)


def _fork(prompt: RenderedPrompt, shared: int, *, unknown: bool) -> Verdict:
    """Another task from the shared prefix: a branch when that prefix holds a whole section,
    else cold."""
    if not prompt.completes_a_section(shared):
        return Verdict(PrefixKind.COLD)
    return Verdict(PrefixKind.BRANCH, unknown=unknown)


def _same_instructions(
    prompt: RenderedPrompt, earlier: RenderedPrompt, ours: str, theirs: str, shared: int
) -> bool:
    """Whether a system message that differs is the same one changed (a clock, an id: at
    least half of the earlier text kept at its two ends), not another agent's. A system
    message added or removed is a change."""
    if prompt.role_of(ours) not in SYSTEM_ROLES or earlier.role_of(theirs) not in SYSTEM_ROLES:
        return True
    start, end = earlier.text_tokens(theirs)
    low, high = prompt.text_tokens(ours)
    if end <= start:
        return True
    before = min(max(0, shared - start), end - start)
    after = shared_suffix(earlier.tokens[start * 4 : end * 4], prompt.tokens[low * 4 : high * 4])
    return 2 * (before + after) >= end - start


def _what_changed(
    prompt: RenderedPrompt, earlier: RenderedPrompt, ours: str, theirs: str
) -> Changed:
    """The part the difference is in, on either side: a system message removed leaves the
    tools where it was, and is still a system change."""
    if prompt.role_of(ours) in SYSTEM_ROLES or earlier.role_of(theirs) in SYSTEM_ROLES:
        return Changed.SYSTEM
    if ours.startswith("tools[") or theirs.startswith("tools["):
        return Changed.TOOLS
    return Changed.HISTORY


def _shortened(prompt: RenderedPrompt, earlier: RenderedPrompt, first: int | None) -> bool:
    """Whether the earlier prompt's messages from ``first`` on are fewer in the new prompt:
    more of them are gone than the new prompt put in their place (a summary, or nothing),
    not counting what it appended after the last of them it kept (the next turn)."""
    if first is None:
        return False
    ours, theirs = prompt.messages[first:], set(earlier.messages[first:])
    kept = [i for i, d in enumerate(ours) if d in theirs]
    end = kept[-1] + 1 if kept else max(0, prompt.last_turn - first)
    added = sum(1 for d in ours[:end] if d not in theirs)
    removed = sum(1 for d in earlier.messages[first:] if d not in set(ours))
    return removed > added
