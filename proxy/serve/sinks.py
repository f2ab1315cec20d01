"""Where each finished record goes: given its roofline fields, then to every sink in turn
(``/stats``, ``/metrics``, the JSON log line, and whatever else is appended, such as the
accounting's rate learning or a test's capture)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from proxy.core.record import Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.stats import Stats
from proxy.core.tracker import Observation
from proxy.serve.keys import RecordSink
from proxy.serve.logs import write_record_line
from proxy.serve.metrics import Metrics
from proxy.serve.model_info import ModelInfo

__all__ = ["RecordSinks"]

_WARN = frozenset({Outcome.UPSTREAM_UNREACHABLE})
"""Outcomes whose log line is a warning: the operator has something to fix."""


class RecordSinks:
    """The relay's ``on_record``: calls each of :attr:`sinks` with the enriched record,
    holding ``lock`` (the application's state lock) for all of them."""

    def __init__(
        self,
        stats: Stats,
        metrics: Metrics,
        model_info: ModelInfo,
        log: Any,
        lock: AbstractContextManager[Any],
    ) -> None:
        self._stats = stats
        self._lock = lock
        self._model_info = model_info
        self._log = log
        self.sinks: list[RecordSink] = [self.count_record, metrics.observe, self.log_record]
        """In call order; the list itself is shared (``app[SINKS]``), so appending works."""

    def count_record(self, record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        """Add the record to ``/stats``."""
        self._stats.add(record)

    def log_record(self, record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        """Write the record as one ``request_completed`` line (a warning when the upstream
        could not be reached)."""
        warning = record.outcome in _WARN
        if not write_record_line(record, warning=warning):  # structlog's set-up replaced
            write = self._log.warning if warning else self._log.info
            write("request_completed", **record.to_dict())

    def __call__(self, record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        record = self._model_info.enrich(record)
        with self._lock:  # the admin pages read what the sinks change from their own thread
            self._dispatch(record, facts, obs)

    def _dispatch(self, record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        for sink in self.sinks:
            try:
                sink(record, facts, obs)
            except Exception:  # a sink must never break the relay
                self._log.exception("record_sink_failed", sink=getattr(sink, "__name__", "?"))
