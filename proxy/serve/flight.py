"""One exchange while the relay runs it: the request, what of the response reached the agent,
and how it ended. The hand-off (:mod:`proxy.serve.handoff`) turns it into the record."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from proxy.core.assemble import Exchange
from proxy.core.headers import REQUEST_ID_HEADER, response_headers
from proxy.core.record import Outcome
from proxy.core.request import RequestFacts, analyse_request
from proxy.core.timestamps import iso_utc
from proxy.core.tracker import Observation, StreamTracker
from proxy.serve.accounting import Pending

__all__ = ["Beside", "Flight", "Reply", "open_reply"]

# Request ids only need to be unique, not secret: a PRNG seeded from the OS once, where
# secrets.token_hex made a getrandom system call per request.
_ids = random.Random()


@dataclass(slots=True)
class Reply:
    """The upstream's response on its way to the agent."""

    resp: web.StreamResponse
    tracker: StreamTracker
    """Reads the body bytes, fed each after it was written to the agent."""
    expected: int | None
    """The body's size, when the upstream said it (``Content-Length``)."""
    head_sent: bool = False
    """The agent has the response's head (its status can no longer change)."""
    delivered: int = 0
    """Upstream body bytes written to the agent so far."""
    sent: float | None = None
    """Clock time of the last write to the agent: where a completed exchange ends (the agent
    has all of it then, whenever the upstream closes)."""

    def delivered_all(self) -> bool:
        """The agent has the whole answer: ``[DONE]`` (or the API's end event) was written,
        or every byte of a sized body."""
        if self.tracker.done and self.delivered >= self.tracker.bytes_seen:
            return True
        return self.expected is not None and self.delivered >= self.expected


@dataclass(slots=True)
class Beside:
    """What the work beside the relay left for the record: the accounting's look-ups, and
    what the annotation saw or failed at."""

    pending: Pending | None = None
    accounting_error: str | None = None
    annotate_error: str | None = None
    observation: Observation | None = None
    """The body's observation when the annotation read it whole before the headers."""


@dataclass(slots=True)
class Flight:
    """One exchange while it runs. ``facts`` are the request's; a body that asks for no
    stream is analysed only once the request is on its way (``unread`` holds it until then)."""

    request: web.Request
    id: str
    t0: float
    """Clock time the request arrived."""
    wall: float
    """``time.time()`` then: the record's ``ts``."""
    facts: RequestFacts
    unread: bytes | None = None
    request_bytes: int = 0
    status: int | None = None
    outcome: Outcome = Outcome.COMPLETED
    error: str | None = None
    reply: Reply | None = None
    beside: Beside = field(default_factory=Beside)

    @classmethod
    def begin(cls, request: web.Request, clock: Callable[[], float]) -> Flight:
        """The exchange of ``request``, arrived now; its facts those of its method and path."""
        return cls(
            request=request,
            id=f"{_ids.getrandbits(64):016x}",
            t0=clock(),
            wall=time.time(),
            facts=analyse_request(request.method, request.path, b""),
        )

    @property
    def headers_sent(self) -> bool:
        """The agent has the response's head (its status can no longer change)."""
        return self.reply is not None and self.reply.head_sent

    def analysed(self) -> RequestFacts:
        """The request's facts, its body analysed now if that was left for later."""
        if self.unread is not None:
            body, self.unread = self.unread, None
            self.facts = analyse_request(self.request.method, self.request.path, body)
        return self.facts

    def end(self, outcome: Outcome, error: str | None = None, status: int | None = None) -> None:
        """The exchange ended with ``outcome`` (and the proxy's own ``status``, if it
        answered)."""
        self.outcome, self.error = outcome, error
        if status is not None:
            self.status = status

    def gone(self) -> Outcome:
        """The outcome of the agent hanging up now: completed when it has the whole answer
        (the OpenAI SDK closes once it has read ``[DONE]``), else ``client_closed``."""
        if self.reply is not None and self.reply.delivered_all():
            return Outcome.COMPLETED
        return Outcome.CLIENT_CLOSED

    def abort_agent(self, *, hard: bool = False) -> None:
        """Close the agent's connection now, without ending the response: a truncation
        shows as one; ``hard`` resets it (an agent that reads nothing)."""
        transport = self.request.transport
        if transport is not None:
            if hard:
                transport.abort()
            else:
                transport.close()

    def exchange(self, outcome: Outcome, end: float, error: str | None) -> Exchange:
        """The relay's facts of the exchange, ended at clock time ``end`` with ``outcome``."""
        request = self.request
        return Exchange(
            id=self.id,
            ts=iso_utc(datetime.fromtimestamp(self.wall, UTC)),
            method=request.method,
            path=request.path,
            status=self.status,
            outcome=outcome,
            end_s=end - self.t0,
            request_bytes=self.request_bytes,
            error=error,
        )


def open_reply(
    flight: Flight, upstream: aiohttp.ClientResponse, tracker: Callable[..., StreamTracker]
) -> Reply:
    """The agent's response to ``upstream``'s (its status, end-to-end headers and length,
    and the proxy's request id), not sent yet, and the tracker ``tracker`` makes for its body
    (from the exchange's start, its API and the body's content coding)."""
    resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    headers = response_headers(upstream.headers.items(), into=resp.headers)
    headers[REQUEST_ID_HEADER] = flight.id
    expected = None
    if upstream.content_length is not None and flight.request.method != "HEAD":
        resp.content_length = expected = upstream.content_length
    encoding = upstream.headers.get("Content-Encoding", "identity").strip().lower()
    skip = None if encoding == "identity" else f"content_encoding:{encoding}"
    return Reply(resp, tracker(flight.t0, skip=skip, dialect=flight.facts.dialect), expected)
