"""Aggregation of records: percentiles per kind and per API, cache sums, upstream errors
by status, and the ``/stats`` document.

Pure. Memory is bounded: percentiles are computed over a sliding window of the last
``window`` completed records of each kind (a ``deque`` with ``maxlen``), and of each kind
of each API (:data:`APIS`, a closed set: any other name counts as ``other``), while counts
and cache sums are running totals since start. ``recent`` keeps the last N records whole.
The same :func:`summarize` serves ``/stats`` and ``timing-proxy report``.
"""

from __future__ import annotations

import math
import operator
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from proxy.core.dialects import DIALECTS
from proxy.core.record import Kind, Outcome, Record

__all__ = [
    "APIS",
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

_DRAFT = SUMMARY_FIELDS.index("draft_acceptance")
_DECODE = SUMMARY_FIELDS.index("decode_tok_s")

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

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


def _summarize_columns(
    count: int, columns: dict[str, list[float]], spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """:func:`summarize_kind` of ``count`` records given their known values per field,
    each column sorted, and their :func:`speculation`."""
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
    if spec is not None:
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
"""A record's :data:`SUMMARY_FIELDS`, in that order: what a window keeps of it."""
_summary_row: Callable[[Record], _Row] = operator.attrgetter(*SUMMARY_FIELDS)

_ApiKind = tuple[str, Kind]
"""An API's name (one of :data:`APIS`) and a summarised kind."""


def _summary_steps(rows: Sequence[_Row]) -> Generator[None, None, dict[str, Any]]:
    """:func:`summarize_kind` of a window's ``rows``, yielding after each sorted column."""
    columns: dict[str, list[float]] = {}
    for i, name in enumerate(SUMMARY_FIELDS):
        column = [v for row in rows if (v := row[i]) is not None]
        column.sort()
        columns[name] = column
        yield
    return _summarize_columns(
        len(rows), columns, speculation((row[_DRAFT], row[_DECODE]) for row in rows)
    )


def _copy_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary that shares no mutable part with ``summary``."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in summary.items()}


def _sorted_counts(counts: Counter[str]) -> dict[str, int]:
    """``counts`` as a plain dict, keys in order (``"400"`` before ``"500"``)."""
    return dict(sorted(counts.items()))


_ApiPlan = tuple[int, dict[str, int], dict[Kind, tuple[int, list[_Row] | None]]]
"""What ``by_api`` shows of one API, copied when a snapshot starts: its requests, its
upstream errors by status, and per kind the requests and the window's rows (``None``: the
kind's own window)."""


def _by_api_steps(
    plan: dict[str, _ApiPlan], kinds: dict[str, dict[str, Any]]
) -> Generator[None, None, dict[str, Any]]:
    """The ``by_api`` object of ``/stats`` from :meth:`Stats._api_plan` and the kinds'
    summaries; yields after each sorted column (none for a window that is the kind's own,
    whose summary is copied, or for an empty one)."""
    by_api: dict[str, Any] = {}
    for api, (requests, errors, windows) in plan.items():
        summaries: dict[str, Any] = {}
        for kind, (count, rows) in windows.items():
            if rows is None:
                summary = _copy_summary(kinds[str(kind)])
            else:
                summary = (yield from _summary_steps(rows)) if rows else summarize_kind(())
                summary["window"] = len(rows)
            summary["count"] = count
            summaries[str(kind)] = summary
        by_api[api] = {"requests": requests, "upstream_errors": errors, "kinds": summaries}
    return by_api


class Stats:
    """Running totals and bounded windows of records, rendered as the ``/stats`` document.

    A window keeps only each record's :data:`SUMMARY_FIELDS` as a tuple of floats (and
    ``None``). Such tuples hold no references, so CPython's garbage collector stops tracking
    them: full windows (20,000 records) cost a full collection nothing, where whole records
    made each one a pause of about 10 ms. Whole records stay only in ``recent``.

    The windows per API hold the same tuple objects as the kind windows, so while one API
    serves every request they cost a pointer per record and, in :meth:`snapshot_steps`, no
    sort at all (their summary is the kind's).
    """

    def __init__(self, *, since: str, recent: int = 100, window: int = 10_000) -> None:
        self.since = since
        self.requests = 0
        self._window = window
        self._outcomes: Counter[str] = Counter()
        self._kinds: Counter[str] = Counter()
        self._apis: Counter[str] = Counter()
        self._upstream_errors: dict[str, Counter[str]] = {}
        self._windows: dict[Kind, deque[_Row]] = {
            Kind.CHAT: deque(maxlen=window),
            Kind.TOOL: deque(maxlen=window),
        }
        self._completed: Counter[Kind] = Counter()
        self._api_kinds: Counter[_ApiKind] = Counter()
        self._api_completed: Counter[_ApiKind] = Counter()
        self._api_windows: dict[_ApiKind, deque[_Row]] = {}
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
        row = _summary_row(record)
        self._windows[record.kind].append(row)
        self._completed[record.kind] += 1
        self._api_completed[key] += 1
        window = self._api_windows.get(key)
        if window is None:
            window = self._api_windows[key] = deque(maxlen=self._window)
        window.append(row)

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

    def _all_upstream_errors(self) -> Counter[str]:
        """Upstream errors by status, across APIs."""
        total: Counter[str] = Counter()
        for counts in self._upstream_errors.values():
            total.update(counts)
        return total

    def _api_plan(self) -> dict[str, _ApiPlan]:
        """What ``by_api`` is made of, copied now: for each API that has had requests, its
        request count, its upstream errors by status and, per kind, the requests and a copy
        of the window (``None`` where it holds exactly the kind's window: every completed
        record of the kind came from that API, the same appends to a deque of the same
        length)."""
        plan: dict[str, _ApiPlan] = {}
        for api in APIS:
            if not self._apis[api]:
                continue
            kinds: dict[Kind, tuple[int, list[_Row] | None]] = {}
            for kind in self._windows:
                key = (api, kind)
                same = self._api_completed[key] == self._completed[kind]
                rows = None if same else list(self._api_windows.get(key, ()))
                kinds[kind] = (self._api_kinds[key], rows)
            errors = _sorted_counts(self._upstream_errors.get(api, Counter()))
            plan[api] = (self._apis[api], errors, kinds)
        return plan

    def snapshot_steps(self) -> Generator[None, None, dict[str, Any]]:
        """The ``/stats`` document, built in steps; the generator's return value.

        It yields after each field of each window: one step sorts at most one window's
        values of one field (about 1 ms for 10,000 on a small board), so a caller on the
        relay's event loop can let streams run between steps instead of stalling them for
        the whole document (17 ms with full windows). An API's window that is its kind's
        own, or empty, is not sorted (no step). The document is the state when the
        generator started: records added meanwhile are left out.
        """
        windows = {kind: list(window) for kind, window in self._windows.items()}
        counts = {kind: self._kinds[str(kind)] for kind in windows}
        api_plan = self._api_plan()
        recent = list(self._recent)
        doc: dict[str, Any] = {
            "requests": self.requests,
            "since": self.since,
            "outcomes": dict(self._outcomes),
            "upstream_errors": _sorted_counts(self._all_upstream_errors()),
            "apis": dict(self._apis),
            "kinds": {},
            "by_api": {},
            "cache": cache_ratio(self._cache_n, self._prompt_tokens),
        }
        for kind, rows in windows.items():
            summary = yield from _summary_steps(rows)
            summary["count"] = counts[kind]
            summary["window"] = len(rows)
            doc["kinds"][str(kind)] = summary
        doc["by_api"] = yield from _by_api_steps(api_plan, doc["kinds"])
        doc["recent"] = [r.to_dict() for r in reversed(recent)]
        return doc
