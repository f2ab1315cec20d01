"""The proxy's HTTP handlers: its own pages (``/stats``, ``/stats/records/{id}``,
``/metrics``, ``/dashboard``), the relay for every other path, and the bearer-token check of
its own pages. Each reads what it needs from the application's keys (:mod:`proxy.serve.keys`).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.serve.keys import (
    ACCOUNTING,
    CONFIG,
    DASHBOARD,
    METRICS,
    RELAY,
    SESSION,
    STATS,
    STATS_DOCUMENT,
    TELEMETRY,
)
from proxy.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from proxy.serve.relay import error_response
from proxy.serve.upstream import own_headers

__all__ = [
    "RESERVED",
    "auth_middleware",
    "handle_dashboard",
    "handle_metrics",
    "handle_record",
    "handle_relay",
    "handle_stats",
    "route",
]

RESERVED = frozenset({"/stats", "/metrics", "/dashboard"})
"""Paths the proxy answers itself (and ``/stats/records/{id}``); everything else is relayed."""

UPSTREAM_METRICS_TIMEOUT_S = 2.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _reserved(path: str) -> bool:
    return path in RESERVED or path.startswith("/stats/")


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


async def handle_stats(request: web.Request) -> web.Response:
    """``GET /stats``: the statistics document (see :mod:`proxy.serve.stats_cache`)."""
    app = request.app
    body = await app[STATS_DOCUMENT].body(app[ACCOUNTING], app.get(TELEMETRY))
    return web.Response(body=body, content_type="application/json")


async def handle_record(request: web.Request) -> web.Response:
    """``GET /stats/records/{id}``: one recent record, or 404."""
    record = request.app[STATS].find(request.match_info["id"])
    if record is None:
        return error_response(404, "no recent record with that id", "not_found")
    return web.Response(body=orjson.dumps(record.to_dict()), content_type="application/json")


async def _upstream_metrics(app: web.Application) -> bytes | None:
    """llama-server's own ``/metrics`` page, or ``None`` when it has none or does not answer."""
    config = app[CONFIG]
    try:
        async with app[SESSION].get(
            config.upstream.url + "/metrics",
            headers=own_headers(config),
            timeout=aiohttp.ClientTimeout(total=UPSTREAM_METRICS_TIMEOUT_S),
        ) as resp:
            if resp.status == 200:
                return await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        pass
    return None


async def handle_metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the proxy's Prometheus page, with the upstream's appended."""
    upstream = await _upstream_metrics(request.app)
    telemetry = request.app.get(TELEMETRY)
    board = telemetry.gauges() if telemetry is not None else None
    return web.Response(
        body=request.app[METRICS].render(upstream, board),
        headers={"Content-Type": METRICS_CONTENT_TYPE},
    )


async def handle_dashboard(request: web.Request) -> web.Response:
    """``GET /dashboard``: the single-page dashboard (never cached by the browser)."""
    return web.Response(
        body=request.app[DASHBOARD],
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


async def handle_relay(request: web.Request) -> web.StreamResponse:
    """Every other method and path: relayed to the upstream."""
    return await request.app[RELAY].handle(request)


def route(app: web.Application) -> None:
    """Add the proxy's routes to ``app``: its own pages first, then the relay for the rest."""
    app.router.add_get("/stats", handle_stats)
    app.router.add_get("/stats/records/{id}", handle_record)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/dashboard", handle_dashboard)
    app.router.add_route("*", "/{tail:.*}", handle_relay)
