"""The relay: the only module that holds both sockets.

For each request it forwards the body bytes unchanged, copies the upstream's status,
end-to-end headers and body to the agent as they are read (one ``write`` per upstream read,
no buffering), and hands the same ``bytes`` objects to a :class:`~proxy.core.tracker.StreamTracker`
*after* they were written. Disconnects, timeouts and aborts are decided here and become the
record's ``outcome``. The proxy answers by itself only with OpenAI-shaped errors (those of
:mod:`proxy.serve.intake`, 502, 504) and only before any upstream byte reached the agent;
after that a failure aborts the agent's connection instead of ending the body cleanly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from proxy.config import AnnotateConfig
from proxy.core.annotate import ANCHORS, Splitter, annotation, comment, server_timing
from proxy.core.assemble import Exchange, build_record
from proxy.core.headers import REQUEST_ID_HEADER, request_drop, request_headers, response_headers
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import RequestFacts, analyse_request
from proxy.core.schema import schema_cost
from proxy.core.timestamps import iso_utc
from proxy.core.tracker import Observation, StreamTracker
from proxy.serve.accounting import Accounting, Pending
from proxy.serve.deadline import Deadlines
from proxy.serve.intake import Intake, Refusal, analysis_of, answer_and_close
from proxy.serve.tasks import spawn
from proxy.serve.telemetry import Telemetry
from proxy.serve.upstream import failure_cause

__all__ = ["Relay", "RelaySettings", "error_response"]


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


class _Abort(Refusal):
    """Ends an exchange early with an outcome (and, before headers, a status)."""


def error_response(
    status: int, message: str, code: str, request_id: str | None = None
) -> web.Response:
    """An OpenAI-shaped error: ``{"error": {"message", "type", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = orjson.dumps({"error": {"message": message, "type": kind, "code": code}})
    headers = {REQUEST_ID_HEADER: request_id} if request_id else None
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _timeout(seconds: float) -> Any:
    return asyncio.timeout(seconds) if seconds > 0 else nullcontext()


@dataclass(slots=True)
class _Flight:
    """Mutable state of one exchange while it runs; frozen into a Record at the end."""

    t0: float
    wall: float
    """``time.time()`` at the start: the record's ``ts``, formatted when the record is built."""
    id: str
    facts: RequestFacts
    request_bytes: int = 0
    status: int | None = None
    headers_sent: bool = False
    tracker: StreamTracker | None = None
    pending: Pending | None = None
    expected_bytes: int | None = None
    accounting_error: str | None = None
    outcome: Outcome = Outcome.COMPLETED
    error: str | None = None
    annotate: bool = False
    observation: Observation | None = None
    """Set when the body was read whole before the headers (for ``Server-Timing``)."""
    annotate_error: str | None = None
    body: bytes | None = None
    """The request body while its analysis waits for the request to be on its way (until
    then the facts are its method's and path's; :func:`not_streamed` said it is no stream)."""
    sent: float | None = None
    """Clock time the last body bytes were written to the agent: where a completed exchange
    ends (the agent has all of it then, whenever the upstream closes)."""


class Relay:
    """Forwards requests to one upstream and reports one :class:`Record` per request."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: RelaySettings,
        on_record: Callable[[Record, RequestFacts, Observation | None], None],
        clock: Callable[[], float] = time.perf_counter,
        accounting: Accounting | None = None,
        stream_session: aiohttp.ClientSession | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._session = session
        self._telemetry = telemetry
        self._stream_session = stream_session or session
        self._accounting = accounting
        self._completing: set[asyncio.Future[Any]] = set()
        self._finishing: list[tuple[web.Request, _Flight, float]] = []
        """Ended requests waiting for :meth:`_finish_all`, in the order they ended."""
        self._handoff: asyncio.TimerHandle | None = None
        self._waiting_since: float | None = None
        """Loop time the oldest record waiting for its hand-off ended (None: none waits)."""
        self._last_end = 0.0
        """Loop time the last exchange ended."""
        self._in_flight = 0
        self._handlers: set[asyncio.Task[Any]] = set()
        """The handler tasks of the requests in flight, for the end of the shutdown drain."""
        self._drain_ends: float | None = None
        self._settings = settings
        self._intake = Intake(
            settings.max_body_bytes, settings.max_header_bytes, settings.read_timeout_s
        )
        self._base = settings.upstream.rstrip("/")
        self._on_record = on_record
        self._clock = clock
        annotate = settings.annotate
        self._annotate_all = annotate.mode == "sse-comment"
        self._annotate_header = annotate.header
        self._hold_max = annotate.server_timing_max_bytes
        self._request_drop = request_drop(annotate.header)
        self.shutting_down = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """aiohttp handler for every path the proxy does not reserve for itself."""
        self._in_flight += 1
        task = asyncio.current_task()
        assert task is not None  # aiohttp runs each request's handler in a task of its own
        self._handlers.add(task)
        flight = _Flight(
            t0=self._clock(),
            wall=time.time(),
            id=f"{_ids.getrandbits(64):016x}",
            facts=analyse_request(request.method, request.path, b""),
        )
        try:
            return await self._run(request, flight)
        except asyncio.CancelledError:
            # during the drain an agent hanging up looks the same: counted as aborted
            flight.outcome = _client_gone(flight)
            if self.shutting_down and flight.outcome is not Outcome.COMPLETED:
                flight.outcome = Outcome.SHUTDOWN_ABORTED
            raise
        except Exception as exc:  # a bug of ours: answer if we still can, else abort
            flight.outcome, flight.error = Outcome.PROXY_ERROR, type(exc).__name__
            if flight.headers_sent:
                _abort_client(request)
                raise
            flight.status = 500
            return error_response(
                500, "timing-proxy failed to relay the request", Outcome.PROXY_ERROR, flight.id
            )
        finally:
            self._in_flight -= 1
            self._handlers.discard(task)
            if flight.headers_sent:  # the agent has the response, or all it will get
                self._finish_later(request, flight)
            else:  # a reply aiohttp sends after this (a refusal): its record first, as ever
                self._finish_all()
                self._finish(request, flight, self._clock())

    async def _run(self, request: web.Request, flight: _Flight) -> web.StreamResponse:
        settings = self._settings
        try:
            body = await self._intake.read_body(request)  # the bytes that arrived
        except Refusal as refusal:
            answer = self._refuse(flight, refusal)
            if refusal.outcome is Outcome.CLIENT_TIMEOUT:
                await answer_and_close(request, answer)
            return answer
        flight.request_bytes = len(body)
        # all the relay needs to know before sending it: whether it may ask for a stream
        facts, flight.body = analysis_of(request, body, settings.max_body_bytes)
        if facts is not None:
            flight.facts = facts
        flight.annotate = self._annotates(request, flight.facts)  # the path's and a header's
        if flight.body is not None or self._accounting is not None:
            # on the loop's next turn, once the request below is on its way: parsing the
            # body and hashing a long conversation for the look-ups' cache never delay it
            asyncio.get_running_loop().call_soon(self._begin, flight, request)
        url = URL(self._base + request.raw_path, encoded=True)
        # llama-server closes the connection after every event stream without saying so
        # (no "Connection: close"); pooled, such a socket is reused while its FIN is on the
        # way and the next request fails before any byte. Streams get a connection of their
        # own (the stream session does not pool); everything else is pooled.
        session = self._stream_session if flight.facts.stream else self._session
        try:
            async with _timeout(settings.header_timeout_s):
                upstream = await session.request(
                    request.method,
                    url,
                    headers=request_headers(request.headers.items(), self._request_drop),
                    data=body if body else None,
                    allow_redirects=False,
                )
        except TimeoutError:
            return self._refuse(
                flight,
                _Abort(
                    Outcome.UPSTREAM_TIMEOUT,
                    504,
                    f"upstream sent no response headers within {settings.header_timeout_s} s",
                ),
            )
        except aiohttp.ClientError as exc:
            target = url.with_user(None).with_query(None).with_fragment(None)
            return self._refuse(
                flight,
                _Abort(
                    Outcome.UPSTREAM_UNREACHABLE,
                    502,
                    f"upstream unreachable: {target}: {failure_cause(exc)}",
                ),
            )
        try:
            resp = await self._stream(request, upstream, flight)
        except BaseException:
            upstream.close()  # closing the socket is llama-server's only cancel signal
            raise
        if flight.outcome is Outcome.COMPLETED:
            upstream.release()
        else:
            upstream.close()
        return resp

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, flight: _Flight
    ) -> web.StreamResponse:
        settings = self._settings
        flight.status = upstream.status
        resp = _response(request, upstream, flight)
        self._track(upstream, flight)
        sse = upstream.content_type == _SSE
        idle, write_timeout = settings.idle_timeout_s, settings.write_timeout_s
        deadlines = Deadlines(
            idle, write_timeout, Outcome.UPSTREAM_IDLE_TIMEOUT, Outcome.CLIENT_STALLED
        )
        try:
            # annotation is decided once per request, and the loop chosen once
            if flight.annotate and not sse and self._holds(flight):
                return await self._relay_held(request, upstream, resp, flight, deadlines)
            refused = await self._prepare(request, resp, flight)
            if refused is not None:
                return refused
            if flight.annotate and sse:
                splitter = Splitter(ANCHORS.get(flight.facts.api))
                if not await self._relay_annotated(
                    request, upstream, resp, flight, deadlines, splitter
                ):
                    return resp
            return await self._relay_body(request, upstream, resp, flight, deadlines)
        except asyncio.CancelledError:
            if not deadlines.expired_cancel():
                raise
            stalled = deadlines.expired is Outcome.CLIENT_STALLED
            return self._cut(
                request,
                resp,
                flight,
                Outcome.CLIENT_STALLED if stalled else Outcome.UPSTREAM_IDLE_TIMEOUT,
                f"client read nothing for {write_timeout} s"
                if stalled
                else f"no upstream bytes for {idle} s",
            )
        finally:
            deadlines.stop()

    def _track(self, upstream: aiohttp.ClientResponse, flight: _Flight) -> StreamTracker:
        """The exchange's tracker, for the response ``upstream`` began."""
        settings = self._settings
        encoding = upstream.headers.get("Content-Encoding", "identity").strip().lower()
        tracker = flight.tracker = StreamTracker(
            flight.t0,
            sse=upstream.content_type == _SSE,
            clock=self._clock,
            max_event_bytes=settings.max_event_bytes,
            max_body_bytes=settings.max_body_bytes,
            skip=None if encoding == "identity" else f"content_encoding:{encoding}",
            dialect=flight.facts.dialect,
            # the annotation reads the record so far mid-stream: nothing kept unread then
            defer_bytes=0 if flight.annotate else DEFER_BYTES,
        )
        return tracker

    async def _prepare(
        self, request: web.Request, resp: web.StreamResponse, flight: _Flight
    ) -> web.Response | None:
        """Send the response's headers; an error response instead when aiohttp refuses."""
        try:
            await resp.prepare(request)
        except (ValueError, UnicodeEncodeError) as exc:  # aiohttp refuses to write the header
            return self._refuse(
                flight,
                _Abort(
                    Outcome.UPSTREAM_UNREACHABLE,
                    502,
                    f"upstream sent a header that cannot be relayed: {type(exc).__name__}",
                ),
            )
        flight.headers_sent = True
        return None

    async def _relay_body(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        resp: web.StreamResponse,
        flight: _Flight,
        deadlines: Deadlines[Outcome],
    ) -> web.StreamResponse:
        """The hot path: each upstream read written at once, then fed to the tracker."""
        read = upstream.content.readany
        write = resp.write
        clock = self._clock
        tracker = flight.tracker
        assert tracker is not None
        while True:
            deadlines.reading()
            try:
                chunk = await read()
            except aiohttp.ClientError as exc:
                return self._cut(
                    request,
                    resp,
                    flight,
                    Outcome.UPSTREAM_CLOSED_MID_STREAM,
                    type(exc).__name__,
                )
            if not chunk:
                break
            arrived = clock()  # before the write, which may yield to other tasks
            deadlines.writing()
            try:
                await write(chunk)
            except ConnectionError:
                flight.outcome = _client_gone(flight)
                return resp
            flight.sent = clock()  # the exchange's end so far: the upstream's may come later
            tracker.feed(chunk, arrived)
        return await self._end(resp, flight, deadlines)

    async def _relay_annotated(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        resp: web.StreamResponse,
        flight: _Flight,
        deadlines: Deadlines[Outcome],
        splitter: Splitter,
    ) -> bool:
        """An annotated event stream up to its comment line (or to its end); then the hot
        path relays the rest. False: the exchange ended here (cut, or the agent left)."""
        read = upstream.content.readany
        clock = self._clock
        while True:
            deadlines.reading()
            try:
                chunk = await read()
            except aiohttp.ClientError as exc:
                held, _ = splitter.end()  # no byte is kept from the agent, even now
                await self._send(resp, flight, deadlines, held, held, clock())
                self._cut(
                    request, resp, flight, Outcome.UPSTREAM_CLOSED_MID_STREAM, type(exc).__name__
                )
                return False
            if not chunk:
                return await self._annotate_end(request, resp, flight, deadlines, splitter)
            arrived = clock()
            now, rest = splitter.split(chunk)
            if not await self._send(resp, flight, deadlines, now, now, arrived):
                return False
            if rest is not None:
                note = self._annotation(request, flight)  # the tracker has read every event before
                return await self._send(resp, flight, deadlines, note + rest, rest, arrived)

    async def _annotate_end(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        flight: _Flight,
        deadlines: Deadlines[Outcome],
        splitter: Splitter,
    ) -> bool:
        """The stream ended without its anchor: the bytes held back, then the comment when
        the stream ended at an event boundary (a stream cut short gets none)."""
        held, boundary = splitter.end()
        if held:
            return await self._send(resp, flight, deadlines, held, held, self._clock())
        if boundary:
            return await self._send(
                resp, flight, deadlines, self._annotation(request, flight), b"", 0.0
            )
        return True

    async def _send(
        self,
        resp: web.StreamResponse,
        flight: _Flight,
        deadlines: Deadlines[Outcome],
        data: bytes,
        fed: bytes,
        arrived: float,
    ) -> bool:
        """Write ``data``, then feed ``fed`` (the upstream's bytes in it) to the tracker.
        False: the agent is gone."""
        if data:
            deadlines.writing()
            try:
                await resp.write(data)
            except ConnectionError:
                flight.outcome = _client_gone(flight)
                return False
            flight.sent = self._clock()
        if fed and flight.tracker is not None:
            flight.tracker.feed(fed, arrived)
        return True

    def _annotation(self, request: web.Request, flight: _Flight) -> bytes:
        """The comment line: the record's fields as they stand (never raises: no line)."""
        try:
            record = self._record_now(request, flight)
            return comment(annotation(record, self._schema_now(flight, record)))
        except Exception as exc:  # the annotation must never disturb the relay
            flight.annotate_error = f"annotate: {type(exc).__name__}"
            return b""

    def _record_now(
        self, request: web.Request, flight: _Flight, obs: Observation | None = None
    ) -> Record:
        """The record as it would be if the exchange completed now."""
        if obs is None and flight.tracker is not None:
            obs = flight.tracker.peek()
        _analysed(flight, request)
        exchange = _exchange(request, flight, Outcome.COMPLETED, self._clock(), None)
        return build_record(exchange, flight.facts, obs)

    def _schema_now(self, flight: _Flight, record: Record) -> dict[str, Any]:
        """The schema fields when the accounting's look-up is done, else its state:
        ``none`` (no look-up: no tools, or accounting off), ``pending``, ``failed``."""
        pending = flight.pending if self._accounting is not None else None
        task = pending.schema if pending is not None else None
        if task is None:
            return {"accounting": "none"}
        if not task.done():
            return {"accounting": "pending"}
        if task.cancelled() or task.exception() is not None:
            return {"accounting": "failed"}
        info = task.result()
        cost = schema_cost(
            info.tokens, info.layout, record.cache_n, record.prompt_n, record.prefill_ms
        )
        return {
            "accounting": "done",
            "schema_tokens": info.tokens,
            "schema_cached": cost.cached,
            "schema_prefill_ms": cost.prefill_ms,
        }

    def _annotates(self, request: web.Request, facts: RequestFacts) -> bool:
        """Whether this request is annotated: a model turn of a known API, with the header
        at ``1`` or the mode on (and the header not ``0``)."""
        if facts.api == "other":
            return False
        flag = request.headers.get(self._annotate_header)
        if flag is None:
            return self._annotate_all
        flag = flag.strip()
        return flag == "1" or (self._annotate_all and flag != "0")

    def _holds(self, flight: _Flight) -> bool:
        """A non-streamed body is held for ``Server-Timing`` only when its size is known
        and small enough."""
        size = flight.expected_bytes
        return size is not None and self._hold_max > 0 and size <= self._hold_max

    async def _relay_held(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        resp: web.StreamResponse,
        flight: _Flight,
        deadlines: Deadlines[Outcome],
    ) -> web.StreamResponse:
        """A small plain body read whole before the headers go out, with ``Server-Timing``
        on them. A failure while reading relays what came, as the hot path would have."""
        tracker = flight.tracker
        assert tracker is not None
        chunks: list[bytes] = []
        failure: str | None = None
        read = upstream.content.readany
        while True:
            deadlines.reading()
            try:
                chunk = await read()
            except aiohttp.ClientError as exc:
                failure = type(exc).__name__
                break
            if not chunk:
                break
            tracker.feed(chunk, self._clock())
            chunks.append(chunk)
        deadlines.idle()
        if failure is None:
            self._add_server_timing(request, resp, flight)
        refused = await self._prepare(request, resp, flight)
        if refused is not None:
            return refused
        body = b"".join(chunks)
        # the tracker saw every byte already: until the agent has them all, a hang-up is
        # no completed exchange
        size, flight.expected_bytes = flight.expected_bytes, None
        if body and not await self._send(resp, flight, deadlines, body, b"", 0.0):
            return resp
        flight.expected_bytes = size
        if failure is not None:
            return self._cut(request, resp, flight, Outcome.UPSTREAM_CLOSED_MID_STREAM, failure)
        return await self._end(resp, flight, deadlines)

    @staticmethod
    async def _end(
        resp: web.StreamResponse, flight: _Flight, deadlines: Deadlines[Outcome]
    ) -> web.StreamResponse:
        """The body is all written: end it (an agent gone by then is :func:`_client_gone`)."""
        deadlines.idle()
        try:
            await resp.write_eof()
        except ConnectionError:
            flight.outcome = _client_gone(flight)
        return resp

    def _add_server_timing(
        self, request: web.Request, resp: web.StreamResponse, flight: _Flight
    ) -> None:
        """The whole body is in: the tracker's last word, and the header from it."""
        assert flight.tracker is not None
        try:
            obs = flight.observation = flight.tracker.finish()
            record = self._record_now(request, flight, obs)
            resp.headers["Server-Timing"] = server_timing(record, record.e2e_ms)
        except Exception as exc:  # the annotation must never disturb the relay
            flight.annotate_error = f"annotate: {type(exc).__name__}"

    def _refuse(self, flight: _Flight, abort: Refusal) -> web.Response:
        flight.outcome, flight.status, flight.error = abort.outcome, abort.status, str(abort)
        return error_response(abort.status, str(abort), abort.outcome, flight.id)

    def _cut(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        flight: _Flight,
        outcome: Outcome,
        error: str,
    ) -> web.StreamResponse:
        """Abort the agent's connection so the truncation shows (no terminating chunk)."""
        flight.outcome, flight.error = outcome, error
        _abort_client(request, hard=outcome is Outcome.CLIENT_STALLED)
        return resp

    def expect(self, request: web.Request) -> None:
        """The route's ``Expect`` handler: ``100 Continue`` only for a body it will read."""
        self._intake.expect(request)

    def _begin(self, flight: _Flight, request: web.Request) -> None:
        """The request is on its way: its body analysed, its accounting begun."""
        _analysed(flight, request)
        accounting = self._accounting
        if accounting is None:
            return
        try:
            flight.pending = accounting.begin(flight.facts, request.headers)
        except Exception as exc:  # accounting must never stop a request
            flight.accounting_error = f"begin: {type(exc).__name__}"

    def _finish_later(self, request: web.Request, flight: _Flight) -> None:
        """Note the end of the exchange now; build its record and give it to the sinks
        once the relay has been idle for :data:`HANDOFF_DELAY_S`, with every other exchange
        ended meanwhile (at the latest :data:`HANDOFF_MAX_DELAY_S` after the oldest ended).
        (A reply not sent yet when the handler ends, a refusal or an error, has its record
        built at once, after those waiting, as before: its client may look for it on
        arrival.) A completed exchange ends when its last body bytes went to the agent."""
        end = flight.sent if flight.outcome is Outcome.COMPLETED else None
        self._finishing.append((request, flight, self._clock() if end is None else end))
        loop = asyncio.get_running_loop()
        self._last_end = now = loop.time()
        if self._waiting_since is None:
            self._waiting_since = now
        if self._handoff is None:
            self._handoff = loop.call_at(now + HANDOFF_DELAY_S, self._handoff_due)

    def _handoff_due(self) -> None:
        """The hand-off's timer: hand off when the relay has been idle for
        :data:`HANDOFF_DELAY_S` or the oldest record has waited its limit, else look again
        when one of the two can be true (one timer per batch, none re-armed per request)."""
        assert self._waiting_since is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        latest = self._waiting_since + max(HANDOFF_MAX_DELAY_S, HANDOFF_DELAY_S)
        idle_at = self._last_end + HANDOFF_DELAY_S
        if now >= latest or (not self._in_flight and now >= idle_at):
            self._handoff = None
            self._finish_all()
            return
        due = min(latest, idle_at if not self._in_flight else now + HANDOFF_DELAY_S)
        self._handoff = loop.call_at(due, self._handoff_due)

    def _finish_all(self) -> None:
        """Build and hand off the record of every ended exchange waiting, oldest first."""
        if self._handoff is not None:
            self._handoff.cancel()
            self._handoff = None
        self._waiting_since = None
        finishing, self._finishing = self._finishing, []
        for request, flight, end in finishing:
            try:
                self._finish(request, flight, end)
            except Exception as exc:  # a bug of ours: the others still get their records
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "timing-proxy: record hand-off failed", "exception": exc}
                )

    def _finish(self, request: web.Request, flight: _Flight, end: float) -> None:
        _analysed(flight, request)  # the exchange may have ended before the loop's next turn
        obs = flight.observation
        if obs is None and flight.tracker is not None:
            obs = flight.tracker.finish()
        exchange = _exchange(request, flight, flight.outcome, end, flight.error)
        record = build_record(exchange, flight.facts, obs)
        if flight.annotate_error is not None and record.analysis_error is None:
            record = record.replace(analysis_error=flight.annotate_error)
        if flight.accounting_error is not None:
            record = record.replace(accounting_error=flight.accounting_error)
        pending = flight.pending if self._accounting is not None else None
        # the board's samples for the request's wall interval: chat and tool turns only
        board = self._telemetry if record.kind is not Kind.OTHER else None
        if pending is None and board is None:
            self._on_record(record, flight.facts, obs)
            return
        window = (flight.t0, flight.t0 + exchange.end_s)
        _ = spawn(
            self._complete(record, flight.facts, pending, obs, board, window), self._completing
        )

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
            spawn(board.fields(*window, record.predicted_n), self._completing)
            if board is not None
            else None
        )
        if pending is not None and self._accounting is not None:
            try:
                record = await self._accounting.complete(record, pending, obs)
            except Exception as exc:  # the record is still written, with the reason
                record = record.replace(accounting_error=type(exc).__name__)
        if sampled is not None:
            try:
                record = record.replace(**await sampled)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                record = record.replace(telemetry_error="cancelled")
            except Exception as exc:  # the record is still written, with the reason
                record = record.replace(telemetry_error=type(exc).__name__)
        self._on_record(record, facts, obs)

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
        self._finish_all()
        if self._completing:
            await asyncio.wait(set(self._completing), timeout=within_s)


DEFER_BYTES = 64 * 1024
"""The response bytes the tracker may keep unread while the relay forwards them
(:class:`~proxy.core.tracker.StreamTracker`'s ``defer_bytes``): a response up to this size
is analysed after its last byte has gone to the agent, in the record's hand-off, instead of
between two reads of a burst; a longer one in batches of this size. Per stream in flight,
at most this much is held beyond what the relay holds anyway."""

HANDOFF_DELAY_S = 0.002
"""How long the relay must have been idle (no exchange in flight) before the records of
the exchanges that ended are built and handed to the sinks (``/stats``, ``/metrics``, the
log line, the accounting): the few hundred microseconds of CPU that costs then land in a
pause of the agent's, or after its next request has gone to the upstream, instead of in
front of a request; the exchanges ending within that time go together. The times in the
record are taken when the exchange ends, not then."""

HANDOFF_MAX_DELAY_S = 0.010
"""The longest a record waits for its hand-off while exchanges keep the relay busy (the
hand-off then runs between their reads): under 200 concurrent streams, about ten records
at a time."""


def _exchange(
    request: web.Request, flight: _Flight, outcome: Outcome, end: float, error: str | None
) -> Exchange:
    """The relay's facts of one exchange, ended at clock time ``end`` with ``outcome``."""
    return Exchange(
        id=flight.id,
        ts=iso_utc(datetime.fromtimestamp(flight.wall, UTC)),
        method=request.method,
        path=request.path,
        status=flight.status,
        outcome=outcome,
        end_s=end - flight.t0,
        request_bytes=flight.request_bytes,
        error=error,
    )


def _response(
    request: web.Request, upstream: aiohttp.ClientResponse, flight: _Flight
) -> web.StreamResponse:
    """The agent's response to ``upstream``'s: its status, end-to-end headers and length,
    and the proxy's request id."""
    resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    headers = response_headers(upstream.headers.items(), into=resp.headers)
    headers[REQUEST_ID_HEADER] = flight.id
    if upstream.content_length is not None and request.method != "HEAD":
        resp.content_length = flight.expected_bytes = upstream.content_length
    return resp


def _analysed(flight: _Flight, request: web.Request) -> None:
    """The request's facts from its body, if that analysis was left for after sending it."""
    body = flight.body
    if body is not None:
        flight.body = None
        flight.facts = analyse_request(request.method, request.path, body)


def _client_gone(flight: _Flight) -> Outcome:
    """The agent hung up: after the whole answer (``[DONE]`` or every byte of a sized body)
    that is a completed exchange, as the OpenAI SDK closes once it has read ``[DONE]``."""
    tracker = flight.tracker
    if tracker is not None and (
        tracker.done
        or (flight.expected_bytes is not None and tracker.bytes_seen >= flight.expected_bytes)
    ):
        return Outcome.COMPLETED
    return Outcome.CLIENT_CLOSED


_SSE = "text/event-stream"
# Request ids only need to be unique, not secret: a PRNG seeded from the OS once, where
# secrets.token_hex made a getrandom system call per request (about 3% of the proxy's CPU
# on back-to-back requests in the bench profile).
_ids = random.Random()


def _abort_client(request: web.Request, *, hard: bool = False) -> None:
    transport = request.transport
    if transport is not None:
        if hard:
            transport.abort()
        else:
            transport.close()
