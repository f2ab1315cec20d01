"""A small plain body that arrived whole with its head goes out with that head in one write;
any other body is relayed as it comes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.core.headers import REQUEST_ID_HEADER
from proxy.core.record import Outcome
from proxy.core.tracker import StreamTracker
from proxy.serve.deadline import Deadlines
from proxy.serve.flight import Reply
from proxy.serve.whole import HOLD_MAX_BYTES, holds_whole, one_write, whole_reader
from tests.conftest import ProxyUnderTest
from tests.fakes import JSON_HEADERS, FakeUpstream, SeenRequest, json_response

BODY = b'{"object":"list","data":[{"id":"m"}]}'


def _reply(expected: int | None) -> Reply:
    return Reply(web.StreamResponse(), StreamTracker(0.0, sse=False), expected)


async def _head_then_body(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
    """The head, then the body a moment later: a head whose body is not all there yet."""
    resp = web.StreamResponse(headers=JSON_HEADERS)
    resp.content_length = len(BODY)
    await resp.prepare(request)
    await asyncio.sleep(0.05)
    await resp.write(BODY)
    return resp


async def _chunked(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
    """A body of unknown length (chunked), written whole at once."""
    resp = web.StreamResponse(headers=JSON_HEADERS)
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(BODY)
    await resp.write_eof()
    return resp


async def _held(
    fake: tuple[FakeUpstream, TestServer], script: Any, *, wait_eof: bool
) -> tuple[bool, int | None]:
    """Whether the response ``script`` writes would be read whole (once all of it is there
    when ``wait_eof``), and the length its head states."""
    upstream, server = fake
    upstream.script = script
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as up:
        if wait_eof:
            await up.content.wait_eof()
        read = whole_reader(up, _reply(up.content_length), time.perf_counter, None)
        return read is not None, up.content_length


class TestWhichBodiesAreHeld:
    """Only a small body of known length that arrived with its head is read whole."""

    def test_the_size_bounds(self) -> None:
        """Known, not empty, at most the bound, and arrived: held; anything else is not."""
        assert holds_whole(1, True) and holds_whole(HOLD_MAX_BYTES, True)
        assert not holds_whole(HOLD_MAX_BYTES + 1, True)
        assert not holds_whole(0, True) and not holds_whole(None, True)
        assert not holds_whole(10, False)

    async def test_a_body_that_arrived_with_its_head_is_read_whole(
        self, fake: tuple[FakeUpstream, TestServer]
    ) -> None:
        """A JSON reply written with its head is read whole at once: every byte, no failure,
        and the tracker saw them."""
        upstream, server = fake
        upstream.script = json_response(200, BODY)
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as up:
            reply = _reply(up.content_length)
            read = whole_reader(up, reply, time.perf_counter, None)
            assert read is not None
            deadlines = Deadlines(5.0, 5.0, Outcome.UPSTREAM_IDLE_TIMEOUT, Outcome.CLIENT_STALLED)
            async with deadlines.watching():
                got = await read(deadlines)
        assert got == (BODY, None)
        assert reply.tracker.finish().response_bytes == len(BODY)

    async def test_a_body_not_all_there_is_relayed_as_it_comes(
        self, fake: tuple[FakeUpstream, TestServer]
    ) -> None:
        """A head whose body comes later is not held for it, though its length is known."""
        assert await _held(fake, _head_then_body, wait_eof=False) == (False, len(BODY))

    async def test_a_body_of_unknown_length_is_relayed_as_it_comes(
        self, fake: tuple[FakeUpstream, TestServer]
    ) -> None:
        """A chunked body, even one all there, is not held: its head stays chunked."""
        assert await _held(fake, _chunked, wait_eof=True) == (False, None)


class TestOneWrite:
    """The response that sends its head with its body keeps that head."""

    def test_a_whole_body_gets_a_response_with_the_same_head(self) -> None:
        """Status, reason and every header (repeated ones, in order) are the streamed
        response's."""
        resp = web.StreamResponse(status=201, reason="Made")
        resp.headers.add("X-Twice", "1")
        resp.headers.add("X-Twice", "2")
        resp.content_length = 4
        out = one_write(resp, b"abcd")
        assert isinstance(out, web.Response) and out is not resp
        assert (out.status, out.reason) == (201, "Made")
        assert list(out.headers.items()) == list(resp.headers.items())

    def test_a_body_its_length_does_not_cover_keeps_the_streamed_response(self) -> None:
        """An empty body, a body shorter than ``Content-Length`` and a body of no stated
        length leave the response as it was."""
        sized = web.StreamResponse()
        sized.content_length = 4
        assert one_write(sized, b"") is sized
        assert one_write(sized, b"abc") is sized
        unsized = web.StreamResponse()
        assert one_write(unsized, b"abcd") is unsized


async def _raw_get(url: str, path: str) -> tuple[list[bytes], bytes]:
    """The header lines (without ``Date``) and body of a raw ``GET path`` to ``url``."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n")[1:] if not line.lower().startswith(b"date:")]
    return [head.split(b"\r\n")[0], *lines], body


class TestThroughTheProxy:
    """Held or not, the agent gets the upstream's status line, headers and body."""

    async def test_a_held_reply_keeps_the_upstreams_head_and_body(
        self, fake: tuple[FakeUpstream, TestServer], make_proxy: Any
    ) -> None:
        """A JSON reply that arrived with its head reaches the agent with the upstream's
        status line and headers, in order (its own request id added), and the same body."""
        upstream, server = fake
        upstream.script = json_response(200, BODY, headers=(*JSON_HEADERS, ("X-Kept", "k")))
        proxy: ProxyUnderTest = await make_proxy(str(server.make_url("")).rstrip("/"))
        direct_head, direct_body = await _raw_get(str(server.make_url("")), "/v1/models")
        head, body = await _raw_get(str(proxy.client.make_url("")), "/v1/models")
        ids = [h for h in head if h.lower().startswith(REQUEST_ID_HEADER.lower().encode())]
        assert len(ids) == 1
        assert [h for h in head if h not in ids] == direct_head
        assert body == direct_body == BODY
