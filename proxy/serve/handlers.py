"""The proxy's HTTP handlers: its own pages (``/stats``, ``/stats/records/{id}``,
``/metrics``, ``/dashboard``) on the admin listener, with its bearer-token check, and the
relay for every path of the agent's listener (``/metrics`` included: llama-server's own page
reaches the agent byte for byte). The admin application holds the relaying one under
``MAIN_APP`` and reads what it needs from its keys (:mod:`proxy.serve.keys`).
"""

from __future__ import annotations

import asyncio
import hmac
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web

from proxy.config import Config
from proxy.core.exposition import per_model_page
from proxy.serve.keys import (
    ACCOUNTING,
    ADMIN_SESSION,
    CONFIG,
    DASHBOARD,
    MAIN_APP,
    METRICS,
    RELAY,
    SETUP,
    STATE_LOCK,
    STATS,
    STATS_DOCUMENT,
    TELEMETRY,
)
from proxy.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from proxy.serve.relay import error_response
from proxy.serve.upstream import own_headers

__all__ = [
    "ADMIN_PATHS",
    "admin_errors",
    "admin_ready",
    "auth_middleware",
    "expect_relay",
    "handle_dashboard",
    "handle_metrics",
    "handle_record",
    "handle_relay",
    "handle_stats",
    "page_headers",
    "relay_unroutable",
    "route",
    "route_admin",
]

ADMIN_PATHS = frozenset({"/stats", "/metrics", "/dashboard"})
"""The admin listener's pages (and ``/stats/records/{id}``); the agent's listener relays all."""

UPSTREAM_METRICS_TIMEOUT_S = 2.0
READY_WAIT_S = 30.0
"""How long an admin page waits for the agent's listener at start before a 503."""
READ_ATTEMPTS = 3
"""Reads of the relay's state that another thread changed mid-read (``RuntimeError``:
a dict or deque changed size during iteration) are tried again this many times in all."""

T = TypeVar("T")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(token: str | None) -> Any:
    """Bearer-token check for every path of the admin listener (off when ``token`` is empty).

    The dashboard page may also be opened as ``/dashboard?token=...``; its fetches send the
    header. Relayed paths are never checked by the proxy: llama-server checks its own API key.
    """
    expected = f"Bearer {token}" if token else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is None:
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


def admin_ready(ready: threading.Event) -> Any:
    """The admin pages wait until ``ready`` is set (the agent's listener listens), so that
    a page that answers means the proxy relays; after :data:`READY_WAIT_S`, a 503."""

    @web.middleware
    async def wait(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not ready.is_set():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + READY_WAIT_S
            while not ready.is_set():  # only while the proxy starts
                if loop.time() > deadline:
                    return error_response(
                        503, "timing-proxy is starting: its relay is not listening yet", "starting"
                    )
                await asyncio.sleep(0.01)
        return await handler(request)

    return wait


@web.middleware
async def admin_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The admin listener's own 404 and 405 in OpenAI's error shape, like every answer the
    proxy gives by itself."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(404, f"no page {request.path} on the admin listener", "not_found")
    except web.HTTPMethodNotAllowed:
        return error_response(
            405, f"{request.method} {request.path}: the admin pages are GET", "method_not_allowed"
        )


def _main(request: web.Request) -> web.Application:
    """The relaying application whose state the admin pages show."""
    return request.app[MAIN_APP]


def _read(app: web.Application, read: Callable[[], T]) -> T:
    """``read()`` of the relaying application's state, under its state lock.

    The record sinks change the statistics and the metrics under the same lock; what the
    relay's loop changes outside it (the accounting's look-ups, the board sampler) is
    replaced whole or appended to, and an iteration that met such an append is read again.
    """
    lock = app[STATE_LOCK]
    for _ in range(READ_ATTEMPTS - 1):
        with lock:
            try:
                return read()
            except RuntimeError:
                continue
    with lock:  # the last attempt: its error is the reader's
        return read()


async def handle_stats(request: web.Request) -> web.Response:
    """``GET /stats``: the statistics document (see :mod:`proxy.serve.stats_cache`)."""
    app = _main(request)
    # ACCOUNTING and TELEMETRY are set once the upstream sessions open (just after the
    # admin listener starts)
    document = app[STATS_DOCUMENT]
    body = _read(
        app, lambda: document.build(app.get(ACCOUNTING), app.get(TELEMETRY), app.get(SETUP))
    )
    return web.Response(body=body, content_type="application/json")


async def handle_record(request: web.Request) -> web.Response:
    """``GET /stats/records/{id}``: one recent record, or 404."""
    app = _main(request)
    wanted = request.match_info["id"]
    record = _read(app, lambda: app[STATS].find(wanted))
    if record is None:
        return error_response(404, "no recent record with that id", "not_found")
    return web.Response(body=orjson.dumps(record.to_dict()), content_type="application/json")


async def _upstream_metrics(request: web.Request) -> bytes | None:
    """llama-server's own ``/metrics`` page, or ``None`` when it has none or does not answer.
    A router refuses ``/metrics`` without a model (400): its page is then each loaded
    model's, labelled with the model (:func:`proxy.core.exposition.per_model_page`)."""
    config = _main(request)[CONFIG]
    session = request.app.get(ADMIN_SESSION)
    if session is None or session.closed:  # starting, or closed at the end
        return None
    try:
        status, page = await _upstream_get(session, config, "/metrics")
        if status == 400:
            return await _router_metrics(session, config)
    except (aiohttp.ClientError, TimeoutError):
        return None
    return page if status == 200 else None


def page_headers(config: Config) -> dict[str, str]:
    """Headers of an admin page's requests to the upstream: the proxy's ``[upstream] api_key``
    only when the page was authenticated, which every page is when ``[admin] auth_token`` is
    set (the token check turned the others away). A page nobody authenticated never has the
    proxy's key sent for it: the upstream is asked without one."""
    return own_headers(config) if config.admin.auth_token else {}


async def _upstream_get(
    session: aiohttp.ClientSession, config: Config, path: str, params: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """One GET of the upstream for the admin pages: its status and body."""
    async with session.get(
        config.upstream.url + path,
        params=params,
        headers=page_headers(config),
        timeout=aiohttp.ClientTimeout(total=UPSTREAM_METRICS_TIMEOUT_S),
    ) as resp:
        return resp.status, await resp.read()


async def _router_metrics(session: aiohttp.ClientSession, config: Config) -> bytes | None:
    """A router's page: ``/metrics?model=NAME&autoload=false`` of each model ``/v1/models``
    lists as loaded (never loading one), merged; ``None`` when none answered."""
    status, body = await _upstream_get(session, config, "/v1/models")
    if status != 200:
        return None
    try:
        loaded = _loaded_models(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None
    answers = await asyncio.gather(
        *(
            _upstream_get(session, config, "/metrics", {"model": m, "autoload": "false"})
            for m in loaded
        ),
        return_exceptions=True,
    )
    pages = [
        (model, got[1])
        for model, got in zip(loaded, answers, strict=True)
        if isinstance(got, tuple) and got[0] == 200
    ]
    return per_model_page(pages) if pages else None


def _loaded_models(models: Any) -> list[str]:
    """The ids of the models a router's ``/v1/models`` lists as loaded."""
    entries = models.get("data") if isinstance(models, dict) else None
    out = []
    for entry in entries if isinstance(entries, list) else ():
        status = entry.get("status") if isinstance(entry, dict) else None
        name = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(status, dict) and status.get("value") == "loaded" and isinstance(name, str):
            out.append(name)
    return out


async def handle_metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the proxy's Prometheus page, with the upstream's appended."""
    app = _main(request)
    upstream = await _upstream_metrics(request)

    def render() -> bytes:
        telemetry = app.get(TELEMETRY)
        board = telemetry.gauges() if telemetry is not None else None
        return app[METRICS].render(upstream, board)

    return web.Response(body=_read(app, render), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def handle_dashboard(request: web.Request) -> web.Response:
    """``GET /dashboard``: the single-page dashboard (never cached by the browser)."""
    return web.Response(
        body=_main(request)[DASHBOARD],
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


async def handle_relay(request: web.Request) -> web.StreamResponse:
    """Every other method and path: relayed to the upstream."""
    return await request.app[RELAY].handle(request)


async def expect_relay(request: web.Request) -> None:
    """An ``Expect`` header: the relay answers it (the route's documented hook, which
    aiohttp calls before the handler; its own sends ``100 Continue`` before any check)."""
    request.app[RELAY].expect(request)


@web.middleware
async def relay_unroutable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A target no route matches (``OPTIONS *``, ``CONNECT host:port``) goes to the relay
    too, which refuses it in OpenAI's shape, instead of aiohttp's plain-text 404."""
    if request.match_info.http_exception is not None:
        return await request.app[RELAY].handle(request)
    return await handler(request)


def route(app: web.Application) -> None:
    """The agent's listener: every method and target to the relay."""
    app.router.add_route("*", "/{tail:.*}", handle_relay, expect_handler=expect_relay)
    app.middlewares.append(relay_unroutable)


def route_admin(admin: web.Application) -> None:
    """The admin listener: the proxy's own pages, nothing else (404 in OpenAI's shape)."""
    admin.router.add_get("/stats", handle_stats)
    admin.router.add_get("/stats/records/{id}", handle_record)
    admin.router.add_get("/metrics", handle_metrics)
    admin.router.add_get("/dashboard", handle_dashboard)
