"""The request as the relay takes it in: its head checked, its body read within a deadline
and a size limit, and, for the analysis only, a compressed body decoded into a bounded copy.

What is refused here is refused before any byte goes upstream, in OpenAI's error shape, with
the record's ``outcome`` (docs/relay.md has the table):

- a target that is not a path (``OPTIONS *``, ``CONNECT host:port``, absolute-form): 400,
  ``bad_request``; an ``Expect`` other than ``100-continue``: 417, ``bad_request``;
- a header section over ``max_header_bytes``: 431; a ``Content-Length`` over
  ``max_body_bytes`` (no ``100 Continue`` is sent first), or a body that grows over it: 413;
  both ``request_too_large``;
- a body not all there ``read_timeout_s`` after the head: 408, ``client_timeout``, and the
  connection is closed. A chunked body whose framing breaks once it is being read ends here
  too: aiohttp's parser drops such a body without ending it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import HttpVersion11, web

from proxy.core.content_coding import decode_body
from proxy.core.headers import REQUEST_ID_HEADER
from proxy.core.record import Outcome
from proxy.core.request import RequestFacts, analyse_request, not_streamed

__all__ = ["CONTINUE", "Intake", "Refusal", "analysis_of", "answer_and_close", "error_response"]

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Refusal(Exception):
    """Ends an exchange early with an outcome (and, before headers, a status)."""

    def __init__(self, outcome: Outcome, status: int, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.status = status


def error_response(
    status: int, message: str, code: str, request_id: str | None = None
) -> web.Response:
    """An OpenAI-shaped error: ``{"error": {"message", "type", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = orjson.dumps({"error": {"message": message, "type": kind, "code": code}})
    headers = {REQUEST_ID_HEADER: request_id} if request_id else None
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def head_bytes(request: web.BaseRequest) -> int:
    """The size of the request's header section as parsed: the request line and each
    field line with its CRLF, and the empty line."""
    size = len(request.method) + len(request.raw_path) + len(" HTTP/1.1\r\n") + 2
    for name, value in request.raw_headers:
        size += len(name) + len(value) + 4
    return size


def _expects(request: web.BaseRequest) -> str | None:
    """The request's expectation, lower case (``None``: none, or HTTP/1.0, which has none)."""
    expect = request.headers.get("Expect")
    if expect is None or request.version < HttpVersion11:
        return None
    return expect.strip().lower()


def _deadline(seconds: float) -> Any:
    return asyncio.timeout(seconds) if seconds > 0 else nullcontext()


@dataclass(frozen=True, slots=True)
class Intake:
    """The limits a request is taken in with (seconds; 0 means off)."""

    max_body_bytes: int
    max_header_bytes: int
    read_timeout_s: float

    def head_refusal(self, request: web.BaseRequest) -> Refusal | None:
        """Why the request is refused on its head alone, or ``None``."""
        if request.method == "CONNECT" or not request.raw_path.startswith("/"):
            return Refusal(
                Outcome.BAD_REQUEST,
                400,
                "the request target must be a path (origin-form): the proxy relays to one "
                "upstream and takes no authority-form, asterisk-form or absolute-form target",
            )
        size = head_bytes(request)
        if size > self.max_header_bytes:
            return Refusal(
                Outcome.REQUEST_TOO_LARGE,
                431,
                f"request header section of {size} bytes exceeds the proxy's limit "
                f"of {self.max_header_bytes} bytes",
            )
        if _expects(request) not in (None, "100-continue"):
            return Refusal(Outcome.BAD_REQUEST, 417, "only Expect: 100-continue is supported")
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            return Refusal(
                Outcome.REQUEST_TOO_LARGE,
                413,
                f"request body of {length} bytes exceeds the proxy's limit "
                f"of {self.max_body_bytes} bytes",
            )
        return None

    def expect(self, request: web.BaseRequest) -> None:
        """``Expect: 100-continue``: the interim ``100 Continue`` only when the body will be
        read; a request refused on its head gets its refusal instead."""
        transport = request.transport
        if (
            transport is not None
            and _expects(request) == "100-continue"
            and self.head_refusal(request) is None
        ):
            transport.write(CONTINUE)  # as aiohttp's documented Expect handler writes it

    async def read_body(self, request: web.BaseRequest) -> bytes:
        """The body exactly as it arrived, or a :class:`Refusal`."""
        refusal = self.head_refusal(request)
        if refusal is not None:
            raise refusal
        try:
            async with _deadline(self.read_timeout_s):
                return await self._receive(request)
        except TimeoutError:
            raise Refusal(
                Outcome.CLIENT_TIMEOUT,
                408,
                f"the request body did not arrive within {self.read_timeout_s} s",
            ) from None

    async def _receive(self, request: web.BaseRequest) -> bytes:
        content = request.content
        if request.content_length is not None:  # framed by its length, checked above
            # all of it came with the head (a bodiless request too): taken as it is
            return content.read_nowait() if content.is_eof() else await content.read()
        limit = self.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in content.iter_any():
            size += len(chunk)
            if size > limit:
                raise Refusal(
                    Outcome.REQUEST_TOO_LARGE,
                    413,
                    f"request body exceeds the proxy's limit of {limit} bytes",
                )
            chunks.append(chunk)
        return b"".join(chunks)


def analysis_of(
    request: web.BaseRequest, body: bytes, limit: int
) -> tuple[RequestFacts | None, bytes | None]:
    """The request's facts now (no body, a body that may ask for a stream, or one that
    cannot be decoded), or ``(None, body)``: the body, decoded, whose analysis can wait
    until the request is on its way (:func:`not_streamed` said it asks for no stream).

    A body with a ``Content-Encoding`` is decoded into a copy of at most ``limit`` bytes
    (the body relayed stays as it arrived); when it cannot be, the facts say why in
    ``error`` (the record's ``analysis_error``)."""
    method, path = request.method, request.path
    coding = request.headers.get("Content-Encoding")
    if coding is not None and body:
        body, undecodable = decode_body(body, coding, limit)
        if undecodable is not None:
            return dataclasses.replace(analyse_request(method, path, b""), error=undecodable), None
    if body and not_streamed(body):
        return None, body
    return analyse_request(method, path, body), None


async def answer_and_close(request: web.BaseRequest, answer: web.StreamResponse) -> None:
    """Send ``answer`` now and close the connection: the rest of a stalled body is not
    waited for (aiohttp would otherwise keep reading it for its lingering time)."""
    answer.force_close()
    try:
        await answer.prepare(request)
        await answer.write_eof()
    except ConnectionError:
        return  # the agent is gone already
    transport = request.transport
    if transport is not None:
        transport.close()
