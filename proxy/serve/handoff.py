"""The records of the relay's exchanges: built when an exchange ends, completed with the
accounting's look-ups and the board's telemetry, and handed to the sinks (``/stats``,
``/metrics``, the log line, the spans).

A record is built after the agent has its answer, when the relay is idle: the few hundred
microseconds of CPU that costs then land in a pause of the agent's instead of in front of
its next request. The times in the record are taken when the exchange ends, not then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from proxy.core.assemble import build_record
from proxy.core.partials import assemble
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.tracker import Observation
from proxy.serve.accounting import Accounting, Pending
from proxy.serve.diagnosed import Comparisons
from proxy.serve.flight import Flight
from proxy.serve.tasks import spawn
from proxy.serve.telemetry import Telemetry

__all__ = ["HANDOFF_DELAY_S", "HANDOFF_MAX_DELAY_S", "Handoff", "OnRecord"]

OnRecord = Callable[[Record, RequestFacts, Observation | None], None]

HANDOFF_DELAY_S = 0.002
"""How long the relay must have been idle (no exchange in flight) before the records of the
exchanges that ended are built and handed to the sinks; the exchanges ending within that
time go together."""

HANDOFF_MAX_DELAY_S = 0.010
"""The longest a record waits for its hand-off while exchanges keep the relay busy (the
hand-off then runs between their reads): under 200 concurrent streams, about ten records
at a time."""


class Handoff:
    """Builds, completes and hands off one record per exchange. ``busy`` says whether an
    exchange is in flight."""

    def __init__(
        self,
        on_record: OnRecord,
        clock: Callable[[], float],
        busy: Callable[[], bool],
        accounting: Accounting | None = None,
        telemetry: Telemetry | None = None,
        comparisons: Comparisons | None = None,
    ) -> None:
        """``comparisons`` keep each response's prompt by its id (prompt-cache diagnostics)."""
        self._on_record = on_record
        self._comparisons = comparisons
        self._clock = clock
        self._busy = busy
        self._accounting = accounting
        self._telemetry = telemetry
        self._waiting: list[tuple[Flight, float]] = []
        """Ended exchanges and their end times, in the order they ended."""
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_since: float | None = None
        """Loop time the oldest waiting exchange ended (``None``: none waits)."""
        self._last_end = 0.0
        self._completing: set[asyncio.Future[Any]] = set()

    def begin(self, flight: Flight) -> None:
        """The request is on its way: its body analysed, the accounting's look-ups begun."""
        facts = flight.analysed()
        if self._accounting is None:
            return
        try:
            flight.beside.pending = self._accounting.begin(facts, flight.request.headers, flight.t0)
        except Exception as exc:  # accounting must never stop a request
            flight.beside.accounting_error = f"begin: {type(exc).__name__}"

    def later(self, flight: Flight) -> None:
        """The agent has the response (or all it will get): its record is built once the
        relay has been idle for :data:`HANDOFF_DELAY_S`, with every other exchange ended
        meanwhile, or at the latest :data:`HANDOFF_MAX_DELAY_S` after the oldest ended. A
        completed exchange ends when its last body bytes went to the agent."""
        reply = flight.reply
        sent = reply.sent if reply is not None else None
        end = sent if flight.outcome is Outcome.COMPLETED and sent is not None else self._clock()
        self._waiting.append((flight, end))
        loop = asyncio.get_running_loop()
        self._last_end = now = loop.time()
        if self._waiting_since is None:
            self._waiting_since = now
        if self._timer is None:
            self._timer = loop.call_at(now + HANDOFF_DELAY_S, self._due)

    def now(self, flight: Flight) -> None:
        """A reply aiohttp sends after the handler (a refusal, an error): its record at once,
        after those waiting, since its client may look for it on arrival."""
        self.flush()
        self._finish(flight, self._clock())

    def _due(self) -> None:
        """Hand off when the relay has been idle long enough or the oldest record waited
        its limit; else look again when one of the two can be true."""
        assert self._waiting_since is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        latest = self._waiting_since + max(HANDOFF_MAX_DELAY_S, HANDOFF_DELAY_S)
        idle_at = self._last_end + HANDOFF_DELAY_S
        busy = self._busy()
        if now >= latest or (not busy and now >= idle_at):
            self._timer = None
            self.flush()
            return
        due = min(latest, now + HANDOFF_DELAY_S if busy else idle_at)
        self._timer = loop.call_at(due, self._due)

    def flush(self) -> None:
        """Build and hand off the record of every ended exchange waiting, oldest first."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting_since = None
        waiting, self._waiting = self._waiting, []
        for flight, end in waiting:
            try:
                self._finish(flight, end)
            except Exception as exc:  # a bug of ours: the others still get their records
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "timing-proxy: record hand-off failed", "exception": exc}
                )

    def _finish(self, flight: Flight, end: float) -> None:
        facts = flight.analysed()  # the exchange may have ended before the loop's next turn
        beside = flight.beside
        obs = beside.observation
        if obs is None and flight.reply is not None:
            obs = flight.reply.tracker.finish()
        if self._comparisons is not None and obs is not None:
            self._comparisons.keep(obs.response_id, beside.pending)
        exchange = flight.exchange(flight.outcome, end, flight.error)
        record = build_record(exchange, facts, obs)
        if beside.annotate_error is not None and record.analysis_error is None:
            record = record.replace(analysis_error=beside.annotate_error)
        if beside.accounting_error is not None:
            record = record.replace(accounting_error=beside.accounting_error)
        pending = beside.pending if self._accounting is not None else None
        # the board's samples for the request's wall interval: chat and tool turns only
        board = self._telemetry if record.kind is not Kind.OTHER else None
        if pending is None and board is None:
            self._on_record(record, facts, obs)
            return
        window = (flight.t0, flight.t0 + exchange.end_s)
        _ = spawn(self._complete(record, facts, pending, obs, board, window), self._completing)

    async def _complete(
        self,
        record: Record,
        facts: RequestFacts,
        pending: Pending | None,
        obs: Observation | None,
        board: Telemetry | None,
        window: tuple[float, float],
    ) -> None:
        """Join the accounting and the board's telemetry to the record, after the agent's
        response has ended (the two wait side by side)."""
        sampled = (
            spawn(board.sample(*window, record.predicted_n), self._completing)
            if board is not None
            else None
        )
        if pending is not None and self._accounting is not None:
            try:
                record = await self._accounting.complete(record, pending, obs, window[1])
            except Exception as exc:  # the record is still written, with the reason
                record = record.replace(accounting_error=type(exc).__name__)
        if sampled is not None:
            try:
                record = assemble(record, await sampled)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                record = record.replace(telemetry_error="cancelled")
            except Exception as exc:  # the record is still written, with the reason
                record = record.replace(telemetry_error=type(exc).__name__)
        self._on_record(record, facts, obs)

    async def drain(self, within_s: float | None = None) -> None:
        """Wait for records still being completed (at shutdown), at most ``within_s``; the
        exchanges waiting for their hand-off get their records at once."""
        self.flush()
        if self._completing:
            await asyncio.wait(set(self._completing), timeout=within_s)
