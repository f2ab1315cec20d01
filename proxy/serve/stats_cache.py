"""The ``/stats`` document, serialised once per change and shared by its readers.

``/stats`` reads each window's histograms (:mod:`proxy.core.windows`): no sort, about a
millisecond with full windows, so the document is built in one go, in the state of one
instant, without giving the event loop back: readers arriving after it share its bytes. It
is built again only when something new has come in (a record, or a tool schema the
accounting learnt; the dashboard polls every second, most often with nothing new).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.stats import Stats
from proxy.serve.accounting import Accounting
from proxy.serve.setup_watch import SetupWatch
from proxy.serve.telemetry import Telemetry

__all__ = ["StatsDocument"]


class StatsDocument:
    """The JSON bytes of ``/stats`` for one :class:`Stats` (and the accounting, if on)."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._built_for: tuple[Any, ...] | None = None
        self._body = b""

    def _version(
        self,
        accounting: Accounting | None,
        board: dict[str, Any] | None,
        setup: SetupWatch | None,
    ) -> tuple[Any, ...]:
        """Changes whenever the document would: records counted, tool schemas known, the
        board sampler's snapshot (its state, restarts, samples kept…: a few keys), the
        served template's capabilities."""
        return (
            self._stats.requests,
            len(accounting.per_tool) if accounting is not None else 0,
            board,
            setup.caps if setup is not None else None,
        )

    def build(
        self,
        accounting: Accounting | None,
        telemetry: Telemetry | None = None,
        setup: SetupWatch | None = None,
    ) -> bytes:
        """The document, built again only if something came in since the last build.
        ``board`` is the telemetry sampler's snapshot (``null`` without one); ``findings``
        the setup findings then the cache findings, each with its ``category``. The admin
        handler calls it under the application's state lock (:mod:`proxy.serve.admin`)."""
        board = telemetry.snapshot() if telemetry is not None else None
        built_for = self._version(accounting, board, setup)
        if self._built_for != built_for:
            doc = self._stats.snapshot()
            doc["board"] = board
            doc["schemas"] = accounting.snapshot() if accounting is not None else None
            findings = setup.findings.findings() if setup is not None else []
            doc["template"] = setup.snapshot() if setup is not None else None
            attributor = accounting.attributor if accounting is not None else None
            if attributor is not None:
                found = attributor.snapshot()
                doc["cache"]["findings"] = found["findings"]
                doc["conversations"] = found["conversations"]
                findings += [{"category": "cache", **f} for f in found["findings"]]
            doc["findings"] = findings
            self._built_for, self._body = built_for, orjson.dumps(doc)
        return self._body
