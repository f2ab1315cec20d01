"""A 204 that says ``chunked`` and sends a terminator: the stray bytes are dropped before
aiohttp's parser, the 204 reaches the agent, and nothing else changes (issue 14, point 0).

The raw upstream writes exactly the bytes llama-server's ``/cors-proxy`` wrote (llama.cpp
issue 26598): a 204 head with ``Transfer-Encoding: chunked``, then ``0\\r\\n\\r\\n``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.bodyless import StrayTerminator
from tests.conftest import ProxyFactory

HEAD_204 = (
    b"HTTP/1.1 204 No Content\r\nAccess-Control-Allow-Origin: *\r\n"
    b"Transfer-Encoding: chunked\r\nServer: llama.cpp\r\n\r\n"
)
STRAY = b"0\r\n\r\n"
HEAD_200 = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
BODY_200 = b"5\r\nhello\r\n0\r\n\r\n"


def _through(guard: StrayTerminator, chunks: list[bytes]) -> bytes:
    return b"".join(guard.feed(c) for c in chunks)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


class TestStrayTerminator:
    @given(st.lists(st.integers(min_value=0, max_value=200), max_size=6))
    def test_the_stray_terminator_is_dropped_however_the_bytes_are_cut(
        self, cuts: list[int]
    ) -> None:
        """A 204 head declaring chunked, then 0\\r\\n\\r\\n: the parser gets the head alone,
        whatever the TCP segments were, and the drop is counted."""
        guard = StrayTerminator()
        assert _through(guard, _split(HEAD_204 + STRAY, cuts)) == HEAD_204
        assert guard.dropped == 1

    @given(st.lists(st.integers(min_value=0, max_value=200), max_size=6))
    def test_a_response_with_a_body_passes_unchanged(self, cuts: list[int]) -> None:
        """A 200 with a chunked body, its own terminator included, passes byte for byte."""
        guard = StrayTerminator()
        assert _through(guard, _split(HEAD_200 + BODY_200, cuts)) == HEAD_200 + BODY_200
        assert guard.dropped == 0

    @given(
        st.lists(st.integers(min_value=0, max_value=200), max_size=6),
        st.sampled_from([HEAD_204 + STRAY, HEAD_200 + BODY_200]),
        st.sampled_from([HEAD_204 + STRAY, HEAD_200 + BODY_200]),
    )
    def test_skipping_feed_while_in_body_changes_nothing(
        self, cuts: list[int], first: bytes, second: bytes
    ) -> None:
        """The upstream handler skips feed() while ``in_body`` is set: over two responses
        (reset between them), however cut, the bytes and the drops are those of feeding
        every chunk."""
        fed, skipping = StrayTerminator(), StrayTerminator()
        out_fed, out_skipping = b"", b""
        for response in (first, second):
            fed.reset()
            skipping.reset()
            for chunk in _split(response, cuts):
                out_fed += fed.feed(chunk)
                out_skipping += chunk if skipping.in_body else skipping.feed(chunk)
        assert out_skipping == out_fed
        assert skipping.dropped == fed.dropped

    @pytest.mark.parametrize(
        ("head", "at_once"),
        [
            (b"HTTP/1.1 200 OK\r\n", True),
            (b"HTTP/1.1 500\r\n", True),
            (b"HTTP/1.0 302 Found\r\n", True),
            (b"HTTP/1.1 204 No Content\r\n", False),
            (b"HTTP/1.1 304 Not Modified\r\n", False),
            (b"HTTP/1.1 100 Continue\r\n", False),
            (b"HTTP/1.1 2000 Odd\r\n", False),
            (b"HTTP/1.1 20", False),
        ],
    )
    def test_a_status_line_that_cannot_be_bodyless_ends_the_scan_at_once(
        self, head: bytes, at_once: bool
    ) -> None:
        """A first read that begins with a whole status line other than 1xx, 204 or 304
        passes as it is and puts the filter in the body at once (nothing could be dropped
        after such a head); any other begins the scan of the head."""
        guard = StrayTerminator()
        assert guard.feed(head) is head  # the head is not whole yet
        assert guard.in_body is at_once

    def test_a_bodyless_response_without_chunked_passes(self) -> None:
        """A 204 that does not claim chunked framing is left alone (nothing to drop)."""
        guard = StrayTerminator()
        head = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
        assert guard.feed(head) == head and guard.dropped == 0

    def test_bytes_that_are_not_a_terminator_are_kept(self) -> None:
        """After a bodyless chunked head, bytes that turn out not to be the terminator (here
        held while they could still be one) all reach the parser."""
        guard = StrayTerminator()
        assert guard.feed(HEAD_204 + b"0\r") == HEAD_204
        assert guard.feed(b"X") == b"0\rX"
        assert guard.dropped == 0

    def test_each_request_scans_a_new_head(self) -> None:
        """On a reused connection, reset() makes the next response's head scanned again: a
        200 after a 204 passes whole, and a second 204 loses its stray terminator too."""
        guard = StrayTerminator()
        assert guard.feed(HEAD_204 + STRAY) == HEAD_204
        guard.reset()
        assert guard.feed(HEAD_200 + BODY_200) == HEAD_200 + BODY_200
        guard.reset()
        assert guard.feed(HEAD_204 + STRAY) == HEAD_204
        assert guard.dropped == 2

    def test_a_304_is_bodyless_too(self) -> None:
        """RFC 9112 6.3: a 304 ends at its head like a 204."""
        guard = StrayTerminator()
        head = b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"
        assert guard.feed(head + STRAY) == head

    def test_an_informational_head_is_followed_by_the_final_one(self) -> None:
        """A 100 Continue head is passed, and the 204 after it still loses its stray
        terminator."""
        guard = StrayTerminator()
        cont = b"HTTP/1.1 100 Continue\r\n\r\n"
        assert guard.feed(cont + HEAD_204 + STRAY) == cont + HEAD_204

    def test_body_bytes_are_returned_as_the_same_object(self) -> None:
        """Once the head is past, a body chunk is handed on as it came (no copy)."""
        guard = StrayTerminator()
        guard.feed(HEAD_200)
        chunk = b"data: {}\n\n" * 10
        assert guard.feed(chunk) is chunk


@pytest.fixture
async def raw_upstream() -> AsyncIterator[str]:
    """An upstream that answers every request with exactly llama-server's /cors-proxy bytes
    (head and stray terminator in one write), keeping the connection open."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(HEAD_204 + STRAY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


async def test_cors_proxy_204_is_relayed_as_the_204_it_is(
    raw_upstream: str, make_proxy: ProxyFactory
) -> None:
    """Twenty POST /cors-proxy through the proxy, on the upstream's reused connections: each
    is a 204 with an empty body and the upstream's headers, recorded as completed (aiohttp
    alone answered 502 "Bad status line")."""
    proxy = await make_proxy(raw_upstream)
    for _ in range(20):
        resp = await proxy.client.post("/cors-proxy", data=b'{"url": "http://x"}')
        assert resp.status == 204
        assert await resp.read() == b""
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
    deadline = asyncio.get_running_loop().time() + 5
    while len(proxy.captured.records) < 20:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert {(r.status, str(r.outcome)) for r in proxy.captured.records} == {(204, "completed")}
