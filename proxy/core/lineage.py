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

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.core.prefix import RenderedPrompt, shared_prefix
from proxy.core.turns import (
    Changed,
    PrefixKind,
    classify,
    continues,
)

__all__ = ["Attribution", "PromptHistory", "Rival"]

EXPLICIT_IDS = 1024
"""Conversation ids sent by agents that are remembered (the least recent is forgotten)."""

CONVERSATIONS_KEPT = 256
"""Conversations whose last prompt is kept beyond the window of recent prompts."""


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
    others_between: int = 0
    """Prompts of other models (a router's) seen after the match and before this one."""
    between_reach: int | None = None
    """The most tokens (BOS counted) this prompt shares with any of those ``between``
    prompts: all a slot they took could still serve it. None when some are no longer held."""
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
    rival_reach: int | None = None
    """The most tokens (BOS counted) this prompt shares with a request of the same model in
    flight when its prefill began (it held a slot then); None when none was."""


@dataclass(frozen=True, slots=True)
class Rival:
    """A request of the same model in flight beside a prompt when its prefill began: it held
    a slot then, so the prompt could not reuse its prefix."""

    prompt: RenderedPrompt
    seq: int | None = None
    """Its sequence number when it was attributed first (None: not yet)."""


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
        rivals: Sequence[Rival] = (),
    ) -> Attribution:
        """Match ``prompt`` against the history of ``model``, then remember it. ``offset``
        counts the tokens the tokenizer adds before the text (BOS): positions in the record
        count them, as ``cache_n`` does. ``rivals`` are the requests in flight beside it when
        its prefill began: never its match (their prefixes were in no idle slot)."""
        self._seq += 1
        model_seq = self._model_seq[model] = self._model_seq.get(model, 0) + 1
        busy = {r.seq for r in rivals if r.seq is not None}
        best, shared, extends, shares = self._best(prompt, model, busy)
        verdict = classify(prompt, best.prompt if best else None, shared, extends)
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
        between = model_seq - 1 - best.model_seq if best is not None else 0
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
            between=between,
            others_between=self._seq - 1 - best.seq - between if best is not None else 0,
            between_reach=_reach(shares, best, model_seq, offset),
            changed=verdict.changed,
            repeated_tokens=verdict.repeated,
            predecessor_unknown=unknown,
            previous_answer=best.predicted_n if best is not None else None,
            previous_extent=_extent(best),
            rival_reach=max(
                (shared_prefix(prompt.tokens, r.prompt.tokens) + offset for r in rivals),
                default=None,
            ),
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

    def _best(
        self, prompt: RenderedPrompt, model: str, busy: set[int]
    ) -> tuple[_Seen | None, int, bool, dict[int, int]]:
        """The best match (never one numbered in ``busy``), the tokens it shares, whether this
        prompt extends it, and the tokens shared with each held prompt of ``model`` by its
        ``model_seq``."""
        best: _Seen | None = None
        best_key = (-1, -1, -1)
        best_shared = 0
        shares: dict[int, int] = {}
        for seen in reversed(self._held.values()):
            if seen.model != model:
                continue
            shared = shares[seen.model_seq] = shared_prefix(prompt.tokens, seen.prompt.tokens)
            if seen.seq in busy:
                continue
            if prompt.tokens == seen.prompt.tokens:
                rank = 2  # a repeat: its own prompt, before any it extends
            elif shared >= seen.prompt.generation_start() and len(prompt) > shared:
                rank = 1
            else:
                rank = 0
            key = (rank, shared, seen.seq)
            if key > best_key:
                best, best_key, best_shared = seen, key, shared
        return best, best_shared, best_key[0] == 1, shares

    def _conversation(
        self, prompt: RenderedPrompt, best: _Seen | None, kind: PrefixKind, explicit: str | None
    ) -> tuple[str, int]:
        if explicit is not None:
            turn = self._explicit.pop(explicit, 0) + (0 if kind is PrefixKind.RETRY else 1)
            self._explicit[explicit] = max(turn, 1)
            while len(self._explicit) > EXPLICIT_IDS:
                del self._explicit[next(iter(self._explicit))]
            return explicit, max(turn, 1)
        if best is None or not continues(kind, prompt, best.prompt):
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


def _reach(shares: dict[int, int], best: _Seen | None, model_seq: int, offset: int) -> int | None:
    """The most tokens (BOS counted) shared with a prompt seen between ``best`` and the
    prompt numbered ``model_seq``; None when one of them is no longer held."""
    if best is None:
        return None
    between = range(best.model_seq + 1, model_seq)
    if any(seq not in shares for seq in between):
        return None
    return max((shares[seq] + offset for seq in between), default=0)


def _extent(seen: _Seen | None) -> int | None:
    if seen is None or seen.prompt_tokens is None:
        return None
    return seen.prompt_tokens + (seen.predicted_n or 0)
