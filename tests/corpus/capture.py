"""A capturing HTTP relay on loopback, for recording the corpus (``tests/corpus/record.py``).

The clients under record talk to this relay as they would to llama-server; it saves each
request exactly as sent (method, path, the body's bytes as text, the headers that matter to
the proxy's attribution) and forwards it, streaming the answer back unchanged. It runs its
own event loop in a thread, so the clients may be synchronous or asynchronous.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["KEPT_HEADERS", "Captured", "Relay", "relays"]

KEPT_HEADERS = ("content-type", "x-conversation-id", "anthropic-version")
"""The request headers stored with each request: what the proxy or llama-server reads (the
SDKs' own telemetry headers and keys are not kept)."""

_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass
class Captured:
    """One request as the client sent it."""

    method: str
    path: str
    headers: dict[str, str]
    body: str
    via: str
    """``proxy``: replayed through the proxy; ``direct``: straight to llama-server (traffic
    the proxy never sees)."""

    def to_json(self) -> dict[str, Any]:
        """The corpus entry."""
        return {
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "via": self.via,
        }


@dataclass
class Relay:
    """A relay's URL and what went through it (shared by the relays of one recording)."""

    url: str
    log: list[Captured] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _app(upstream: str, via: str, log: list[Captured]) -> web.Application:
    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        kept = {k: v for k, v in request.headers.items() if k.lower() in KEPT_HEADERS}
        log.append(Captured(request.method, request.path_qs, kept, body.decode(), via))
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            response = web.StreamResponse(status=answer.status)
            for k, v in answer.headers.items():
                if k.lower() not in _HOP and k.lower() != "content-encoding":
                    response.headers[k] = v
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def open_session(app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=600)
        app["session"] = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", relay)
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    return app


@contextmanager
def relays(upstream: str) -> Iterator[tuple[Relay, Relay]]:
    """Two relays to ``upstream`` sharing one log: the first marks its requests ``proxy``
    (the proxy will see them on replay), the second ``direct``."""
    log: list[Captured] = []
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []
    out: list[Relay] = []

    async def start() -> None:
        for via in ("proxy", "direct"):
            runner = web.AppRunner(_app(upstream, via, log))
            await runner.setup()
            port = _free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            out.append(Relay(f"http://127.0.0.1:{port}", log))

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    try:
        yield out[0], out[1]
    finally:

        async def stop() -> None:
            for runner in runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
