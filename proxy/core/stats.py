"""Aggregation of records: percentiles per kind, cache sums, and the ``/stats`` document.

Pure. Memory is bounded: percentiles are computed over a sliding window of the last
``window`` records of each kind (a ``deque`` with ``maxlen``), while counts and cache sums
are running totals since start. ``recent`` keeps the last N records whole.
The same :func:`summarize` serves ``/stats`` and ``timing-proxy report``.
"""

from __future__ import annotations

import math
import operator
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from proxy.core.record import Kind, Outcome, Record

__all__ = [
    "SUMMARY_FIELDS",
    "Stats",
    "cache_ratio",
    "percentile",
    "quantiles",
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
)
"""Record fields summarised as ``{p50, p90, p99}`` for each kind."""

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
    """``count``, ``{p50, p90, p99}`` of each field over the known values, and the split.

    The split is taken between the median prefill and the median decode, as the Jetson
    measurement's "796 ms of prefill and 1,265 ms of decode, 39 and 61 percent".
    """
    return _summarize_columns(
        len(records),
        {
            name: sorted(v for r in records if (v := getattr(r, name)) is not None)
            for name in fields
        },
    )


def _summarize_columns(count: int, columns: dict[str, list[float]]) -> dict[str, Any]:
    """:func:`summarize_kind` of ``count`` records given their known values per field,
    each column sorted."""
    out: dict[str, Any] = {"count": count}
    for name, values in columns.items():
        out[name] = quantiles(values)
    pre = out.get("prefill_ms", {}).get("p50")
    dec = out.get("decode_ms", {}).get("p50")
    total = (pre or 0.0) + (dec or 0.0) if pre is not None and dec is not None else None
    out["split"] = {
        "prefill_ms": pre,
        "decode_ms": dec,
        "prefill_pct": round(100.0 * pre / total, 1) if total and pre is not None else None,
        "decode_pct": round(100.0 * dec / total, 1) if total and dec is not None else None,
    }
    return out


def summarize(records: Iterable[Record]) -> dict[str, Any]:
    """Summaries of ``chat`` and ``tool`` records (the ``kinds`` shape of ``/stats``)."""
    by_kind: dict[str, list[Record]] = {Kind.CHAT: [], Kind.TOOL: []}
    for r in records:
        if r.kind in by_kind:
            by_kind[r.kind].append(r)
    return {str(k): summarize_kind(v) for k, v in by_kind.items()}


_Row = tuple[float | None, ...]
"""A record's :data:`SUMMARY_FIELDS`, in that order: what a window keeps of it."""
_summary_row: Callable[[Record], _Row] = operator.attrgetter(*SUMMARY_FIELDS)


class Stats:
    """Running totals and bounded windows of records, rendered as the ``/stats`` document.

    A window keeps only each record's :data:`SUMMARY_FIELDS` as a tuple of floats (and
    ``None``). Such tuples hold no references, so CPython's garbage collector stops tracking
    them: full windows (20,000 records) cost a full collection nothing, where whole records
    made each one a pause of about 10 ms. Whole records stay only in ``recent``.
    """

    def __init__(self, *, since: str, recent: int = 100, window: int = 10_000) -> None:
        self.since = since
        self.requests = 0
        self._outcomes: Counter[str] = Counter()
        self._kinds: Counter[str] = Counter()
        self._apis: Counter[str] = Counter()
        self._windows: dict[Kind, deque[_Row]] = {
            Kind.CHAT: deque(maxlen=window),
            Kind.TOOL: deque(maxlen=window),
        }
        self._recent: deque[Record] = deque(maxlen=recent)
        self._cache_n = 0
        self._prompt_tokens = 0

    def add(self, record: Record) -> None:
        """Count one finished request."""
        self.requests += 1
        self._outcomes[str(record.outcome)] += 1
        self._kinds[str(record.kind)] += 1
        self._apis[record.api or "other"] += 1
        window = self._windows.get(record.kind)
        if window is not None and record.outcome is Outcome.COMPLETED:
            window.append(_summary_row(record))  # latency percentiles: completed only
        self._recent.append(record)
        if record.cache_n is not None and record.prompt_tokens is not None:
            self._cache_n += record.cache_n
            self._prompt_tokens += record.prompt_tokens

    def find(self, record_id: str) -> Record | None:
        """A recent record by id (``None`` once it has left the ``recent`` window)."""
        for record in reversed(self._recent):
            if record.id == record_id:
                return record
        return None

    def snapshot(self) -> dict[str, Any]:
        """The ``/stats`` document, in one go (see :meth:`snapshot_steps`)."""
        steps = self.snapshot_steps()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    def snapshot_steps(self) -> Generator[None, None, dict[str, Any]]:
        """The ``/stats`` document, built in steps; the generator's return value.

        It yields after each field of each window: one step sorts at most one window's
        values of one field (about 1 ms for 10,000 on a small board), so a caller on the
        relay's event loop can let streams run between steps instead of stalling them for
        the whole document (17 ms with full windows). The document is the state when the
        generator started: records added meanwhile are left out.
        """
        windows = {kind: list(window) for kind, window in self._windows.items()}
        counts = {kind: self._kinds[str(kind)] for kind in windows}
        recent = list(self._recent)
        doc: dict[str, Any] = {
            "requests": self.requests,
            "since": self.since,
            "outcomes": dict(self._outcomes),
            "apis": dict(self._apis),
            "kinds": {},
            "cache": cache_ratio(self._cache_n, self._prompt_tokens),
        }
        for kind, rows in windows.items():
            columns: dict[str, list[float]] = {}
            for i, name in enumerate(SUMMARY_FIELDS):
                column = [v for row in rows if (v := row[i]) is not None]
                column.sort()
                columns[name] = column
                yield
            summary = _summarize_columns(len(rows), columns)
            summary["count"] = counts[kind]
            summary["window"] = len(rows)
            doc["kinds"][str(kind)] = summary
        doc["recent"] = [r.to_dict() for r in reversed(recent)]
        return doc
