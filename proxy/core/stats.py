"""The ``/stats`` document: running counts per outcome, kind and API, upstream errors by
status, cache sums, the windows' percentiles per kind and per API, and the recent records.

Pure. Memory is bounded: percentiles are over a sliding window of the last ``window``
completed records of each kind, and of each kind of each API (:data:`APIS`, a closed set:
any other name counts as ``other``), kept as histograms (:mod:`proxy.core.windows`); counts
and cache sums are running totals since start. ``recent`` keeps the last N records whole.
The summary layout is :mod:`proxy.core.summaries`', shared with ``timing-proxy report``.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from proxy.core.dialects import DIALECTS
from proxy.core.record import Kind, Outcome, Record
from proxy.core.summaries import (
    QUANTILES,
    SUMMARY_FIELDS,
    cache_ratio,
    percentile,
    quantiles,
    speculation,
    summarize,
    summarize_cache,
    summarize_kind,
)
from proxy.core.windows import ALPHA, GAMMA, Window, slots, summary_row

__all__ = [
    "ALPHA",
    "APIS",
    "GAMMA",
    "QUANTILES",
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


_ApiKind = tuple[str, Kind]
"""An API's name (one of :data:`APIS`) and a summarised kind."""


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

    A window is a :class:`~proxy.core.windows.Window`, read without sorting. Whole records
    stay only in ``recent``.

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
        self._windows: dict[Kind, Window] = {
            Kind.CHAT: Window(window),
            Kind.TOOL: Window(window),
        }
        self._sole: dict[Kind, str | None] = {Kind.CHAT: None, Kind.TOOL: None}
        self._api_kinds: Counter[_ApiKind] = Counter()
        self._api_windows: dict[_ApiKind, Window] = {}
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
        values, keys = slots(summary_row(record))
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
                window = self._api_windows[key] = Window(self._window)
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
