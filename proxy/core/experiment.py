"""The arithmetic of ``timing-proxy explain``: paired differences, their spread, the noise
rule, and one row per term. Pure: the requests live in :mod:`proxy.commands.explain`.

Every term compares two variants of the same request sent back to back on the same board
(a *pair*); a run sends every pair once, and ``--runs N`` repeats the runs. A pair's
difference cancels what both variants share (the board's load at that moment, the prompt);
what is left varies from pair to pair, and that variation is the noise.

**Spread: the interquartile range of the paired differences** (``q3 - q1``, quartiles
interpolated between the ordered values, ``statistics.quantiles(method="inclusive")``). The
middle half of what the pairs measured: one pair hit by a burst of someone else's load moves
it little, which the min-max range would not survive; a bootstrap would need many more pairs
than an experiment of 2-5 runs gives, and would print a different spread on every call.

**The noise rule**: a difference is measurable when its median lies outside the spread,
``|p50| > IQR``; otherwise it is printed as "not measurable here". With two pairs this is
"both pairs agree on the sign" (the IQR of two values is half their distance, their median
the midpoint). One pair has no spread, so nothing is measurable from one pair.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.numbers import figure_or_dash

__all__ = [
    "NOT_MEASURABLE",
    "CacheSample",
    "DecodeSample",
    "Difference",
    "ImageSample",
    "SchemaSample",
    "Term",
    "ThinkingSample",
    "ToolCallSeen",
    "cache_term",
    "decode_term",
    "difference",
    "image_term",
    "iqr",
    "raw_call",
    "render_table",
    "same_call",
    "schema_term",
    "thinking_term",
    "unavailable",
]

NOT_MEASURABLE = "not measurable here"
"""What a difference within its spread is printed as."""


def iqr(values: Sequence[float]) -> float | None:
    """The interquartile range of ``values`` (quartiles interpolated, inclusive); ``None``
    for fewer than two values."""
    if len(values) < 2:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


@dataclass(frozen=True, slots=True)
class Difference:
    """The paired differences of one term, summarised."""

    p50: float | None
    spread: float | None
    """IQR of the paired differences; ``None`` below two pairs."""
    n: int

    @property
    def measurable(self) -> bool:
        """The noise rule: the median lies outside the spread (two pairs at least)."""
        return self.p50 is not None and self.spread is not None and abs(self.p50) > self.spread


def difference(values: Sequence[float]) -> Difference:
    """Median, spread and count of paired differences ``values``."""
    if not values:
        return Difference(None, None, 0)
    return Difference(statistics.median(values), iqr(values), len(values))


def _p50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True, slots=True)
class Term:
    """One row of the table: a term, its difference and what it suggests, with the numbers
    behind it (``detail``) for the JSON file."""

    name: str
    diff: Difference
    suggests: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON: ``p50_ms``, ``spread_ms``, ``n``, ``measurable``, ..."""
        return {
            "term": self.name,
            "p50_ms": _round(self.diff.p50),
            "spread_ms": _round(self.diff.spread),
            "n": self.diff.n,
            "measurable": self.diff.measurable,
            "suggests": self.suggests,
            **self.detail,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def unavailable(name: str, why: str) -> Term:
    """A term that could not be measured on this server or prompt set, and why."""
    return Term(name, Difference(None, None, 0), why)


def _fig(value: float | None) -> str:
    return figure_or_dash(value)


# -- schema prefill -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchemaSample:
    """One pair: the same request with its tools and without, both with the cache cold."""

    with_tools_ms: float
    with_tools_prompt_n: int
    without_tools_ms: float
    schema_tokens: int
    """input tokens with the tools less without them (the server's counting endpoint)."""

    @property
    def estimate_ms(self) -> float | None:
        """The record's estimate: schema tokens at the with-tools request's ms per token."""
        if self.with_tools_prompt_n <= 0:
            return None
        return self.schema_tokens * self.with_tools_ms / self.with_tools_prompt_n


def schema_term(samples: Sequence[SchemaSample]) -> Term:
    """Schema prefill: prefill ms with the tools less without, measured, beside the
    record's estimate for the same requests."""
    diff = difference([s.with_tools_ms - s.without_tools_ms for s in samples])
    estimate = _p50([e for s in samples if (e := s.estimate_ms) is not None])
    tokens = _p50([float(s.schema_tokens) for s in samples])
    if diff.measurable:
        suggests = (
            f"the tools cost {_fig(diff.p50)} ms of prefill per cold call "
            f"({_fig(tokens)} tokens; the record estimates {_fig(estimate)} ms)"
        )
    else:
        suggests = f"{NOT_MEASURABLE} (the record estimates {_fig(estimate)} ms)"
    return Term(
        "schema prefill",
        diff,
        suggests,
        {"estimate_p50_ms": _round(estimate), "schema_tokens_p50": tokens},
    )


# -- the free fix ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheSample:
    """One pair: the tool request with the cache cold, and again right after a request
    that shares its prefix (the cache warm)."""

    cold_ms: float
    warm_ms: float
    call_ms: float
    """The cold call's prefill plus decode, server clock: what the saving is a share of."""
    warm_cached_tokens: int


def cache_term(samples: Sequence[CacheSample]) -> Term:
    """The free fix: prefill ms cold less warm, per call and as a share of the call."""
    diff = difference([s.cold_ms - s.warm_ms for s in samples])
    percent = _p50([100 * (s.cold_ms - s.warm_ms) / s.call_ms for s in samples if s.call_ms > 0])
    cached = _p50([float(s.warm_cached_tokens) for s in samples])
    if diff.measurable:
        suggests = (
            f"a warm prefix saves {_fig(diff.p50)} ms per call ({_fig(percent)}% of the call): "
            "keep cache_prompt on and the tools and system turn the same in every call"
        )
    else:
        suggests = NOT_MEASURABLE
    return Term(
        "free fix (cache warm)",
        diff,
        suggests,
        {"saving_percent_p50": _round(percent), "warm_cached_tokens_p50": cached},
    )


# -- the tool path's decode -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCallSeen:
    """A call's name and its arguments, parsed (``None`` when they were not valid JSON)."""

    name: str
    arguments: Any

    @classmethod
    def from_wire(cls, name: str, arguments: str) -> ToolCallSeen:
        """A call as Chat Completions sends it: the arguments as a JSON string."""
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        return cls(name, parsed)


def raw_call(text: str) -> ToolCallSeen | None:
    """The first call written in a raw completion: the first JSON object in ``text`` with a
    string ``name`` and an ``arguments`` (or ``parameters``) member, as the Hermes/Qwen
    family writes it between ``<tool_call>`` tags; ``None`` when there is none."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", obj.get("parameters"))
            if isinstance(args, str):
                return ToolCallSeen.from_wire(obj["name"], args)
            if args is not None:
                return ToolCallSeen(obj["name"], args)
        start = text.find("{", start + 1)
    return None


def same_call(a: ToolCallSeen | None, b: ToolCallSeen | None) -> bool:
    """Both are calls, with the same name and equal parsed arguments."""
    return a is not None and b is not None and a.arguments is not None and a == b


@dataclass(frozen=True, slots=True)
class DecodeSample:
    """One pair: the tool call through Chat Completions, and the same prompt rendered by the
    served template and completed raw on ``/completion`` for as many tokens."""

    chat_call: ToolCallSeen | None
    chat_tokens: int
    chat_decode_ms: float
    chat_tok_s: float | None
    raw_call: ToolCallSeen | None
    raw_tokens: int
    raw_decode_ms: float
    raw_tok_s: float | None

    @property
    def matching(self) -> bool:
        """The same call, in the same number of tokens: only then is the rate comparable."""
        return same_call(self.chat_call, self.raw_call) and self.chat_tokens == self.raw_tokens


def decode_term(samples: Sequence[DecodeSample]) -> Term:
    """The tool path's decode cost: decode ms of the call through Chat Completions less the
    same tokens completed raw, over the pairs whose calls match; llama-server's own rates."""
    matching = [s for s in samples if s.matching]
    diff = difference([s.chat_decode_ms - s.raw_decode_ms for s in matching])
    chat_rate = _p50([r for s in matching if (r := s.chat_tok_s) is not None])
    raw_rate = _p50([r for s in matching if (r := s.raw_tok_s) is not None])
    detail = {
        "matching": len(matching),
        "pairs": len(samples),
        "chat_tok_s_p50": _round(chat_rate),
        "raw_tok_s_p50": _round(raw_rate),
        "all_chat_tok_s_p50": _round(_p50([r for s in samples if (r := s.chat_tok_s)])),
        "all_raw_tok_s_p50": _round(_p50([r for s in samples if (r := s.raw_tok_s)])),
    }
    if not matching:
        no_chat_call = sum(1 for s in samples if s.chat_call is None)
        why = f"the raw completion wrote another call or token count in {len(samples)} pair(s)"
        if no_chat_call:
            why = f"no tool call through Chat Completions in {no_chat_call} of {len(samples)} "
            why += "pair(s), another call or token count raw in the rest"
        if not samples:
            why = "no pair"
        return Term("tool-path decode", diff, f"not compared: {why}", detail)
    rates = f"{_fig(chat_rate)} tok/s tool path vs {_fig(raw_rate)} raw"
    mismatched = len(samples) - len(matching)
    rates += f"; {mismatched} pair(s) differed, left out" if mismatched else ""
    if diff.measurable and diff.p50 is not None and diff.p50 > 0:
        suggests = f"the tool path (grammar, parser) slows decode: {rates}"
    elif diff.measurable:
        suggests = f"the tool path decodes faster here: {rates}"
    else:
        suggests = f"{NOT_MEASURABLE} ({rates}): a slower tool call is its tokens"
    return Term("tool-path decode", diff, suggests, detail)


# -- thinking -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThinkingSample:
    """One pair: the tool request with ``enable_thinking`` true and false: what came before
    the call (or before the end, when no call came within ``max_tokens``)."""

    on_ms: float
    on_tokens: int
    on_called: bool
    off_ms: float
    off_tokens: int
    off_called: bool


def thinking_term(samples: Sequence[ThinkingSample]) -> Term:
    """Thinking: ms and tokens before the call with thinking on less off, over the pairs
    where the request without thinking made a call (the baseline); a pair where thinking on
    never reached the call within ``max_tokens`` counts as a lower bound, said so."""
    called = [s for s in samples if s.off_called]
    diff = difference([s.on_ms - s.off_ms for s in called])
    tokens = _p50([float(s.on_tokens - s.off_tokens) for s in called])
    no_call = sum(1 for s in called if not s.on_called)
    detail = {"tokens_before_call_p50": tokens, "on_without_call": no_call, "pairs": len(samples)}
    if not called:
        why = f"no call without thinking in {len(samples)} pair(s)" if samples else "no pair"
        return Term("thinking", diff, f"not compared: {why}", detail)
    bound = f"; no call within max_tokens in {no_call} pair(s): a lower bound" if no_call else ""
    if diff.measurable and diff.p50 is not None and diff.p50 > 0:
        suggests = (
            f"thinking adds {_fig(diff.p50)} ms and {_fig(tokens)} tokens before the call"
            f"{bound}: send chat_template_kwargs.enable_thinking false"
        )
    elif diff.measurable:
        suggests = f"thinking does not delay the call here ({_fig(tokens)} tokens{bound})"
    else:
        suggests = f"{NOT_MEASURABLE} ({_fig(tokens)} tokens{bound})"
    return Term("thinking", diff, suggests, detail)


# -- image ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageSample:
    """One pair: the same request with its images and without, cache cold."""

    with_ms: float
    without_ms: float
    image_tokens: int
    """prompt tokens with the images less without them."""


def image_term(samples: Sequence[ImageSample]) -> Term:
    """Image: prefill ms with the images less without."""
    diff = difference([s.with_ms - s.without_ms for s in samples])
    tokens = _p50([float(s.image_tokens) for s in samples])
    if diff.measurable:
        suggests = (
            f"the images cost {_fig(diff.p50)} ms of prefill per cold call "
            f"({_fig(tokens)} tokens): smaller or fewer images, or keep them cached"
        )
    else:
        suggests = NOT_MEASURABLE
    return Term("image", diff, suggests, {"image_tokens_p50": tokens})


# -- the table ------------------------------------------------------------------------------


def _cells(term: Term) -> list[str]:
    d = term.diff
    return [term.name, _fig(d.p50), _fig(d.spread), str(d.n), term.suggests]


def render_table(terms: Sequence[Term]) -> str:
    """The terms as a terminal table: term, ms p50, spread (the IQR, ms), n, suggests."""
    rows = [["term", "ms p50", "IQR ms", "n", "what it suggests"], *map(_cells, terms)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row in rows:
        head = [row[0].ljust(widths[0]), *(row[i].rjust(widths[i]) for i in (1, 2, 3))]
        lines.append("  ".join([*head, row[4]]))
    return "\n".join(lines) + "\n"
