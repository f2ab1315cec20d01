"""How a prompt relates to the prompts before it: which earlier prompt it continues, where it
stops matching, in which part of the request, and which conversation it belongs to. Pure.

Each new prompt is compared with the recent prompts of its model and with the last prompt of
every conversation still remembered (so a conversation's next turn finds its predecessor
however many other prompts ran in between). The best match is a prompt it repeats, then one it
extends (the earlier prompt is a prefix of it up to that prompt's generation prompt, which the
next turn renders otherwise), then the longest shared prefix, the most recent first. Token ids
are held as bytes, so the shared prefix is found by C-level slice comparisons.

What the difference means depends on where it is (``docs/attribution.md``): in the last turn
of either prompt it is a new question on a shared prefix (``branch``), never a loss; before the
last turn of both, in a system message, the tools or an earlier message, the earlier prompt was
changed (``rewrite``), or its history shortened (``compaction``), and what it had after the
change that the new prompt repeats was prefilled again.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

from proxy.core.prefix import (
    SYSTEM_ROLES,
    RenderedPrompt,
    message_index,
    shared_prefix,
    shared_suffix,
)
from proxy.core.reuse import repeated_tokens

__all__ = ["Attribution", "Changed", "Comparison", "PrefixKind", "PromptHistory", "compare"]

MIN_SHARED = 8
"""A best match sharing fewer tokens than this (a template header) makes a prompt cold."""

EXPLICIT_IDS = 1024
"""Conversation ids sent by agents that are remembered (the least recent is forgotten)."""

CONVERSATIONS_KEPT = 256
"""Conversations whose last prompt is kept beyond the window of recent prompts."""


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
class Attribution:
    """What one prompt shares with the prompts before it, and where it diverged."""

    prefix_kind: PrefixKind
    reusable_tokens: int
    cache_lost_tokens: int | None
    diverged_at: int | None
    diverged_section: str | None
    diverged_offset: int | None
    diverged_cost_ms: float | None
    conversation: str
    turn: int
    matched: int | None = None
    """The sequence number of the earlier prompt matched."""
    between: int = 0
    """Prompts of the same model seen after the match and before this one."""
    changed: Changed | None = None
    """For a rewrite or a compaction: what changed first."""
    repeated_tokens: int = 0
    """For a rewrite or a compaction: the matched prompt's tokens after the change that this
    prompt repeats (they had been cached and were prefilled again)."""
    predecessor_unknown: bool = False
    """The matched prompt cannot be this one's predecessor: this prompt continues a
    conversation the proxy did not see, or llama-server held a closer prompt than any seen."""
    previous_answer: int | None = None
    """The matched prompt's generated tokens, when known."""
    previous_extent: int | None = None
    """The matched prompt's tokens plus its answer's: what its slot held after it."""


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
    verdict = _classify(prompt, earlier, shared, extends)
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
class _Verdict:
    kind: PrefixKind
    changed: Changed | None = None
    repeated: int = 0
    unknown: bool = False


@dataclass(slots=True)
class _Seen:
    prompt: RenderedPrompt
    seq: int
    model: str
    model_seq: int
    conversation: str
    turn: int
    predicted_n: int | None = None
    prompt_tokens: int | None = None


@dataclass(slots=True)
class PromptHistory:
    """The prompts matched against: the last ``size`` of each model's, every remembered
    conversation's last one, at most ``max_bytes`` in all (the oldest go first); and the
    numbering of conversations."""

    size: int = 64
    max_bytes: int = 64 << 20
    _held: OrderedDict[int, _Seen] = field(default_factory=OrderedDict)
    _last: OrderedDict[str, int] = field(default_factory=OrderedDict)
    _bytes: int = 0
    _seq: int = 0
    _model_seq: dict[str, int] = field(default_factory=dict)
    _conversations: int = 0
    _explicit: dict[str, int] = field(default_factory=dict)

    def attribute(
        self,
        prompt: RenderedPrompt,
        *,
        offset: int,
        cache_n: int | None,
        ms_per_token: float | None,
        conversation_id: str | None = None,
        model: str = "",
    ) -> Attribution:
        """Match ``prompt`` against the history of ``model``, then remember it. ``offset``
        counts the tokens the tokenizer adds before the text (BOS): positions in the record
        count them, as ``cache_n`` does."""
        self._seq += 1
        model_seq = self._model_seq[model] = self._model_seq.get(model, 0) + 1
        best, shared, extends = self._best(prompt, model)
        verdict = _classify(prompt, best.prompt if best else None, shared, extends)
        kind = verdict.kind
        total = len(prompt) + offset
        # the last prompt token is always evaluated again: it yields the first token's logits
        reusable = min(shared + offset, total - 1) if kind is not PrefixKind.COLD else 0
        lost = max(0, reusable - cache_n) if cache_n is not None else None
        changed = kind in (PrefixKind.REWRITE, PrefixKind.COMPACTION)
        # the server reused more than this match allows: it held a prompt the proxy never saw
        unknown = verdict.unknown or (changed and cache_n is not None and cache_n > reusable)
        diverged_at = section = char = cost = None
        if changed or kind is PrefixKind.BRANCH:
            diverged_at = shared + offset
            section, char = prompt.section_at(shared)
            if changed and ms_per_token is not None:
                cost = round((total - diverged_at) * ms_per_token, 3)
        conversation, turn = self._conversation(prompt, best, kind, conversation_id)
        self._remember(_Seen(prompt, self._seq, model, model_seq, conversation, turn))
        return Attribution(
            prefix_kind=kind,
            reusable_tokens=reusable,
            cache_lost_tokens=lost,
            diverged_at=diverged_at,
            diverged_section=section,
            diverged_offset=char,
            diverged_cost_ms=cost,
            conversation=conversation,
            turn=turn,
            matched=best.seq if best is not None else None,
            between=model_seq - 1 - best.model_seq if best is not None else 0,
            changed=verdict.changed,
            repeated_tokens=verdict.repeated,
            predecessor_unknown=unknown,
            previous_answer=best.predicted_n if best is not None else None,
            previous_extent=_extent(best),
        )

    def answered(self, seq: int, predicted_n: int | None, prompt_tokens: int | None = None) -> None:
        """Note how many tokens the answer to prompt ``seq`` generated, after how many."""
        seen = self._held.get(seq)
        if seen is not None:
            seen.predicted_n = predicted_n
            seen.prompt_tokens = prompt_tokens

    def predicted(self, seq: int | None) -> int | None:
        """The generated tokens of prompt ``seq``'s answer, when noted and still held."""
        seen = self._held.get(seq) if seq is not None else None
        return seen.predicted_n if seen is not None else None

    @property
    def last_seq(self) -> int:
        """The sequence number of the prompt attributed last."""
        return self._seq

    @property
    def held(self) -> int:
        """How many prompts are held for matching."""
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        """About the memory the held prompts take."""
        return self._bytes

    def _best(self, prompt: RenderedPrompt, model: str) -> tuple[_Seen | None, int, bool]:
        best: _Seen | None = None
        best_key = (-1, -1, -1)
        best_shared = 0
        for seen in reversed(self._held.values()):
            if seen.model != model:
                continue
            shared = shared_prefix(prompt.tokens, seen.prompt.tokens)
            if prompt.tokens == seen.prompt.tokens:
                rank = 2  # a repeat: its own prompt, before any it extends
            elif shared >= seen.prompt.generation_start() and len(prompt) > shared:
                rank = 1
            else:
                rank = 0
            key = (rank, shared, seen.seq)
            if key > best_key:
                best, best_key, best_shared = seen, key, shared
        return best, best_shared, best_key[0] == 1

    def _conversation(
        self, prompt: RenderedPrompt, best: _Seen | None, kind: PrefixKind, explicit: str | None
    ) -> tuple[str, int]:
        if explicit is not None:
            turn = self._explicit.pop(explicit, 0) + (0 if kind is PrefixKind.RETRY else 1)
            self._explicit[explicit] = max(turn, 1)
            while len(self._explicit) > EXPLICIT_IDS:
                del self._explicit[next(iter(self._explicit))]
            return explicit, max(turn, 1)
        if best is None or not _continues(kind, prompt, best.prompt):
            self._conversations += 1
            return f"c{self._conversations}", 1
        if kind in (PrefixKind.RETRY, PrefixKind.BRANCH):
            return best.conversation, best.turn
        return best.conversation, best.turn + 1

    def _remember(self, seen: _Seen) -> None:
        self._held[seen.seq] = seen
        self._bytes += seen.prompt.nbytes
        window_start = self._seq - self.size
        previous = self._last.pop(seen.conversation, None)
        self._last[seen.conversation] = seen.seq
        if previous is not None and previous <= window_start:
            self._drop(previous)
        leaving = self._held.get(window_start)
        if leaving is not None and self._last.get(leaving.conversation) != leaving.seq:
            self._drop(leaving.seq)
        while len(self._last) > CONVERSATIONS_KEPT:
            _, seq = self._last.popitem(last=False)
            if seq <= window_start:
                self._drop(seq)
        while self._bytes > self.max_bytes and len(self._held) > 1:
            self._drop(next(iter(self._held)))

    def _drop(self, seq: int) -> None:
        seen = self._held.pop(seq, None)
        if seen is None:
            return
        self._bytes -= seen.prompt.nbytes
        if self._last.get(seen.conversation) == seq:
            del self._last[seen.conversation]


def _extent(seen: _Seen | None) -> int | None:
    if seen is None or seen.prompt_tokens is None:
        return None
    return seen.prompt_tokens + (seen.predicted_n or 0)


def _continues(kind: PrefixKind, prompt: RenderedPrompt, earlier: RenderedPrompt) -> bool:
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


def _classify(
    prompt: RenderedPrompt, earlier: RenderedPrompt | None, shared: int, extends: bool
) -> _Verdict:
    if earlier is None or shared < MIN_SHARED:
        return _Verdict(PrefixKind.COLD)
    if prompt.tokens == earlier.tokens:
        return _Verdict(PrefixKind.RETRY)
    if extends:
        return _Verdict(PrefixKind.EXTENDS)
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
    return _Verdict(kind, changed, repeated)


def _fork(prompt: RenderedPrompt, shared: int, *, unknown: bool) -> _Verdict:
    """Another task from the shared prefix: a branch when that prefix holds a whole section,
    else cold."""
    if not prompt.completes_a_section(shared):
        return _Verdict(PrefixKind.COLD)
    return _Verdict(PrefixKind.BRANCH, unknown=unknown)


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
