"""Reference path ``lean-relay``: the bare relay's aiohttp server with a minimal HTTP/1.1
upstream client on an asyncio protocol and httptools' parser instead of
``aiohttp.ClientSession``. It splits the bare relay's cost into aiohttp's client and server.
Imported only in its own process (httptools is optional, not a project dependency)."""

from __future__ import annotations

import asyncio
from typing import Any

import httptools  # type: ignore[import-untyped,import-not-found,unused-ignore]
from aiohttp import web

from bench.overhead.serving import HOP, relay_app, serve_app

_HOP_BYTES = frozenset(h.encode() for h in HOP)


class UpstreamConnection(asyncio.Protocol):
    """One upstream HTTP/1.1 connection: the response head as a future, the body chunks
    queued as parsed (``b""`` ends the body)."""

    def __init__(self) -> None:
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self.reset()

    def reset(self) -> None:
        """Ready for the next response on this connection."""
        self.parser: Any = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.body: asyncio.Queue[bytes] = asyncio.Queue()
        self.complete = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status: int = self.parser.get_status_code()
        self.keep_alive: bool = self.parser.should_keep_alive()
        self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body.put_nowait(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.body.put_nowait(b"")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.head.done():
            self.head.set_exception(ConnectionError("upstream closed"))
        if not self.complete:
            self.body.put_nowait(b"")

    def reusable(self) -> bool:
        """True when the response ended cleanly and the upstream keeps the connection."""
        return self.keep_alive and self.complete and not self.closed


def request_head(request: web.Request, host: str, port: str, body: bytes) -> bytes:
    """The upstream request line and headers (hop-by-hop ones dropped), then ``body``."""
    head = [f"{request.method} {request.raw_path} HTTP/1.1\r\nHost: {host}:{port}\r\n"]
    head += [f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() not in HOP]
    head.append(f"Content-Length: {len(body)}\r\n\r\n")
    return "".join(head).encode("latin-1") + body


def response_for(conn: UpstreamConnection) -> web.StreamResponse:
    """The client's response: the upstream's status and end-to-end headers, its length."""
    resp = web.StreamResponse(
        status=conn.status,
        headers={
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in conn.headers
            if k.lower() not in _HOP_BYTES
        },
    )
    for k, v in conn.headers:
        if k.lower() == b"content-length":
            resp.content_length = int(v)
    return resp


class LeanRelay:
    """The relay: idle connections reused for plain requests, a fresh one per stream (like
    the proxy). No timeouts, no error handling worth the name, no analysis."""

    def __init__(self, upstream: str) -> None:
        self.host, _, self.port = upstream.removeprefix("http://").partition(":")
        self.idle: list[UpstreamConnection] = []

    async def connection(self, fresh: bool) -> UpstreamConnection:
        """An idle open connection (unless ``fresh``), else a new one."""
        while self.idle and not fresh:
            conn = self.idle.pop()
            if not conn.closed:
                conn.reset()
                return conn
        loop = asyncio.get_running_loop()
        _t, conn = await loop.create_connection(UpstreamConnection, self.host, int(self.port))
        return conn

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Relay one request: one write upstream, body chunks written as they are parsed."""
        body = await request.read()
        conn = await self.connection(fresh=b'"stream":true' in body)
        assert conn.transport is not None
        conn.transport.write(request_head(request, self.host, self.port, body))
        await conn.head
        resp = response_for(conn)
        await resp.prepare(request)
        get = conn.body.get
        while chunk := await get():
            await resp.write(chunk)
        await resp.write_eof()
        if conn.reusable():
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        return resp


def run_lean_relay(upstream: str, port: int) -> None:
    """The bare relay's aiohttp server, but the upstream leg is a minimal HTTP/1.1 client on
    an asyncio protocol with httptools' parser instead of ``aiohttp.ClientSession``: one
    ``write`` of the request, body chunks queued as parsed. Same connection policy (idle
    connections reused for plain requests, a fresh one per stream). No timeouts, no error
    handling worth the name, no analysis: not a product, a measurement of how much of the
    bare relay's cost is aiohttp's client and how much its server."""

    async def main() -> None:
        await serve_app(relay_app(LeanRelay(upstream).handle), port)

    asyncio.run(main())
