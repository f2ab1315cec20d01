"""The admin listener on a thread of its own, so the proxy's pages answer under load.

The relay's event loop, with 200 streams in flight on two cores, queues any request behind
a loop's worth of stream chunks: a trivial 404 waited about 50 ms there, whatever the
handler did. The admin application (:func:`proxy.serve.app.build_admin_app`) therefore runs
on its own event loop in its own thread, as Envoy's admin endpoint runs on its main thread
apart from the workers: a ``/stats`` read waits only for the GIL, which the relay's loop
gives up at every poll of its sockets.

The pages read the relaying application's state (the statistics, the accounting, the
metrics) while that loop changes it. The record sinks change it under the application's
:data:`~proxy.serve.keys.STATE_LOCK`, and the pages read it under the same lock
(:mod:`proxy.serve.handlers`), so a read sees every record or none of it.

:class:`AdminThread` is started and stopped from the relaying loop: its start raises the
bind's ``OSError`` there (a port in use fails the proxy's start), and its stop cleans the
admin runner up on its own loop, then joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from aiohttp import web

__all__ = ["AdminThread"]


class AdminThread:
    """Serves ``admin`` on ``host:port`` from a thread with its own event loop."""

    def __init__(self, admin: web.Application, host: str, port: int) -> None:
        self._admin = admin
        self._host, self._port = host, port
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="timing-proxy-admin", daemon=True)

    async def start(self) -> None:
        """Start the thread; returns once the admin socket listens, or raises why it could
        not (the bind's ``OSError``), with the thread already gone."""
        self._thread.start()
        try:
            await asyncio.wrap_future(self._started)
        except BaseException:
            await self._ended()
            raise

    async def stop(self) -> None:
        """Stop serving: the admin runner is cleaned up on its own loop, the thread ends."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not self._stopped.done():
            loop.call_soon_threadsafe(stop.set)
        await self._ended()

    async def _ended(self) -> None:
        """Wait for the thread's loop to close, then for the thread (only its return is
        left by then, so the join is immediate)."""
        await asyncio.wrap_future(self._stopped)
        self._thread.join()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve(loop))
        except BaseException as exc:  # the start's failure, told to start()
            if not self._started.done():
                self._started.set_exception(exc)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._stopped.set_result(None)

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(self._admin, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
            self._loop = loop
            self._started.set_result(None)
            await self._stop.wait()
        finally:
            await runner.cleanup()
