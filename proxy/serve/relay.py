"""The relay: the only module that holds both sockets.

For each request it forwards the body bytes unchanged, copies the upstream's status, end-to-end
headers and body to the agent as they are read (one ``write`` per upstream read, no buffering), and
hands the same ``bytes`` to a :class:`~proxy.core.tracker.StreamTracker` *after* they were written;
only what an agent opts in to changes them (:mod:`.annotated`, :mod:`.diagnosed`). Disconnects,
timeouts and aborts are decided here and become the record's ``outcome``. The proxy answers by
itself only with OpenAI-shaped errors, and only before any upstream byte reached the agent; after
that a failure aborts the agent's connection instead of ending the body cleanly.

One request: :meth:`Relay.handle` → ``_exchange`` (the body taken in, the upstream asked)
→ ``_reply`` (the response set up) → ``_pump`` (the relay loop) → :mod:`~proxy.serve.handoff`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config import AnnotateConfig
from proxy.core.headers import request_drop
from proxy.core.record import Outcome
from proxy.core.tracker import StreamTracker
from proxy.serve.accounting import Accounting
from proxy.serve.annotated import Note, annotates
from proxy.serve.deadline import Deadlines
from proxy.serve.diagnosed import Diagnosing, comparisons_for
from proxy.serve.flight import Flight, open_reply
from proxy.serve.handoff import Handoff, OnRecord
from proxy.serve.intake import Intake, Refusal, analysis_of, answer_and_close, error_response
from proxy.serve.telemetry import Telemetry
from proxy.serve.upstream import ask
from proxy.serve.whole import ReadWhole, one_write, whole_reader

__all__ = ["DEFER_BYTES", "Relay", "RelaySettings", "error_response"]

DEFER_BYTES = 64 * 1024
"""The response bytes the tracker may keep unread while the relay forwards them
(:class:`~proxy.core.tracker.StreamTracker`'s ``defer_bytes``): a response up to this size is
analysed in the record's hand-off, after its last byte has gone to the agent."""


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """What the relay needs of the configuration (seconds; 0 means off)."""

    upstream: str
    max_body_bytes: int = 32 * 1024 * 1024
    max_event_bytes: int = 8 * 1024 * 1024
    header_timeout_s: float = 0.0
    idle_timeout_s: float = 300.0
    write_timeout_s: float = 60.0
    annotate: AnnotateConfig = field(default_factory=AnnotateConfig)
    read_timeout_s: float = 30.0
    max_header_bytes: int = 64 * 1024


class Relay:
    """Forwards requests to one upstream and reports one record per request."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: RelaySettings,
        on_record: OnRecord,
        clock: Callable[[], float] = time.perf_counter,
        accounting: Accounting | None = None,
        stream_session: aiohttp.ClientSession | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._session = session
        self._stream_session = stream_session or session
        self._settings = settings
        self._clock = clock
        self._accounting = accounting
        self._intake = Intake(
            settings.max_body_bytes, settings.max_header_bytes, settings.read_timeout_s
        )
        self._base = settings.upstream.rstrip("/")
        self._request_drop = request_drop(settings.annotate.header)
        self._tracker = partial(
            StreamTracker,
            clock=clock,
            max_event_bytes=settings.max_event_bytes,
            max_body_bytes=settings.max_body_bytes,
        )
        self._handlers: set[asyncio.Task[Any]] = set()
        """The handler tasks of the requests in flight (cancelled at the end of the drain)."""
        self._comparisons = comparisons_for(accounting, clock)
        busy = lambda: bool(self._handlers)  # noqa: E731 - a name keeps the call on one line
        self._handoff = Handoff(on_record, clock, busy, accounting, telemetry, self._comparisons)
        self._drain_ends: float | None = None
        self.shutting_down = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """aiohttp handler for every path the proxy does not reserve for itself."""
        task = asyncio.current_task()
        assert task is not None  # aiohttp runs each request's handler in a task of its own
        self._handlers.add(task)
        flight = Flight.begin(request, self._clock)
        try:
            return await self._exchange(flight)
        except asyncio.CancelledError:
            # during the drain an agent hanging up looks the same: counted as aborted
            flight.outcome = flight.gone()
            if self.shutting_down and flight.outcome is not Outcome.COMPLETED:
                flight.outcome = Outcome.SHUTDOWN_ABORTED
            raise
        except Exception as exc:  # a bug of ours: answer if we still can, else abort
            flight.end(Outcome.PROXY_ERROR, type(exc).__name__)
            if flight.headers_sent:
                flight.abort_agent()
                raise
            flight.status = 500
            return error_response(
                500, "timing-proxy failed to relay the request", Outcome.PROXY_ERROR, flight.id
            )
        finally:
            self._handlers.discard(task)
            if flight.headers_sent:  # the agent has the response, or all it will get
                self._handoff.later(flight)
            else:  # a reply aiohttp sends after this (a refusal): its record first, as ever
                self._handoff.now(flight)

    async def _exchange(self, flight: Flight) -> web.StreamResponse:
        """Take the request in, ask the upstream, relay its answer; the proxy's own answer
        when the request is refused or the upstream cannot answer."""
        request = flight.request
        try:
            body = await self._intake.read_body(request)  # the bytes that arrived
            flight.request_bytes = len(body)
            # all the relay needs to know before sending it: whether it may ask for a stream
            facts, flight.unread = analysis_of(request, body, self._settings.max_body_bytes)
            if facts is not None:
                flight.facts = facts
            annotate = annotates(request, flight.facts, self._settings.annotate)
            if flight.unread is not None or self._accounting is not None:
                # on the loop's next turn, once the request below is on its way: parsing the
                # body and hashing a long conversation for the look-ups never delay it
                asyncio.get_running_loop().call_soon(self._handoff.begin, flight)
            # llama-server closes the connection after every event stream without saying so
            # (no "Connection: close"); pooled, such a socket is reused while its FIN is on
            # the way and the next request fails before any byte. Streams get a connection of
            # their own (the stream session does not pool); everything else is pooled.
            session = self._stream_session if flight.facts.stream else self._session
            header_s = self._settings.header_timeout_s
            upstream = await ask(session, self._base, request, self._request_drop, body, header_s)
        except Refusal as refusal:
            answer = self._refuse(flight, refusal)
            if refusal.outcome is Outcome.CLIENT_TIMEOUT:
                await answer_and_close(request, answer)
            return answer
        try:
            resp = await self._reply(flight, upstream, annotate)
        except BaseException:
            upstream.close()  # closing the socket is llama-server's only cancel signal
            raise
        if flight.outcome is Outcome.COMPLETED:
            upstream.release()
        else:
            upstream.close()
        return resp

    async def _reply(
        self, flight: Flight, upstream: aiohttp.ClientResponse, annotate: bool
    ) -> web.StreamResponse:
        """The agent's response to ``upstream``'s, relayed within the read and write
        deadlines; annotation is decided once per request, and the loop chosen once."""
        settings = self._settings
        flight.status = upstream.status
        sse = upstream.content_type == "text/event-stream"
        # the annotation reads the record so far mid-stream: nothing kept unread then
        defer = 0 if annotate else DEFER_BYTES
        tracker = partial(self._tracker, sse=sse, defer_bytes=defer)
        reply = flight.reply = open_reply(flight, upstream, tracker)
        hold_max = settings.annotate.server_timing_max_bytes
        note = Note(flight, self._clock, self._accounting, hold_max) if annotate else None
        diag = Diagnosing.of(flight, upstream, self._comparisons, note, self._handoff.flush)
        idle, write_s = settings.idle_timeout_s, settings.write_timeout_s
        deadlines = Deadlines(idle, write_s, Outcome.UPSTREAM_IDLE_TIMEOUT, Outcome.CLIENT_STALLED)
        try:
            async with deadlines.watching():
                held = diag or (note if note and note.holds() else None)
                if not sse and (read := whole_reader(upstream, reply, self._clock, held)):
                    return await self._held(flight, deadlines, read)
                refused = await self._prepare(flight)
                if refused is not None:
                    return refused
                await self._pump(flight, upstream, deadlines, note if sse else None, diag)
                return reply.resp
        except TimeoutError:
            expired = deadlines.expired
            if expired is None:
                raise
            why = f"no upstream bytes for {idle} s"
            if expired is Outcome.CLIENT_STALLED:
                why = f"client read nothing for {write_s} s"
            return self._cut(flight, expired, why)

    async def _pump(
        self,
        flight: Flight,
        upstream: aiohttp.ClientResponse,
        deadlines: Deadlines[Outcome],
        note: Note | None,
        diag: Diagnosing | None = None,
    ) -> None:
        """The relay loop: each upstream read written to the agent at once, then fed to the
        tracker; ``note`` puts the comment line in, ``diag`` the cache diagnostics."""
        send = partial(self._send, flight, deadlines)
        read = diag.reader(upstream.content.readany) if diag else upstream.content.readany
        while True:
            deadlines.reading()
            try:
                chunk = await read()
            except aiohttp.ClientError as exc:
                held = note.cut() if note is not None else b""  # no byte kept from the agent
                await send(held, held, self._clock())
                self._cut(flight, Outcome.UPSTREAM_CLOSED_MID_STREAM, type(exc).__name__)
                return
            if not chunk:
                break
            arrived = self._clock()  # before the write, which may yield to other tasks
            if note is None:
                sent = await send(chunk, chunk, arrived)
            else:
                sent = await note.forward(chunk, arrived, send)
                note = None if note.placed else note  # the rest is relayed as it comes
            if not sent:
                return
        if note is None or await note.end(send):
            await self._end(flight, deadlines)

    async def _held(
        self, flight: Flight, deadlines: Deadlines[Outcome], read: ReadWhole
    ) -> web.StreamResponse:
        """A plain body read whole (:mod:`.whole`), then sent with its head in one write; a
        failure while reading relays what came, as the loop would."""
        body, failure = await read(deadlines)
        reply = flight.reply
        assert reply is not None
        if failure is None:
            reply.resp = one_write(reply.resp, body)
        refused = await self._prepare(flight)
        if refused is not None:
            return refused
        # the tracker saw every byte already; the agent has them once they are written
        if body and not await self._send(flight, deadlines, body, b"", 0.0):
            return reply.resp
        reply.delivered += len(body)
        if failure is not None:
            return self._cut(flight, Outcome.UPSTREAM_CLOSED_MID_STREAM, failure)
        await self._end(flight, deadlines)
        return reply.resp

    async def _send(
        self,
        flight: Flight,
        deadlines: Deadlines[Outcome],
        data: bytes,
        fed: bytes,
        arrived: float,
    ) -> bool:
        """Write ``data``, then feed ``fed`` (the upstream's bytes in it) to the tracker.
        False: the agent is gone."""
        reply = flight.reply
        assert reply is not None
        if data:
            deadlines.writing()
            try:
                await reply.resp.write(data)
            except ConnectionError:
                flight.outcome = flight.gone()
                return False
            reply.sent = self._clock()  # the exchange's end so far
        if fed:
            reply.delivered += len(fed)
            reply.tracker.feed(fed, arrived)
        return True

    async def _prepare(self, flight: Flight) -> web.Response | None:
        """Send the response's head; an error response instead when aiohttp refuses it."""
        reply = flight.reply
        assert reply is not None
        try:
            await reply.resp.prepare(flight.request)
        except (ValueError, UnicodeEncodeError) as exc:  # aiohttp refuses to write the header
            message = f"upstream sent a header that cannot be relayed: {type(exc).__name__}"
            return self._refuse(flight, Refusal(Outcome.UPSTREAM_UNREACHABLE, 502, message))
        reply.head_sent = True
        return None

    @staticmethod
    async def _end(flight: Flight, deadlines: Deadlines[Outcome]) -> None:
        """The body is all written: end it (an agent gone by then is :meth:`Flight.gone`)."""
        deadlines.idle()
        assert flight.reply is not None
        try:
            await flight.reply.resp.write_eof()
        except ConnectionError:
            flight.outcome = flight.gone()

    @staticmethod
    def _refuse(flight: Flight, refusal: Refusal) -> web.Response:
        flight.end(refusal.outcome, str(refusal), refusal.status)
        return error_response(refusal.status, str(refusal), refusal.outcome, flight.id)

    @staticmethod
    def _cut(flight: Flight, outcome: Outcome, error: str) -> web.StreamResponse:
        """Abort the agent's connection so the truncation shows (no terminating chunk)."""
        flight.end(outcome, error)
        flight.abort_agent(hard=outcome is Outcome.CLIENT_STALLED)
        assert flight.reply is not None
        return flight.reply.resp

    def expect(self, request: web.Request) -> None:
        """The route's ``Expect`` handler: ``100 Continue`` only for a body it will read."""
        self._intake.expect(request)

    def stop(self, drain_s: float) -> None:
        """Shutdown has begun (the listener is closed): requests in flight get ``drain_s``
        to end, then are cancelled, and recorded ``shutdown_aborted``. aiohttp's own
        ``shutdown_timeout`` waits that long twice (for the handler, then again after
        cancelling only the request's body), so the relay cuts at the drain itself."""
        self.shutting_down = True
        loop = asyncio.get_running_loop()
        self._drain_ends = loop.time() + drain_s
        loop.call_at(self._drain_ends, self._cancel_in_flight)

    def _cancel_in_flight(self) -> None:
        for task in self._handlers:
            task.cancel()

    def drain_left_s(self) -> float:
        """Seconds left of the shutdown drain: 0 once it ended, or before :meth:`stop`."""
        if self._drain_ends is None:
            return 0.0
        return max(0.0, self._drain_ends - asyncio.get_running_loop().time())

    async def drain(self, within_s: float | None = None) -> None:
        """Wait for records still being completed (at shutdown), at most ``within_s``;
        the exchanges waiting for their hand-off get their records at once."""
        await self._handoff.drain(within_s)
