"""A kind's summary of records: ``{p50, p90, p99}`` of each field, the prefill/decode split,
speculation and the cache ratio; exact, by sorting (``timing-proxy report``).

Pure. ``/stats`` gives the same layout from its windows (:mod:`proxy.core.windows`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from proxy.core.record import Kind, Record

__all__ = [
    "QUANTILES",
    "SUMMARY_FIELDS",
    "assemble_summary",
    "cache_ratio",
    "percentile",
    "quantiles",
    "speculation",
    "summarize",
    "summarize_cache",
    "summarize_kind",
]

SUMMARY_FIELDS: tuple[str, ...] = (
    "ttft_ms",
    "prefill_ms",
    "decode_ms",
    "decode_tok_s",
    "e2e_ms",
    "overhead_ms",
    "tool_call_ms",
    "draft_acceptance",
    "image_tokens",
    "image_prefill_ms",
    "energy_mj",
    "energy_mj_per_token",
    "power_w_avg",
    "upstream_cpu_ms",
)
"""Record fields summarised as ``{p50, p90, p99}`` for each kind (over the records that
know the value: ``image_tokens`` over the requests with images, ``draft_acceptance`` over
the speculative ones, the board's over the ones the telemetry covered)."""

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile of sorted ``values`` by linear interpolation (numpy's default).

    ``None`` for no values. With five values the median is the third.
    """
    if not values:
        return None
    pos = (len(values) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return round(values[lo], 3)
    return round(values[lo] + (values[hi] - values[lo]) * (pos - lo), 3)


def quantiles(ordered: Sequence[float]) -> dict[str, float | None]:
    """``{p50, p90, p99}`` of the sorted ``ordered`` (each ``None`` when it is empty)."""
    return {name: percentile(ordered, q) for name, q in QUANTILES}


def cache_ratio(cache_n: int, prompt_tokens: int) -> dict[str, Any]:
    """The ``cache`` object of ``/stats``: the sums and ``hit_ratio`` = sum of ``cache_n`` /
    sum of prompt tokens (``None`` when no prompt token is known)."""
    return {
        "cache_n": cache_n,
        "prompt_tokens": prompt_tokens,
        "hit_ratio": round(cache_n / prompt_tokens, 6) if prompt_tokens else None,
    }


def summarize_cache(records: Iterable[Record]) -> dict[str, Any]:
    """:func:`cache_ratio` over the records that know both ``cache_n`` and ``prompt_tokens``."""
    cache_n = prompt_tokens = 0
    for r in records:
        if r.cache_n is not None and r.prompt_tokens is not None:
            cache_n += r.cache_n
            prompt_tokens += r.prompt_tokens
    return cache_ratio(cache_n, prompt_tokens)


def summarize_kind(
    records: Sequence[Record], fields: Iterable[str] = SUMMARY_FIELDS
) -> dict[str, Any]:
    """``count``, ``{p50, p90, p99}`` of each field over the known values, and the split
    between the median prefill and the median decode: exact, by sorting."""
    return assemble_summary(
        len(records),
        {
            name: quantiles(sorted(v for r in records if (v := getattr(r, name)) is not None))
            for name in fields
        },
        speculation((r.draft_acceptance, r.decode_tok_s) for r in records),
    )


def speculation(pairs: Iterable[tuple[float | None, float | None]]) -> dict[str, Any]:
    """The ``speculation`` object of a kind's summary, from each record's
    ``(draft_acceptance, decode_tok_s)``: how many drafted, and the median decode rate with
    speculation (a draft was proposed) and without, each ``None`` where none occurred."""
    drafted: list[float] = []
    plain: list[float] = []
    count = 0
    for acceptance, rate in pairs:
        if acceptance is not None:
            count += 1
        if rate is not None:
            (drafted if acceptance is not None else plain).append(rate)
    drafted.sort()
    plain.sort()
    return {
        "drafted": count,
        "decode_tok_s_p50_with": percentile(drafted, 0.5),
        "decode_tok_s_p50_without": percentile(plain, 0.5),
    }


def assemble_summary(
    count: int, fields: dict[str, dict[str, float | None]], spec: dict[str, Any]
) -> dict[str, Any]:
    """A kind's summary of ``count`` records from each field's ``{p50, p90, p99}`` and
    their :func:`speculation`: the split is between the median prefill and decode."""
    out: dict[str, Any] = {"count": count, **fields}
    pre = out.get("prefill_ms", {}).get("p50")
    dec = out.get("decode_ms", {}).get("p50")
    total = (pre or 0.0) + (dec or 0.0) if pre is not None and dec is not None else None
    out["split"] = {
        "prefill_ms": pre,
        "decode_ms": dec,
        "prefill_pct": round(100.0 * pre / total, 1) if total and pre is not None else None,
        "decode_pct": round(100.0 * dec / total, 1) if total and dec is not None else None,
    }
    out["speculation"] = spec
    return out


def summarize(records: Iterable[Record]) -> dict[str, Any]:
    """Summaries of ``chat`` and ``tool`` records (the ``kinds`` shape of ``/stats``)."""
    by_kind: dict[str, list[Record]] = {Kind.CHAT: [], Kind.TOOL: []}
    for r in records:
        if r.kind in by_kind:
            by_kind[r.kind].append(r)
    return {str(k): summarize_kind(v) for k, v in by_kind.items()}
