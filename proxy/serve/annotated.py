"""The relay's annotating variant, opt-in (``[annotate]``, the ``X-Timing-Proxy-Annotate``
header): an event stream gets one SSE comment line with the record's fields so far, where
the API's anchor says (:mod:`proxy.core.annotate`); a small plain body is read whole before
its head goes out and gets a ``Server-Timing`` header. Every upstream byte still reaches the
agent, in order; the annotation never disturbs the relay (a failure is the record's
``analysis_error``, and no line or header)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config import AnnotateConfig
from proxy.core.annotate import ANCHORS, Splitter, annotation, comment, server_timing
from proxy.core.assemble import build_record
from proxy.core.record import Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.schema import schema_cost
from proxy.core.tracker import Observation
from proxy.serve.accounting import Accounting
from proxy.serve.deadline import Deadlines
from proxy.serve.flight import Flight
from proxy.serve.whole import read_whole

__all__ = ["Note", "Send", "annotates"]

Send = Callable[[bytes, bytes, float], Awaitable[bool]]
"""The relay's write: ``data`` to the agent, then ``fed`` (the upstream bytes in it, read
at the given clock time) to the tracker; False when the agent is gone."""


def annotates(request: web.Request, facts: RequestFacts, config: AnnotateConfig) -> bool:
    """Whether this request is annotated: a model turn of a known API, with the header at
    ``1``, or the mode on and the header not ``0``."""
    if facts.api == "other":
        return False
    every = config.mode == "sse-comment"
    flag = request.headers.get(config.header)
    if flag is None:
        return every
    flag = flag.strip()
    return flag == "1" or (every and flag != "0")


class Note:
    """The annotation of one exchange, whose :class:`~proxy.serve.flight.Reply` is set."""

    def __init__(
        self,
        flight: Flight,
        clock: Callable[[], float],
        accounting: Accounting | None,
        hold_max: int,
    ) -> None:
        self._flight = flight
        self._clock = clock
        self._accounting = accounting
        self._hold_max = hold_max
        self._splitter = Splitter(ANCHORS.get(flight.facts.api))
        self.placed = False
        """The comment line is written (or the stream ended without a place for it)."""

    # an event stream: the comment line at its anchor

    async def forward(self, chunk: bytes, arrived: float, send: Send) -> bool:
        """Relay ``chunk``, with the comment line before the anchor if it is in it (the
        bytes that could begin the anchor are held for the next chunk)."""
        now, rest = self._splitter.split(chunk)
        if not await send(now, now, arrived):
            return False
        if rest is None:
            return True
        self.placed = True
        # after the tracker has read every event before the line
        return await send(self._comment() + rest, rest, arrived)

    async def end(self, send: Send) -> bool:
        """The stream ended without its anchor: the bytes held, or else the comment line
        when the stream ended at an event boundary (a stream cut short gets none)."""
        held, boundary = self._splitter.end()
        self.placed = True
        if held:
            return await send(held, held, self._clock())
        if boundary:
            return await send(self._comment(), b"", 0.0)
        return True

    def cut(self) -> bytes:
        """The upstream failed: the bytes held, which still go to the agent (no comment)."""
        held, _ = self._splitter.end()
        return held

    # a plain body: read whole, then a Server-Timing header

    def holds(self) -> bool:
        """A plain body is held for ``Server-Timing`` only when its size is known and small
        enough (``server_timing_max_bytes``; 0: never)."""
        assert self._flight.reply is not None
        size = self._flight.reply.expected
        return size is not None and self._hold_max > 0 and size <= self._hold_max

    async def read_whole(
        self, upstream: aiohttp.ClientResponse, deadlines: Deadlines[Outcome]
    ) -> tuple[bytes, str | None]:
        """The whole body, fed to the tracker as it came, and the head's ``Server-Timing``;
        a failure to read ends it early: what came, and the failure (then no header)."""
        reply = self._flight.reply
        assert reply is not None
        body, failure = await read_whole(upstream, deadlines, reply.tracker, self._clock)
        if failure is None:
            self._server_timing(reply.resp)
        return body, failure

    def _server_timing(self, resp: web.StreamResponse) -> None:
        flight = self._flight
        assert flight.reply is not None
        try:
            obs = flight.beside.observation = flight.reply.tracker.finish()
            record = self._record_now(obs)
            resp.headers["Server-Timing"] = server_timing(record, record.e2e_ms)
        except Exception as exc:  # the annotation must never disturb the relay
            flight.beside.annotate_error = f"annotate: {type(exc).__name__}"

    # what the annotation says

    def _comment(self) -> bytes:
        """The comment line: the record's fields as they stand (never raises: no line)."""
        try:
            record = self._record_now()
            return comment(annotation(record, self._schema_now(record)))
        except Exception as exc:  # the annotation must never disturb the relay
            self._flight.beside.annotate_error = f"annotate: {type(exc).__name__}"
            return b""

    def _record_now(self, obs: Observation | None = None) -> Record:
        """The record as it would be if the exchange completed now."""
        flight = self._flight
        if obs is None and flight.reply is not None:
            obs = flight.reply.tracker.peek()
        facts = flight.analysed()
        return build_record(flight.exchange(Outcome.COMPLETED, self._clock(), None), facts, obs)

    def _schema_now(self, record: Record) -> dict[str, Any]:
        """The schema fields when the accounting's look-up is done, else its state:
        ``none`` (no look-up: no tools, or accounting off), ``pending``, ``failed``."""
        pending = self._flight.beside.pending if self._accounting is not None else None
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
