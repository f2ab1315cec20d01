"""Why prefill was paid: one cause per request from its prefix attribution, what it cost,
and the ranked findings with their fixes. Pure.

The causes form a closed set (a label of ``/metrics``). A request gets at most one, the first
that applies in this order: the request turned the cache off; its prompt changed before the
last turn of the earlier one (in a system message, in the tools, in the history, or by
compaction) and repeats what the earlier one had after the change; the template left out part
of the history (earlier reasoning), so the previous answer's tokens cannot be reused; the
server had the shared prefix and reused less of it, after the previous turn filled the context
(a context shift), while a request sharing more of it than was kept held a slot of a server
with several (the slot holding it was busy: this one got another), nothing at all after
prompts of other models (a router reloaded this one), after other prompts ran and kept no
more than they share with it (evicted, or another slot), or with nothing between or more of
its own tokens kept than those prompts could leave (a sliding-window model without
``--swa-full``, whose cache resumes only from checkpoints). A new question on a shared
prefix, or a prompt whose predecessor the proxy did not see, has no cause of its own; nor has
a shortfall beside such a request while the server's slot count is unknown (parallel slots
and a queue look alike then).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from proxy.core.lineage import Attribution
from proxy.core.turns import Changed, PrefixKind

__all__ = [
    "FIXES",
    "Cause",
    "Finding",
    "Findings",
    "Loss",
    "cache_cause_of",
    "cause_of",
    "dropped_section",
    "loss_of",
]

LOST_MIN_TOKENS = 16
"""Fewer tokens lost than this is the server's own margin (a checkpoint a few tokens back,
the last prompt token always evaluated again), not a finding."""


class Cause(enum.StrEnum):
    """Why a request's prefill was paid again."""

    CACHE_PROMPT_OFF = "cache_prompt_off"
    SYSTEM_PROMPT_CHANGED = "system_prompt_changed"
    TOOLS_CHANGED = "tools_changed"
    HISTORY_REWRITTEN = "history_rewritten"
    COMPACTION = "compaction"
    TEMPLATE_DROPS_HISTORY = "template_drops_history"
    CONTEXT_SHIFT = "context_shift"
    SLOT_EVICTED = "slot_evicted"
    SLOT_BUSY = "slot_busy"
    SLIDING_WINDOW = "sliding_window"
    MODEL_RELOADED = "model_reloaded"


FIXES: dict[Cause, str] = {
    Cause.CACHE_PROMPT_OFF: "drop `cache_prompt: false` from the request "
    "(llama-server caches prompts by default)",
    Cause.SYSTEM_PROMPT_CHANGED: "a value in the system prompt changes every call: keep the "
    "system prompt fixed and put the changing value (time, ids, billing header) in the last "
    "user message",
    Cause.TOOLS_CHANGED: "send the same tools in the same order with the same descriptions "
    "on every call; the tools block sits before the conversation, so any change there "
    "re-prefills everything after it",
    Cause.HISTORY_REWRITTEN: "keep the history append-only: an earlier message was changed, "
    "so everything after it was prefilled again",
    Cause.COMPACTION: "history was compacted (summarised or trimmed): expected once per "
    "compaction; if it happens every turn, compact less often or keep more turns",
    Cause.TEMPLATE_DROPS_HISTORY: "the chat template drops earlier reasoning from the history, "
    "so the previous answer's tokens in the cache are not a prefix of the next prompt: send "
    "the history without reasoning_content, or use a template that keeps it",
    Cause.CONTEXT_SHIFT: "the previous turn filled the context and llama-server shifted it "
    "(discarding tokens), so its cache no longer matches the history: raise -c (--ctx-size), "
    "cap max_tokens, or compact the history before it reaches the context",
    Cause.SLOT_EVICTED: "another prompt took the slot between two turns: run llama-server "
    "with one slot per agent (-np N), pin each conversation with id_slot, or tune "
    "--slot-prompt-similarity and --cache-ram",
    Cause.SLOT_BUSY: "requests sharing this prefix ran at once and the slot holding it was "
    "busy, so llama-server gave this one another slot, which prefilled the prefix: expected "
    "once per slot; to pay it once, send the first request alone and the rest after it, or "
    "pin each agent to its slot with id_slot",
    Cause.MODEL_RELOADED: "the router unloaded this model to load another and its prompt "
    "cache went with it: start llama-server with --models-max at least the number of models "
    "the agents use, or send one model's requests together",
    Cause.SLIDING_WINDOW: "a sliding-window model (Gemma 2/3, gpt-oss, ...) reuses a changed "
    "prompt only from context checkpoints: start llama-server with --swa-full (more KV "
    "memory), or keep every change after the last user message",
}


@dataclass(frozen=True, slots=True)
class Loss:
    """What one request's prefill lost, by cause: the first cause and its tokens, and the
    reusable prefix the server did not reuse when another cause explains the rest."""

    cause: Cause | None = None
    tokens: int | None = None
    cache_cause: Cause | None = None
    cache_tokens: int | None = None

    @property
    def total(self) -> int:
        """All the tokens lost."""
        return (self.tokens or 0) + (self.cache_tokens or 0)


_CHANGED = {
    Changed.SYSTEM: Cause.SYSTEM_PROMPT_CHANGED,
    Changed.TOOLS: Cause.TOOLS_CHANGED,
    Changed.HISTORY: Cause.HISTORY_REWRITTEN,
}


def cause_of(
    attribution: Attribution,
    *,
    cache_prompt: bool,
    missing: tuple[str, ...] = (),
    n_ctx: int | None = None,
    slots: int | None = None,
) -> Cause | None:
    """The cause of one request's paid prefill, or None (nothing the cache held was lost,
    or nothing to blame: a new question, a predecessor the proxy did not see). ``slots``
    is the server's slot count (``/props`` ``total_slots``), when known."""
    a = attribution
    if not cache_prompt and a.reusable_tokens > 0:
        return Cause.CACHE_PROMPT_OFF
    changed = a.prefix_kind in (PrefixKind.REWRITE, PrefixKind.COMPACTION)
    if changed and not a.predecessor_unknown and a.repeated_tokens > 0 and a.changed:
        if a.prefix_kind is PrefixKind.COMPACTION:
            return Cause.COMPACTION
        return _CHANGED[a.changed]
    if a.prefix_kind is PrefixKind.EXTENDS and dropped_section(missing) is not None:
        return Cause.TEMPLATE_DROPS_HISTORY
    if a.cache_lost_tokens is not None and a.cache_lost_tokens >= LOST_MIN_TOKENS:
        if n_ctx is not None and (a.previous_extent or 0) >= n_ctx - 1:
            # the previous turn and its answer filled the slot: llama-server shifted it
            return Cause.CONTEXT_SHIFT
        return _shortfall_cause(a, slots)
    return None


_SHORTFALLS = frozenset(
    {Cause.SLOT_BUSY, Cause.SLOT_EVICTED, Cause.SLIDING_WINDOW, Cause.MODEL_RELOADED}
)
"""What :func:`_shortfall_cause` names: the cache's own loss of a prefix it had."""


def _shortfall_cause(a: Attribution, slots: int | None) -> Cause | None:
    """Why the server reused less of a prefix it had been sent: a request sharing at least
    :data:`LOST_MIN_TOKENS` more of it than the server kept held a slot when this one's
    prefill began, on a server of several slots (it took the slot holding the prefix, and
    this one got another; with the slot count unknown, a queue is as likely: no cause);
    nothing at all after prompts of other models (a router unloaded this one to
    load theirs, and reloaded it empty); the slot was taken when prompts of this model ran
    in between and the server kept no more than they share with this one; else (nothing in
    between, or it kept more of this prompt's own tokens than any of them could have left)
    a sliding-window model that resumes only from a context checkpoint."""
    kept = a.reusable_tokens - (a.cache_lost_tokens or 0)
    if a.rival_reach is not None and a.rival_reach - kept >= LOST_MIN_TOKENS and slots != 1:
        return Cause.SLOT_BUSY if slots is not None else None
    if a.others_between > 0 and kept == 0:
        return Cause.MODEL_RELOADED
    if a.between == 0 or (a.between_reach is not None and kept > a.between_reach):
        return Cause.SLIDING_WINDOW
    return Cause.SLOT_EVICTED


def cache_cause_of(
    attribution: Attribution, cause: Cause | None, slots: int | None = None
) -> Cause | None:
    """The cause of the reusable prefix the server did not reuse (``cache_lost_tokens``),
    when another cause explains the rest of the prompt: a clock in the system prompt on a
    sliding-window server loses both the tokens after the change (that cause) and the
    prefix before it (this one). They do not overlap, and their fixes differ."""
    a = attribution
    if cause is None or cause in (Cause.CACHE_PROMPT_OFF, Cause.CONTEXT_SHIFT, *_SHORTFALLS):
        return None
    if a.cache_lost_tokens is None or a.cache_lost_tokens < LOST_MIN_TOKENS:
        return None
    return _shortfall_cause(a, slots)


def dropped_section(missing: tuple[str, ...]) -> str | None:
    """The latest history message whose reasoning the template left out (its section name):
    the previous answer, whose tokens the cache held."""
    return next((m for m in reversed(missing) if m.endswith(".reasoning_content")), None)


def loss_of(
    attribution: Attribution,
    *,
    cache_prompt: bool,
    missing: tuple[str, ...] = (),
    n_ctx: int | None = None,
    prompt_n: int | None = None,
    slots: int | None = None,
) -> Loss:
    """The causes of one request's paid prefill and the tokens each cost: for a changed
    prompt, what the earlier one had after the change that this one repeats; for a template
    that drops history, the previous answer; otherwise the reusable prefix not reused. All
    together never more than llama-server evaluated (``prompt_n``)."""
    a = attribution
    cause = cause_of(a, cache_prompt=cache_prompt, missing=missing, n_ctx=n_ctx, slots=slots)
    if cause is None:
        return Loss()
    cache_cause = cache_cause_of(a, cause, slots)
    budget = prompt_n if prompt_n is not None else 1 << 62
    cache_tokens = min(a.cache_lost_tokens or 0, budget) if cache_cause is not None else None
    tokens = _tokens_of(a, cause)
    if tokens is not None:
        tokens = min(tokens, budget - (cache_tokens or 0))
    return Loss(cause, tokens, cache_cause, cache_tokens)


def _tokens_of(a: Attribution, cause: Cause) -> int | None:
    if cause in (
        Cause.SYSTEM_PROMPT_CHANGED,
        Cause.TOOLS_CHANGED,
        Cause.HISTORY_REWRITTEN,
        Cause.COMPACTION,
    ):
        return a.repeated_tokens
    if cause is Cause.TEMPLATE_DROPS_HISTORY:
        return a.previous_answer
    return a.cache_lost_tokens


@dataclass(slots=True)
class Finding:
    """One cause (at one section) across requests."""

    cause: Cause
    section: str | None
    requests: int = 0
    tokens: int = 0
    ms: float = 0.0
    offset: int | None = None
    """Where in the section the latest change was (characters), when known."""

    def to_dict(self) -> dict[str, Any]:
        """The ``/stats`` ``cache.findings`` entry."""
        return {
            "cause": str(self.cause),
            "section": self.section,
            "offset": self.offset,
            "requests": self.requests,
            "lost_tokens": self.tokens,
            "lost_ms": round(self.ms, 3),
            "fix": FIXES[self.cause],
        }


@dataclass(slots=True)
class Findings:
    """Findings by cause and section, ranked by the milliseconds they cost. Bounded: at most
    ``limit`` distinct (cause, section) pairs are kept; the cheapest gives way."""

    limit: int = 64
    _by_key: dict[tuple[Cause, str | None], Finding] = field(default_factory=dict)

    def add(
        self,
        cause: Cause,
        section: str | None,
        tokens: int | None,
        ms: float | None,
        offset: int | None = None,
    ) -> None:
        """Count one request of ``cause``."""
        key = (cause, section if cause not in _SECTIONLESS else None)
        finding = self._by_key.get(key)
        if finding is None:
            if len(self._by_key) >= self.limit:
                cheapest = min(self._by_key, key=lambda k: self._by_key[k].ms)
                del self._by_key[cheapest]
            finding = self._by_key[key] = Finding(cause, key[1])
        finding.requests += 1
        finding.tokens += tokens or 0
        finding.ms += ms or 0.0
        if offset is not None:
            finding.offset = offset

    def ranked(self) -> list[Finding]:
        """Most milliseconds lost first, then most requests."""
        return sorted(self._by_key.values(), key=lambda f: (-f.ms, -f.requests, f.cause))


_SECTIONLESS = frozenset(
    {
        Cause.CACHE_PROMPT_OFF,
        Cause.CONTEXT_SHIFT,
        Cause.COMPACTION,
        *_SHORTFALLS,
    }
)
