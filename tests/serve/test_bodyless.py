"""A 204 or 304 that says ``chunked`` and then sends the chunked terminator ``0\\r\\n\\r\\n``
(llama-server's ``POST /cors-proxy``, llama.cpp issue 26598): RFC 9112 section 6.3 ends such
a response at its header section, so the five bytes belong to no response. The proxy relays
the 204/304 as it is and closes that upstream connection instead of pooling it, so the stray
bytes can never be read as the answer to the next request.

The fake upstream is a raw asyncio server writing exactly those bytes, with the terminator as
a second write 5 ms after the head (as llama-server sends them) or in the same write; the
proxy drops the five bytes when they come in the head's read (aiohttp's parser would fail it).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
import trustme

from proxy.serve.upstream import UpstreamResponse
from tests.conftest import ProxyFactory, ProxyUnderTest

HEAD_204 = (
    b"HTTP/1.1 204 No Content\r\nAccess-Control-Allow-Origin: *\r\n"
    b"Transfer-Encoding: chunked\r\nServer: llama.cpp\r\n\r\n"
)
HEAD_304 = b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\nTransfer-Encoding: chunked\r\n\r\n'
STRAY = b"0\r\n\r\n"
PLAIN_204 = b"HTTP/1.1 204 No Content\r\nAccess-Control-Allow-Origin: *\r\n\r\n"
CHUNKED_200 = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\n{}\r\n0\r\n\r\n"
)
LENGTH_200 = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
    len(HEAD_204 + STRAY),
    HEAD_204 + STRAY,
)
"""A 200 whose body is a chunked 204 and its terminator, byte for byte."""
BODY = b'{"url": "http://x"}'


@dataclass
class RawUpstream:
    """A raw HTTP/1.1 upstream: ``answer(n)`` gives the writes (bytes, then a pause in
    seconds before the next) for the n-th request; it counts connections and requests."""

    answer: list[tuple[bytes, float]] = field(default_factory=list)
    url: str = ""
    connections: int = 0
    requests: list[int] = field(default_factory=list)
    """Requests served on each connection, in the order the connections opened."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        self.requests.append(0)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                self.requests[index] += 1
                for data, pause in self.answer:
                    writer.write(data)
                    await writer.drain()
                    if pause:
                        await asyncio.sleep(pause)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[RawUpstream]:
    """A started :class:`RawUpstream` (set its ``answer`` before the first request)."""
    upstream = RawUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield upstream


async def _records(proxy: ProxyUnderTest, count: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while len(proxy.captured.records) < count:
        assert loop.time() < deadline, f"{len(proxy.captured.records)} of {count} records"
        await asyncio.sleep(0.01)


async def _post_many(proxy: ProxyUnderTest, count: int) -> list[tuple[int, bytes, str | None]]:
    """``count`` requests one after the other, each sent as soon as the last was read."""
    seen = []
    for _ in range(count):
        resp = await proxy.client.post("/cors-proxy", data=BODY)
        seen.append(
            (resp.status, await resp.read(), resp.headers.get("Access-Control-Allow-Origin"))
        )
    return seen


async def test_terminator_as_a_second_write_twenty_of_twenty(
    raw: RawUpstream, make_proxy: ProxyFactory
) -> None:
    """The 204's head, then ``0\\r\\n\\r\\n`` 5 ms later, twenty times in a row: each is a
    204 with an empty body and the upstream's headers, recorded completed, and each came on
    a connection of its own (the one that carried a chunked 204 is closed, never pooled)."""
    raw.answer = [(HEAD_204, 0.005), (STRAY, 0.0)]
    proxy = await make_proxy(raw.url)
    assert await _post_many(proxy, 20) == [(204, b"", "*")] * 20
    await _records(proxy, 20)
    assert {(r.status, str(r.outcome)) for r in proxy.captured.records} == {(204, "completed")}
    assert raw.connections == 20 and raw.requests == [1] * 20


async def test_terminator_in_the_same_write_twenty_of_twenty(
    raw: RawUpstream, make_proxy: ProxyFactory
) -> None:
    """Head and terminator in one write, twenty times: the five bytes after the 204's head
    are dropped before aiohttp's parser reads them, so each is a 204 with an empty body and
    the upstream's headers, recorded completed, each on a connection of its own."""
    raw.answer = [(HEAD_204 + STRAY, 0.0)]
    proxy = await make_proxy(raw.url)
    assert await _post_many(proxy, 20) == [(204, b"", "*")] * 20
    await _records(proxy, 20)
    assert {(r.status, str(r.outcome)) for r in proxy.captured.records} == {(204, "completed")}
    assert raw.connections == 20 and raw.requests == [1] * 20


async def test_head_in_two_reads_with_the_terminator_in_the_second(
    raw: RawUpstream, make_proxy: ProxyFactory
) -> None:
    """The 204's head cut in two writes 5 ms apart, the terminator after the second part in
    the same write: the head is found across the reads and the terminator dropped."""
    raw.answer = [(HEAD_204[:30], 0.005), (HEAD_204[30:] + STRAY, 0.0)]
    proxy = await make_proxy(raw.url)
    assert await _post_many(proxy, 5) == [(204, b"", "*")] * 5
    assert raw.connections == 5


async def test_a_304_and_its_terminator_in_one_write(
    raw: RawUpstream, make_proxy: ProxyFactory
) -> None:
    """A chunked 304 with its terminator in the same write: a 304 with the upstream's
    headers, its connection closed."""
    raw.answer = [(HEAD_304 + STRAY, 0.0)]
    proxy = await make_proxy(raw.url)
    for _ in range(3):
        resp = await proxy.client.get("/cached")
        assert (resp.status, await resp.read(), resp.headers.get("ETag")) == (304, b"", '"x"')
    assert raw.connections == 3


async def test_a_chunked_304_closes_its_connection_too(
    raw: RawUpstream, make_proxy: ProxyFactory
) -> None:
    """A 304 that says chunked, its terminator 5 ms later: relayed as a 304 with the
    upstream's headers, and its connection closed (RFC 9112 6.3: a 304 ends at its head)."""
    raw.answer = [(HEAD_304, 0.005), (STRAY, 0.0)]
    proxy = await make_proxy(raw.url)
    for _ in range(5):
        resp = await proxy.client.get("/cached")
        assert (resp.status, await resp.read(), resp.headers.get("ETag")) == (304, b"", '"x"')
    assert raw.connections == 5


@pytest.mark.parametrize(
    "answer", [PLAIN_204, CHUNKED_200, LENGTH_200], ids=["plain-204", "chunked-200", "length-200"]
)
async def test_other_answers_keep_their_pooled_connection(
    raw: RawUpstream, make_proxy: ProxyFactory, answer: bytes
) -> None:
    """A 204 that declares no body framing, a 200 with a chunked body, or a 200 whose body is
    a chunked 204 and its terminator, is relayed whole and its connection pooled as ever:
    twenty requests, one upstream connection (nothing is dropped, nothing closed)."""
    raw.answer = [(answer, 0.0)]
    proxy = await make_proxy(raw.url)
    body = {PLAIN_204: b"", CHUNKED_200: b"{}", LENGTH_200: HEAD_204 + STRAY}[answer]
    for _ in range(20):
        resp = await proxy.client.post("/cors-proxy", data=BODY)
        assert resp.status == (204 if answer is PLAIN_204 else 200)
        assert await resp.read() == body
    assert raw.connections == 1 and raw.requests == [20]


async def test_a_body_read_that_starts_like_a_204_is_relayed_whole(
    raw: RawUpstream, make_proxy: ProxyFactory
) -> None:
    """Only a response's head is watched: a 200 whose body, a read of its own 5 ms after
    the head, is a chunked 204 and its terminator reaches the agent whole, pooled."""
    body = HEAD_204 + STRAY
    raw.answer = [(LENGTH_200[: -len(body)], 0.005), (body, 0.0)]
    proxy = await make_proxy(raw.url)
    for _ in range(5):
        resp = await proxy.client.post("/cors-proxy", data=BODY)
        assert (resp.status, await resp.read()) == (200, body)
    assert raw.connections == 1 and raw.requests == [5]


async def test_over_tls_the_terminator_is_dropped_and_the_connection_closed() -> None:
    """On a TLS connection (its transport another class) the upstream sessions' response
    class does the same: JSON replies share a connection, a chunked 204 with its terminator
    in the same write is a 204 and closes its own, the next request opens a new one."""
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    upstream = RawUpstream(answer=[(HEAD_204 + STRAY, 0.0)])
    json_reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0, ssl=server_tls)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    seen = []
    async with (
        server,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_tls), response_class=UpstreamResponse
        ) as session,
    ):
        for answer in [json_reply, json_reply, HEAD_204 + STRAY, json_reply, json_reply]:
            upstream.answer = [(answer, 0.0)]
            async with session.get(url + "/x") as resp:
                seen.append((resp.status, await resp.read()))
    assert seen == [(200, b"{}"), (200, b"{}"), (204, b""), (200, b"{}"), (200, b"{}")]
    assert upstream.requests == [3, 2]
