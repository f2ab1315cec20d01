"""Application wiring: the upstream session, the relay, the record sinks and the routes.

Two applications, two listeners, like Envoy's admin port: the agent's (``[server]``) relays
every method and path to llama-server, its ``/metrics`` included; the admin one
(``[admin] listen``) answers the proxy's own pages (``/stats``, ``/stats/records/{id}``,
``/metrics``, ``/dashboard``; :mod:`proxy.serve.handlers`) with the bearer token, from the
relaying application's state. :func:`run` serves both until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from proxy.config import Config, parse_labels, parse_listen
from proxy.core.roofline import Board
from proxy.core.stats import Stats
from proxy.core.timestamps import iso_utc
from proxy.serve.accounting import Accounting
from proxy.serve.admin import AdminThread
from proxy.serve.exposure import warn_at_start
from proxy.serve.handlers import admin_errors, admin_ready, auth_middleware, route, route_admin
from proxy.serve.keys import (
    ACCOUNTING,
    ADMIN_READY,
    ADMIN_SESSION,
    BACKGROUND,
    CONFIG,
    DASHBOARD,
    MAIN_APP,
    METRICS,
    MODEL_INFO,
    RELAY,
    SESSION,
    SETUP,
    SINKS,
    STATE_LOCK,
    STATS,
    STATS_DOCUMENT,
    STREAM_SESSION,
    TELEMETRY,
    RecordSink,
)
from proxy.serve.listener import listener_args
from proxy.serve.logs import get_logger, reopen_log_file
from proxy.serve.metrics import Metrics
from proxy.serve.model_info import ModelInfo
from proxy.serve.otel import OtelSpanCollector, otel_sink_for
from proxy.serve.relay import Relay, RelaySettings
from proxy.serve.setup_watch import SetupWatch
from proxy.serve.sinks import RecordSinks
from proxy.serve.stats_cache import StatsDocument
from proxy.serve.tasks import spawn
from proxy.serve.telemetry import telemetry_for
from proxy.serve.upstream import check_upstream, upstream_session

__all__ = [
    "ACCOUNTING",
    "CONFIG",
    "RECORD_GRACE_S",
    "RELAY",
    "SESSION",
    "SHUTDOWN_AFTER_DRAIN_S",
    "SINKS",
    "STATS",
    "PortInUse",
    "build_admin_app",
    "build_app",
    "run",
    "upstream_session",
]

Clock = Callable[[], float]

RECORD_GRACE_S = 1.0
"""After the shutdown drain, how long the records still being completed (their accounting
look-ups) may take before the look-ups are cancelled; the records are written all the same,
with the reason."""

SHUTDOWN_AFTER_DRAIN_S = 2.0
"""The proxy exits within ``[server] shutdown_drain_s`` plus this (:data:`RECORD_GRACE_S`,
then closing the sessions and the admin listener), plus ``[otel] export_timeout_s`` when
spans are exported. A supervisor's grace period (compose's ``stop_grace_period``) must be
longer than the sum."""


class PortInUse(OSError):
    """A listener's address is held by another socket: the bind's error (``errno``
    ``EADDRINUSE`` and its message), and which listener failed, named by the config section
    that sets its address: ``server`` (the agent's) or ``admin`` (the pages')."""

    def __init__(self, cause: OSError, listener: str) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.listener = listener


def _in_use(exc: OSError) -> bool:
    return exc.errno == errno.EADDRINUSE and not isinstance(exc, PortInUse)


def build_app(config: Config, *, clock: Clock = time.perf_counter) -> web.Application:
    """The proxy application for ``config``."""
    app = web.Application(handler_args=listener_args(config))
    stats = Stats(since=iso_utc(), recent=config.stats.recent, window=config.stats.window)
    metrics = Metrics(parse_labels(config.fleet.labels))
    model_info = ModelInfo(
        config.upstream.url, Board.from_config(config.board), api_key=config.upstream.api_key
    )
    lock = app[STATE_LOCK] = threading.RLock()
    records = RecordSinks(stats, metrics, model_info, get_logger(), lock)
    setup = app[SETUP] = SetupWatch(
        config.upstream.url, get_logger(), api_key=config.upstream.api_key
    )
    records.sinks.append(setup.sink)
    app[CONFIG] = config
    app[STATS] = stats
    app[STATS_DOCUMENT] = StatsDocument(stats)
    app[METRICS] = metrics
    app[MODEL_INFO] = model_info
    app[SINKS] = records.sinks
    app[BACKGROUND] = set()
    app[DASHBOARD] = (resources.files("proxy.serve") / "static" / "dashboard.html").read_bytes()
    app.cleanup_ctx.append(_upstream_context(records, clock))
    app.on_shutdown.append(_stop_relaying)
    route(app)
    return app


def build_admin_app(app: web.Application) -> web.Application:
    """The admin listener's application: the proxy's pages over ``app``'s state."""
    middlewares = [admin_errors, auth_middleware(app[CONFIG].admin.auth_token)]
    ready = app.get(ADMIN_READY)
    if ready is not None:  # served by run(): the pages wait for the agent's listener
        middlewares.insert(0, admin_ready(ready))
    admin = web.Application(middlewares=middlewares)
    admin[MAIN_APP] = app
    admin.cleanup_ctx.append(_admin_session)
    route_admin(admin)
    return admin


async def _admin_session(admin: web.Application) -> AsyncIterator[None]:
    """The admin application's own upstream session, on the loop that serves it."""
    session = admin[ADMIN_SESSION] = upstream_session(admin[MAIN_APP][CONFIG])
    yield
    await session.close()


def _relay_settings(config: Config) -> RelaySettings:
    return RelaySettings(
        upstream=config.upstream.url,
        max_body_bytes=config.server.max_body_bytes,
        max_event_bytes=config.upstream.max_event_bytes,
        header_timeout_s=config.upstream.header_timeout_s,
        idle_timeout_s=config.upstream.idle_timeout_s,
        write_timeout_s=config.client.write_timeout_s,
        annotate=config.annotate,
        read_timeout_s=config.client.read_timeout_s,
        max_header_bytes=config.client.max_header_bytes,
    )


async def _start_accounting(
    config: Config, sinks: list[RecordSink], model_info: ModelInfo, setup: SetupWatch
) -> Accounting | None:
    """The tool-schema accounting when it is on (its rate learning the first sink); the
    served model's context size, once known, tells a context shift, and its slot count a
    busy slot."""
    if not config.accounting.enabled:
        return None
    accounting = Accounting(
        config.upstream.url,
        timeout_s=config.accounting.lookup_timeout_s,
        cache_entries=config.accounting.cache_entries,
        on_event=get_logger().info,
        api_key=config.upstream.api_key,
        attribution=config.accounting.attribution,
        attribution_history=config.accounting.attribution_history,
        attribution_bytes=int(config.accounting.attribution_cache_mb * (1 << 20)),
        schema_entries=config.accounting.schema_entries,
        show_diff_text=config.privacy.show_diff_text,
        raw_conversation_ids=config.privacy.raw_conversation_ids,
        conversation_header=config.accounting.conversation_header,
        context_size=lambda model: meta.n_ctx if (meta := model_info.meta_of(model)) else None,
        slots=setup.slots_of,
    )
    await accounting.start()
    sinks.insert(0, accounting.learn_rate)
    return accounting


def _upstream_context(
    on_record: RecordSinks, clock: Clock
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The cleanup context that opens the upstream sessions and the relay, and at cleanup
    lets records in completion finish before closing them."""

    async def upstream(app: web.Application) -> AsyncIterator[None]:
        config = app[CONFIG]
        session = app[SESSION] = upstream_session(config)
        stream_session = app[STREAM_SESSION] = upstream_session(config, pooled=False)
        accounting = app[ACCOUNTING] = await _start_accounting(
            config, app[SINKS], app[MODEL_INFO], app[SETUP]
        )
        telemetry = app[TELEMETRY] = telemetry_for(
            config, config.upstream.url, clock=clock, on_event=get_logger().warning
        )
        if telemetry is not None:
            await telemetry.start()
        otel = otel_sink_for(config)
        if otel is not None:  # spans of finished records, exported by the SDK's own thread
            app[SINKS].append(otel)
            app[METRICS].registry.register(OtelSpanCollector(otel))
        relay = app[RELAY] = Relay(
            session,
            _relay_settings(config),
            on_record,
            clock=clock,
            accounting=accounting,
            stream_session=stream_session,
            telemetry=telemetry,
        )
        app[MODEL_INFO].attach(session)
        app[SETUP].attach(session)
        yield
        # look-ups still running get what is left of the drain (at least RECORD_GRACE_S),
        # then are cancelled: their records are written all the same, with the reason,
        # before the sessions close
        await relay.drain(within_s=max(relay.drain_left_s(), RECORD_GRACE_S))
        if accounting is not None:
            await accounting.close()
        await relay.drain()
        if otel is not None:
            await otel.aclose()
        if telemetry is not None:
            await telemetry.close()
        await _cancel(app[BACKGROUND])
        await app[MODEL_INFO].close()
        await app[SETUP].close()
        await session.close()
        await stream_session.close()

    return upstream


async def _cancel(tasks: set[asyncio.Future[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _stop_relaying(app: web.Application) -> None:
    app[RELAY].stop(app[CONFIG].server.shutdown_drain_s)


async def _reopen_log_on_hup(app: web.Application) -> None:
    """``SIGHUP`` (logrotate's ``postrotate kill -HUP``) reopens the log file at its path,
    instead of ending the process."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reopen_log_file)


async def _freeze_gc(app: web.Application) -> None:
    # Everything alive now (modules, the app) lives as long as the process: out of the
    # collector's generations, full collections stop walking it.
    gc.collect()
    gc.freeze()


class _Announcer:
    """``proxy_started`` once the socket listens (then the warnings of what the config
    exposes, :mod:`proxy.serve.exposure`, and the upstream check, in the background), and
    ``proxy_stopped`` at cleanup only if it had started."""

    def __init__(self, app: web.Application, log: Any) -> None:
        self._app = app
        self._log = log
        self.listening = False

    def started(self, *_banner: Any) -> None:
        """``run_app``'s ``print``: called once every site is listening."""
        config = self._app[CONFIG]
        self._app[ADMIN_READY].set()  # the admin pages answer from now on
        # raises when the log file cannot take its first line (the CLI says so in one line)
        self._log.info(
            "proxy_started",
            listen=f"{config.server.host}:{config.server.port}",
            admin=config.admin.listen,
            upstream=config.upstream.url,
        )
        self.listening = True
        warn_at_start(config, self._log)
        _ = spawn(self._check(), self._app[BACKGROUND])

    async def _check(self) -> None:
        """The upstream's ``/health``, then its template's tool support (``/props``): a
        template that drops tools is said once at start, before any request."""
        if await check_upstream(self._app[SESSION], self._app[CONFIG], self._log):
            await self._app[SETUP].probe()

    async def stopped(self, app: web.Application) -> None:
        """``on_cleanup``: the last line of a run that listened."""
        if self.listening:
            self._log.info("proxy_stopped", requests=app[STATS].requests)


def _admin_listener(app: web.Application) -> AsyncIterator[None]:
    """The cleanup context that serves the admin application on ``[admin] listen``, from
    its own thread (:mod:`proxy.serve.admin`), while the relaying one runs (started first,
    stopped last: ``/stats`` answers through the drain)."""

    async def serve() -> AsyncIterator[None]:
        host, port = parse_listen(app[CONFIG].admin.listen)
        admin = AdminThread(build_admin_app(app), host, port)
        try:
            await admin.start()
        except OSError as exc:
            if _in_use(exc):
                raise PortInUse(exc, "admin") from exc
            raise
        try:
            yield
        finally:
            await admin.stop()

    return serve()


def run(config: Config) -> None:
    """Serve until SIGINT/SIGTERM; streams in flight get ``shutdown_drain_s`` to finish.
    SIGHUP reopens the log file.

    ``proxy_started`` is logged once both sockets listen. When one cannot be bound (the
    port is in use) the ``OSError`` propagates from here, after the app was cleaned up, with
    nothing logged before it: a :class:`PortInUse` naming the listener when its port is
    held by another socket.
    """
    app = build_app(config)
    app[ADMIN_READY] = threading.Event()
    announcer = _Announcer(app, get_logger())
    # first: a port in use then fails the start before any session is open (run_app does
    # not clean up after a failed setup), and the pages stay up through the drain
    app.cleanup_ctx.insert(0, _admin_listener)
    app.on_startup.append(_freeze_gc)
    app.on_startup.append(_reopen_log_on_hup)
    app.on_cleanup.append(announcer.stopped)
    kwargs: dict[str, Any] = {
        "host": config.server.host,
        "port": config.server.port,
        "handler_cancellation": True,  # a client hang-up must cancel the upstream request
        # the relay cuts the streams at the drain (Relay.stop); aiohttp's timeout, applied
        # after it, is only the backstop (cutting at the same instant races aiohttp)
        "shutdown_timeout": config.server.shutdown_drain_s + SHUTDOWN_AFTER_DRAIN_S,
        "access_log": None,
        # run_app calls ``print`` after every site has started: the only hook after binding
        "print": announcer.started,
    }
    try:
        web.run_app(app, **kwargs)
    except OSError as exc:
        if _in_use(exc):  # the admin listener's is one already: this is the agent's bind
            raise PortInUse(exc, "server") from exc
        raise
