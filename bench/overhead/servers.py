"""The server roles of ``bench/relay_overhead.py --role``, each in a process of its own: the
fast fake llama-server and the bare aiohttp relay (a reference, not a product). Each prints
``PORT n`` once it listens and runs until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from bench.overhead.procs import HOST

HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer"}
    | {"upgrade", "proxy-connection"}
)


async def serve_app(app: Any) -> None:
    """Serve the aiohttp ``app`` on a free loopback port, announce it, run until stopped."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, HOST, 0, backlog=1024).start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def run_upstream() -> None:
    """``tests.fakes.FakeUpstream`` with the ``llama_chat`` script, the fake the relay tests
    use: each SSE event its own write, back to back or ``bench_interval_ms`` apart; like
    llama-server it closes the connection after each stream (with ``Connection: close``).
    ``seen`` is not kept: a run sends tens of thousands of requests."""
    from tests.fakes import FakeUpstream, llama_chat

    asyncio.run(serve_app(FakeUpstream(llama_chat(), keep_seen=False).app))


def run_bare_relay(upstream: str) -> None:
    """The proxy's relay loop (``readany`` -> ``write``) in aiohttp and nothing else: no
    tracker, no timeouts, no record, no log line. Like the proxy it pools upstream
    connections for plain requests and opens a fresh one per stream."""
    import aiohttp
    from aiohttp import web

    async def main() -> None:
        pooled = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True), auto_decompress=False
        )

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            async with (fresh if b'"stream":true' in body else pooled).request(
                request.method,
                upstream + request.raw_path,
                data=body or None,
                headers={k: v for k, v in request.headers.items() if k.lower() not in HOP},
                skip_auto_headers=("User-Agent", "Accept", "Content-Type"),
            ) as up:
                resp = web.StreamResponse(
                    status=up.status,
                    headers={k: v for k, v in up.headers.items() if k.lower() not in HOP},
                )
                if up.content_length is not None:
                    resp.content_length = up.content_length
                await resp.prepare(request)
                read = up.content.readany
                while chunk := await read():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        await serve_app(app)
        await pooled.close()
        await fresh.close()

    asyncio.run(main())
