"""A plain body read whole before its head goes out, and the head sent with it in one write.

A small body of known length that arrived whole with its head (a JSON reply: a tool call,
``/v1/models``, ``/health``; aiohttp's ``StreamReader.is_eof()``) is read at once and relayed
as an :class:`aiohttp.web.Response`, whose head aiohttp holds until the body's first write:
head and body leave in one send, where a head sent on its own costs a send and a segment
more. The agent gets the same bytes; they only leave together. A head whose body is not all
there yet is never held for it: that body is relayed as it comes. The annotation and the
cache diagnostics hold bodies whole for their own reasons; a body that fails while it is read
goes as it came, after its head, as the relay loop would send it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import aiohttp
from aiohttp import web

from proxy.core.record import Outcome
from proxy.core.tracker import StreamTracker
from proxy.serve.deadline import Deadlines
from proxy.serve.flight import Reply

__all__ = [
    "HOLD_MAX_BYTES",
    "HoldsWhole",
    "ReadWhole",
    "holds_whole",
    "one_write",
    "read_whole",
    "whole_reader",
]

ReadWhole = Callable[[Deadlines[Outcome]], Awaitable[tuple[bytes, str | None]]]
"""Reads a plain body whole within the deadlines: the bytes, and the failure that ended it."""


class HoldsWhole(Protocol):
    """What holds a plain body whole for its own reasons (the annotation, the diagnostics)."""

    async def read_whole(
        self, upstream: aiohttp.ClientResponse, deadlines: Deadlines[Outcome]
    ) -> tuple[bytes, str | None]: ...


HOLD_MAX_BYTES = 64 * 1024
"""The largest plain body of known length held whole to go out with its head."""


def holds_whole(expected: int | None, arrived: bool) -> bool:
    """A plain body of ``expected`` bytes (None: unknown) is held whole when it has
    ``arrived`` all and its size is known, not 0, and at most :data:`HOLD_MAX_BYTES`."""
    return arrived and expected is not None and 0 < expected <= HOLD_MAX_BYTES


async def read_whole(
    upstream: aiohttp.ClientResponse,
    deadlines: Deadlines[Outcome],
    tracker: StreamTracker,
    clock: Callable[[], float],
) -> tuple[bytes, str | None]:
    """The whole body, each read fed to ``tracker`` as it came; a failure to read ends it
    early: what came, and the failure's name."""
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
        tracker.feed(chunk, clock())
        chunks.append(chunk)
    deadlines.idle()
    return b"".join(chunks), failure


def whole_reader(
    upstream: aiohttp.ClientResponse,
    reply: Reply,
    clock: Callable[[], float],
    held: HoldsWhole | None,
) -> ReadWhole | None:
    """How the plain body of ``upstream`` is read whole: by ``held`` when it holds it, else
    here when :func:`holds_whole` says so; None: it is relayed as it comes."""
    if held is not None:
        return partial(held.read_whole, upstream)
    if holds_whole(reply.expected, upstream.content.is_eof()):
        return partial(read_whole, upstream, tracker=reply.tracker, clock=clock)
    return None


def one_write(resp: web.StreamResponse, body: bytes) -> web.StreamResponse:
    """``resp``, not yet prepared, as a response whose head goes out with ``body`` in one
    write: a :class:`~aiohttp.web.Response` with the same status, reason and headers, when
    its ``Content-Length`` says ``body`` is all of it; else ``resp`` itself."""
    if not body or resp.content_length != len(body):
        return resp
    return web.Response(status=resp.status, reason=resp.reason, headers=resp.headers)
