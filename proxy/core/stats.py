"""Aggregation of records: percentiles per kind and per API, cache sums, upstream errors
by status, and the ``/stats`` document.

Pure. Memory is bounded: percentiles are over a sliding window of the last ``window``
completed records of each kind, and of each kind of each API (:data:`APIS`, a closed set:
any other name counts as ``other``), while counts and cache sums are running totals since
start. ``recent`` keeps the last N records whole. The same :func:`summarize_kind` layout
serves ``/stats`` and ``timing-proxy report``.

``timing-proxy report`` sorts whole records (:func:`summarize_kind`: exact). ``/stats`` keeps,
per window, a log-bucket histogram of each field (:class:`_Window`), updated as a record
enters the window and as the oldest one leaves it, so a read walks the occupied buckets and
sorts nothing. Each bucket holds the values within a factor :data:`GAMMA` of each other and
answers with their mean, so each percentile is within :data:`ALPHA` (1 %) of the exact one
of the same records (see :func:`_column_quantiles` for the statement).
"""

from __future__ import annotations

import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from math import ceil, log
from typing import Any

from proxy.core.dialects import DIALECTS
from proxy.core.record import Kind, Outcome, Record

__all__ = [
    "ALPHA",
    "APIS",
    "GAMMA",
    "SUMMARY_FIELDS",
    "Stats",
    "api_name",
    "cache_ratio",
    "percentile",
    "quantiles",
    "speculation",
    "status_name",
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

_FIELDS = len(SUMMARY_FIELDS)
_DRAFT = SUMMARY_FIELDS.index("draft_acceptance")
_DECODE = SUMMARY_FIELDS.index("decode_tok_s")
_WITH = _FIELDS
"""The histogram column of ``decode_tok_s`` over the records that drafted."""
_WITHOUT = _FIELDS + 1
"""The histogram column of ``decode_tok_s`` over the records that did not."""
_COLUMNS = _FIELDS + 2

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

ALPHA = 0.01
"""The relative error of a ``/stats`` percentile against the exact one of the same records
(:func:`percentile` over the window's values), for values of one sign; see
:func:`_column_quantiles`."""
GAMMA = 1.0 + ALPHA
"""The ratio between a histogram bucket's upper and lower bound."""
_INV_LN_GAMMA = 1.0 / math.log(GAMMA)
_TINY = 1e-9
"""Values within this of 0 share the zero bucket."""
_HUGE = 1e300
"""Values beyond this (and NaN) are left out, as unknown: no bucket holds infinity."""
_OFFSET = 1 - math.ceil(math.log(_TINY) * _INV_LN_GAMMA)
"""Makes a positive value's key at least 1 (a negative one's at most -1; 0 is the zero
bucket), so keys sort as their values."""
_NAN = math.nan

APIS: tuple[str, ...] = (*(dialect.name for dialect in DIALECTS), "other")
"""The names a record's ``api`` can take in ``/stats``: one per dialect (``chat_completions``,
``responses``, ``messages``, ``completions``), and ``other``."""


def api_name(api: str | None) -> str:
    """The ``/stats`` name of a record's ``api``: itself when it is one of :data:`APIS`,
    else ``other`` (no ``api``, or a name no dialect has), so the set stays bounded."""
    return api if api is not None and api in APIS else "other"


def status_name(status: int | None) -> str:
    """The key an HTTP status is counted under (``"500"``; ``"unknown"`` for none): JSON
    object keys are strings."""
    return "unknown" if status is None else str(status)


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
    """``count``, ``{p50, p90, p99}`` of each field over the known values, and the split:
    exact, by sorting (``timing-proxy report``).

    The split is taken between the median prefill and the median decode, as the Jetson
    measurement's "796 ms of prefill and 1,265 ms of decode, 39 and 61 percent".
    """
    return _assemble(
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


def _assemble(
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


_Row = tuple[float | None, ...]
"""A record's :data:`SUMMARY_FIELDS`, in that order."""
_summary_row: Callable[[Record], _Row] = operator.attrgetter(*SUMMARY_FIELDS)

_ApiKind = tuple[str, Kind]
"""An API's name (one of :data:`APIS`) and a summarised kind."""


def _slots(row: _Row) -> tuple[array[float], array[int]]:
    """A record as a window stores it: one value per column (:data:`SUMMARY_FIELDS`, then
    ``decode_tok_s`` again in the with- or the without-draft column), NaN where unknown
    (``None``, not finite, or the other draft column), and each value's bucket key.

    The key of ``v`` is ``k`` for ``GAMMA**(k-1) < v <= GAMMA**k``, shifted by
    :data:`_OFFSET` to be at least 1, its mirror image for a negative value, and 0 within
    :data:`_TINY` of 0 (and for NaN, which no histogram counts): keys sort as the values.
    """
    values = [v if v is not None and -_HUGE < v < _HUGE else _NAN for v in row]
    rate = values[_DECODE]
    values += (rate, _NAN) if values[_DRAFT] == values[_DRAFT] else (_NAN, rate)
    keys = [
        _OFFSET + ceil(log(v) * _INV_LN_GAMMA)
        if v > _TINY
        else (-_OFFSET - ceil(log(-v) * _INV_LN_GAMMA) if v < -_TINY else 0)
        for v in values
    ]
    return array("d", values), array("i", keys)


class _Window:
    """The last ``size`` completed records of a kind (or of an API's kind) as histograms.

    ``values`` and ``keys`` keep each record's :func:`_slots` (a ring of ``size`` records
    once full) only so that the oldest can be taken out of the histograms when a new one
    pushes it out. Per column, three parallel arrays: ``order``, the occupied buckets' keys
    ascending, and each one's ``counts`` and ``sums``. Contiguous arrays make a read a walk
    through a few kilobytes per column, and they hold no object the garbage collector walks.
    """

    __slots__ = ("counts", "keys", "n", "order", "size", "slot", "sums", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.values = array("d")
        self.keys = array("i")
        self.slot = 0
        self.n = 0
        self.order: tuple[array[int], ...] = tuple(array("i") for _ in range(_COLUMNS))
        self.counts: tuple[array[int], ...] = tuple(array("q") for _ in range(_COLUMNS))
        self.sums: tuple[array[float], ...] = tuple(array("d") for _ in range(_COLUMNS))

    def copy(self) -> _Window:
        """A window holding the same records, sharing nothing with this one."""
        new = _Window(self.size)
        new.values, new.keys = array("d", self.values), array("i", self.keys)
        new.slot, new.n = self.slot, self.n
        new.order = tuple(array("i", a) for a in self.order)
        new.counts = tuple(array("q", a) for a in self.counts)
        new.sums = tuple(array("d", a) for a in self.sums)
        return new

    def push(self, values: array[float], keys: array[int]) -> None:
        """Add a record (its :func:`_slots`), taking the oldest out once the window is
        full."""
        if self.n < self.size:
            self.values.extend(values)
            self.keys.extend(keys)
            self.n += 1
        elif self.size:
            start = self.slot * _COLUMNS
            end = start + _COLUMNS
            self._remove(self.values[start:end], self.keys[start:end])
            self.values[start:end] = values
            self.keys[start:end] = keys
            self.slot = (self.slot + 1) % self.size
        else:
            return
        orders, counts, sums = self.order, self.counts, self.sums
        for column, value in enumerate(values):
            if value == value:
                key = keys[column]
                order = orders[column]
                i = bisect_left(order, key)
                if i < len(order) and order[i] == key:
                    counts[column][i] += 1
                    sums[column][i] += value
                else:
                    order.insert(i, key)
                    counts[column].insert(i, 1)
                    sums[column].insert(i, value)

    def _remove(self, values: array[float], keys: array[int]) -> None:
        """Take a record out of the histograms (an emptied bucket goes)."""
        orders, counts, sums = self.order, self.counts, self.sums
        for column, value in enumerate(values):
            if value == value:
                order = orders[column]
                i = bisect_left(order, keys[column])
                if counts[column][i] == 1:
                    del order[i], counts[column][i], sums[column][i]
                else:
                    counts[column][i] -= 1
                    sums[column][i] -= value

    def column(self, column: int) -> dict[str, float | None]:
        """``{p50, p90, p99}`` of one column (:func:`_column_quantiles`)."""
        return _column_quantiles(self.counts[column], self.sums[column])

    def summary(self) -> dict[str, Any]:
        """The kind's summary of the window's records (``count`` is the window's; the
        caller sets the kind's), with ``window``."""
        fields = {name: self.column(c) for c, name in enumerate(SUMMARY_FIELDS)}
        spec = {
            "drafted": sum(self.counts[_DRAFT]),
            "decode_tok_s_p50_with": self.column(_WITH)["p50"],
            "decode_tok_s_p50_without": self.column(_WITHOUT)["p50"],
        }
        out = _assemble(self.n, fields, spec)
        out["window"] = self.n
        return out


_NONE: dict[str, float | None] = {name: None for name, _ in QUANTILES}


def _column_quantiles(counts: Sequence[int], sums: Sequence[float]) -> dict[str, float | None]:
    """``{p50, p90, p99}`` of a column from its occupied buckets' counts and sums (in key
    order), in one pass (cumulative counts, then a binary search per rank).

    Each rank's order statistic is read as the mean of the values in its bucket, then
    interpolated as :func:`percentile` does. The bucket's values lie within a factor
    :data:`GAMMA` of each other, so that mean is within ``ALPHA`` of each of them: for a
    column whose values have one sign each percentile is within ``ALPHA`` of the exact one
    (``|got - exact| < ALPHA * |exact|``, plus the rounding to 0.001 of both), and it is
    exact where the order statistics' buckets hold one distinct value (a single record,
    repeated values). Where the two order statistics have opposite signs, the error is
    below ``ALPHA`` times the interpolation of their magnitudes.
    """
    if not counts:
        return dict(_NONE)
    cum = list(accumulate(counts))
    n = cum[-1]

    def at(rank: int) -> float:
        i = bisect_right(cum, rank)
        return sums[i] / counts[i]

    out: dict[str, float | None] = {}
    for name, q in QUANTILES:
        pos = (n - 1) * q
        lo = math.floor(pos)
        hi = math.ceil(pos)
        low = at(lo)
        out[name] = round(low if lo == hi else low + (at(hi) - low) * (pos - lo), 3)
    return out


def _sorted_counts(counts: Counter[str]) -> dict[str, int]:
    """``counts`` as a plain dict, keys in order (``"400"`` before ``"500"``)."""
    return dict(sorted(counts.items()))


def _copy_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary that shares no mutable part with ``summary``."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in summary.items()}


_SPLIT = ""
"""The sole API of a kind once two APIs have served it (each then has its own window)."""


class Stats:
    """Running totals and bounded windows of records, rendered as the ``/stats`` document.

    A window is a :class:`_Window`: a ring of the last ``window`` completed records' summary
    values and a histogram per field kept up to date as records enter and leave it, so
    ``/stats`` reads buckets instead of sorting records. Its storage is a fixed number of
    arrays of numbers, whatever the records: full windows add nothing to a full
    collection's pause. Whole records stay only in ``recent``.

    While one API serves every completed record of a kind, that API's window is the kind's
    own (not kept twice, its summary copied); the first record of another API gives the
    first one a copy of the kind's window, and from then on each API keeps its own.
    """

    def __init__(self, *, since: str, recent: int = 100, window: int = 10_000) -> None:
        self.since = since
        self.requests = 0
        self._window = window
        self._outcomes: Counter[str] = Counter()
        self._kinds: Counter[str] = Counter()
        self._apis: Counter[str] = Counter()
        self._upstream_errors: dict[str, Counter[str]] = {}
        self._windows: dict[Kind, _Window] = {
            Kind.CHAT: _Window(window),
            Kind.TOOL: _Window(window),
        }
        self._sole: dict[Kind, str | None] = {Kind.CHAT: None, Kind.TOOL: None}
        self._api_kinds: Counter[_ApiKind] = Counter()
        self._api_windows: dict[_ApiKind, _Window] = {}
        self._recent: deque[Record] = deque(maxlen=recent)
        self._cache_n = 0
        self._prompt_tokens = 0

    def add(self, record: Record) -> None:
        """Count one finished request."""
        self.requests += 1
        api = api_name(record.api)
        self._outcomes[str(record.outcome)] += 1
        self._kinds[str(record.kind)] += 1
        self._apis[api] += 1
        if record.outcome is Outcome.UPSTREAM_ERROR:
            self._upstream_errors.setdefault(api, Counter())[status_name(record.status)] += 1
        if record.kind in self._windows:
            self._add_to_windows(record, (api, record.kind))
        self._recent.append(record)
        if record.cache_n is not None and record.prompt_tokens is not None:
            self._cache_n += record.cache_n
            self._prompt_tokens += record.prompt_tokens

    def _add_to_windows(self, record: Record, key: _ApiKind) -> None:
        """Count a chat or tool record for its API; a completed one enters the windows of
        its kind and of its API's kind (latency percentiles: completed only)."""
        self._api_kinds[key] += 1
        if record.outcome is not Outcome.COMPLETED:
            return
        api, kind = key
        values, keys = _slots(_summary_row(record))
        kind_window = self._windows[kind]
        sole = self._sole[kind]
        if sole is None:
            self._sole[kind] = api
        elif sole != api:
            if sole != _SPLIT:
                self._api_windows[sole, kind] = kind_window.copy()
                self._sole[kind] = _SPLIT
            window = self._api_windows.get(key)
            if window is None:
                window = self._api_windows[key] = _Window(self._window)
            window.push(values, keys)
        kind_window.push(values, keys)

    def find(self, record_id: str) -> Record | None:
        """A recent record by id (``None`` once it has left the ``recent`` window)."""
        for record in reversed(self._recent):
            if record.id == record_id:
                return record
        return None

    def _all_upstream_errors(self) -> Counter[str]:
        """Upstream errors by status, across APIs."""
        total: Counter[str] = Counter()
        for counts in self._upstream_errors.values():
            total.update(counts)
        return total

    def _api_summary(self, api: str, kinds: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """One API's ``by_api`` entry, given the kinds' summaries."""
        summaries: dict[str, Any] = {}
        for kind in self._windows:
            if self._sole[kind] == api:
                summary = _copy_summary(kinds[str(kind)])
            elif (window := self._api_windows.get((api, kind))) is not None:
                summary = window.summary()
            else:
                summary = {**summarize_kind(()), "window": 0}
            summary["count"] = self._api_kinds[api, kind]
            summaries[str(kind)] = summary
        errors = _sorted_counts(self._upstream_errors.get(api, Counter()))
        return {"requests": self._apis[api], "upstream_errors": errors, "kinds": summaries}

    def snapshot(self) -> dict[str, Any]:
        """The ``/stats`` document.

        A read walks each window's occupied buckets and sorts nothing, so it is built in one
        go, the state at one instant.
        """
        kinds: dict[str, Any] = {}
        for kind, window in self._windows.items():
            summary = window.summary()
            summary["count"] = self._kinds[str(kind)]
            kinds[str(kind)] = summary
        return {
            "requests": self.requests,
            "since": self.since,
            "outcomes": dict(self._outcomes),
            "upstream_errors": _sorted_counts(self._all_upstream_errors()),
            "apis": dict(self._apis),
            "kinds": kinds,
            "by_api": {api: self._api_summary(api, kinds) for api in APIS if self._apis[api]},
            "cache": cache_ratio(self._cache_n, self._prompt_tokens),
            "recent": [r.to_dict() for r in reversed(self._recent)],
        }
