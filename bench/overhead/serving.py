"""What every server process of the benchmark shares: tell the parent its port, run until
SIGTERM/SIGINT; the catch-all app and the hop-by-hop headers of the aiohttp relays."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from bench.overhead.constants import HOST

HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    }
)


def announce(port: int) -> None:
    """Tell the parent (``processes.start_role``) the port: ``PORT n`` on stdout."""
    print(f"PORT {port}", flush=True)


async def until_stopped() -> None:
    """Return when the process gets SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve_app(app: Any, port: int) -> None:
    """Serve the aiohttp ``app`` on HOST:port (0: any), announce the port, and run until
    SIGTERM/SIGINT."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    announce(runner.addresses[0][1])
    await until_stopped()
    await runner.cleanup()


def relay_app(handle: Callable[[Any], Awaitable[Any]]) -> Any:
    """An aiohttp app sending every method and path to ``handle``."""
    from aiohttp import web

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app
