"""Application wiring: the upstream session, the relay, the record sinks and the routes.

Reserved paths (``/stats``; later ``/metrics`` and ``/dashboard``) are answered by the proxy;
every other method and path goes to the relay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from importlib import resources
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web

from proxy.config import Config
from proxy.core.record import Record
from proxy.core.request import RequestFacts
from proxy.core.roofline import Board, ModelMeta, record_roofline
from proxy.core.stats import Stats
from proxy.core.timestamps import iso_utc
from proxy.core.tracker import Observation
from proxy.serve.accounting import Accounting
from proxy.serve.logs import get_logger
from proxy.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from proxy.serve.metrics import Metrics
from proxy.serve.relay import Relay, RelaySettings, error_response
from proxy.serve.tasks import spawn

__all__ = ["RELAY", "SESSION", "STATS", "build_app", "run"]

SESSION = web.AppKey("session", aiohttp.ClientSession)
RELAY = web.AppKey("relay", Relay)
STATS = web.AppKey("stats", Stats)
CONFIG = web.AppKey("config", Config)
RecordSink = Callable[[Record, RequestFacts, Observation | None], None]
SINKS = web.AppKey("sinks", list[RecordSink])
ACCOUNTING: web.AppKey[Accounting | None] = web.AppKey("accounting")


def upstream_session(config: Config, *, pooled: bool = True) -> aiohttp.ClientSession:
    """A session for the upstream: no total deadline; pooled connections are closed before
    llama-server's 5 s idle close; ``pooled=False`` closes each connection after use."""
    up = config.upstream
    connector = (
        aiohttp.TCPConnector(limit=up.max_connections, keepalive_timeout=up.keepalive_timeout_s)
        if pooled
        else aiohttp.TCPConnector(limit=up.max_connections, force_close=True)
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=up.connect_timeout_s, sock_read=None
        ),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


RESERVED = frozenset({"/stats", "/metrics", "/dashboard"})
"""Paths the proxy answers itself (and ``/stats/records/{id}``); everything else is relayed."""


def _reserved(path: str) -> bool:
    return path in RESERVED or path.startswith("/stats/")


T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(token: str | None) -> Any:
    """Bearer-token check for the reserved paths (off when ``token`` is empty).

    The dashboard page may also be opened as ``/dashboard?token=...``; its fetches send the
    header. Relayed paths are never checked here: llama-server checks its own API key.
    """
    expected = f"Bearer {token}" if token else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is None or not _reserved(request.path):
            return await handler(request)
        given = request.headers.get("Authorization")
        if given is None and request.path == "/dashboard":
            given = f"Bearer {request.query.get('token', '')}"
        if given is not None and hmac.compare_digest(given.encode(), expected.encode()):
            return await handler(request)
        return error_response(
            401, "missing or wrong bearer token for " + request.path, "unauthorized"
        )

    return check


async def _in_steps(steps: Generator[None, None, T]) -> T:
    """Run a stepwise computation, letting the event loop run other tasks between steps."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


def build_app(config: Config, *, clock: Callable[[], float] = time.perf_counter) -> web.Application:
    """The proxy application for ``config``."""
    app = web.Application(
        handler_args={"max_field_size": 65536},
        middlewares=[auth_middleware(config.server.auth_token)],
    )
    app[CONFIG] = config
    stats = Stats(since=iso_utc(), recent=config.stats.recent, window=config.stats.window)
    app[STATS] = stats
    log = get_logger()

    def log_record(record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        log.info("request_completed", **record.to_dict())

    def count_record(record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        stats.add(record)

    metrics = Metrics()
    sinks: list[RecordSink] = [count_record, metrics.observe, log_record]
    app[SINKS] = sinks

    own_headers = (
        {"Authorization": f"Bearer {config.upstream.api_key}"} if config.upstream.api_key else {}
    )
    board = Board.from_config(config.board)
    model_meta: list[ModelMeta | None] = [None]
    last_meta_try = [float("-inf")]

    def roofline(record: Record) -> Record:
        meta = model_meta[0]
        if meta is None:
            now = time.monotonic()
            if now - last_meta_try[0] > 30.0 and SESSION in app:
                last_meta_try[0] = now
                _ = spawn(fetch_meta(app[SESSION]), background)
            return record
        fields = record_roofline(record, meta, board)
        return dataclasses.replace(
            record, decode_gbs=fields["decode_gbs"], roof_ratio=fields["roof_ratio"]
        )

    async def fetch_meta(session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(
                config.upstream.url + "/v1/models",
                headers=own_headers,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as resp:
                if resp.status == 200:
                    model_meta[0] = ModelMeta.from_models_json(orjson.loads(await resp.read()))
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            pass

    background: set[asyncio.Future[Any]] = set()

    def on_record(record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        if record.decode_tok_s is not None:
            record = roofline(record)
        for sink in sinks:
            try:
                sink(record, facts, obs)
            except Exception:  # a sink must never break the relay
                log.exception("record_sink_failed", sink=getattr(sink, "__name__", "?"))

    async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
        session = upstream_session(config)
        stream_session = upstream_session(config, pooled=False)
        app[SESSION] = session
        settings = RelaySettings(
            upstream=config.upstream.url,
            max_body_bytes=config.server.max_body_bytes,
            max_event_bytes=config.upstream.max_event_bytes,
            header_timeout_s=config.upstream.header_timeout_s,
            idle_timeout_s=config.upstream.idle_timeout_s,
            write_timeout_s=config.client.write_timeout_s,
        )
        accounting = None
        if config.accounting.enabled:
            accounting = Accounting(
                config.upstream.url,
                timeout_s=config.accounting.lookup_timeout_s,
                cache_entries=config.accounting.cache_entries,
                on_event=log.info,
                api_key=config.upstream.api_key,
            )
            await accounting.start()
            sinks.insert(0, accounting.learn_rate)
        app[ACCOUNTING] = accounting
        relay = app[RELAY] = Relay(
            session,
            settings,
            on_record,
            clock=clock,
            accounting=accounting,
            stream_session=stream_session,
        )
        yield
        await relay.drain()
        if accounting is not None:
            await accounting.close()
        await session.close()
        await stream_session.close()

    app.cleanup_ctx.append(upstream_ctx)

    async def on_shutdown(app: web.Application) -> None:
        app[RELAY].shutting_down = True

    app.on_shutdown.append(on_shutdown)

    # /stats sorts every window: with 10,000 records per kind that is 17 ms of CPU. The
    # document is built again only when a record has come in (the dashboard polls every
    # second, most often with nothing new), one field at a time with the event loop given
    # back in between, so streams in flight wait at most one sort (about 1 ms), and by one
    # task at a time (concurrent readers wait for it instead of sorting again).
    cached_stats: list[tuple[tuple[int, int], bytes]] = []
    building = asyncio.Lock()

    async def handle_stats(request: web.Request) -> web.Response:
        accounting = request.app[ACCOUNTING]

        def version() -> tuple[int, int]:
            return (stats.requests, len(accounting.per_tool) if accounting is not None else 0)

        async with building:
            if not cached_stats or cached_stats[0][0] != version():
                built_for = version()
                doc = await _in_steps(stats.snapshot_steps())
                doc["schemas"] = accounting.snapshot() if accounting is not None else None
                cached_stats[:] = [(built_for, orjson.dumps(doc))]
        return web.Response(body=cached_stats[0][1], content_type="application/json")

    async def handle_relay(request: web.Request) -> web.StreamResponse:
        return await request.app[RELAY].handle(request)

    dashboard = (resources.files("proxy.serve") / "static" / "dashboard.html").read_bytes()

    async def handle_dashboard(request: web.Request) -> web.Response:
        return web.Response(
            body=dashboard,
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-store"},
        )

    async def handle_metrics(request: web.Request) -> web.Response:
        upstream: bytes | None = None
        try:
            async with request.app[SESSION].get(
                config.upstream.url + "/metrics",
                headers=own_headers,
                timeout=aiohttp.ClientTimeout(total=2.0),
            ) as resp:
                if resp.status == 200:
                    upstream = await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            pass
        return web.Response(
            body=metrics.render(upstream), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def handle_record(request: web.Request) -> web.Response:
        record = stats.find(request.match_info["id"])
        if record is None:
            return error_response(404, "no recent record with that id", "not_found")
        return web.Response(body=orjson.dumps(record.to_dict()), content_type="application/json")

    app.router.add_get("/stats", handle_stats)
    app.router.add_get("/stats/records/{id}", handle_record)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/dashboard", handle_dashboard)
    app.router.add_route("*", "/{tail:.*}", handle_relay)
    return app


def run(config: Config) -> None:
    """Serve until SIGINT/SIGTERM; streams in flight get ``shutdown_drain_s`` to finish."""
    log = get_logger()
    app = build_app(config)

    async def started(app: web.Application) -> None:
        log.info(
            "proxy_started",
            listen=f"{config.server.host}:{config.server.port}",
            upstream=config.upstream.url,
        )
        # Everything alive now (modules, the app) lives as long as the process: out of the
        # collector's generations, full collections stop walking it (bench/README.md).
        gc.collect()
        gc.freeze()

    async def stopped(app: web.Application) -> None:
        log.info("proxy_stopped", requests=app[STATS].requests)

    app.on_startup.append(started)
    app.on_cleanup.append(stopped)
    kwargs: dict[str, Any] = {
        "host": config.server.host,
        "port": config.server.port,
        "handler_cancellation": True,  # a client hang-up must cancel the upstream request
        "shutdown_timeout": config.server.shutdown_drain_s,
        "access_log": None,
        "print": None,
    }
    web.run_app(app, **kwargs)
