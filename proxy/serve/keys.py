"""The typed keys under which the application holds what its handlers and hooks read.

Set by :func:`proxy.serve.app.build_app` (``SESSION``, ``RELAY`` and ``ACCOUNTING`` once the
upstream session is open, in its cleanup context).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config import Config
from proxy.core.record import Record
from proxy.core.request import RequestFacts
from proxy.core.stats import Stats
from proxy.core.tracker import Observation
from proxy.serve.accounting import Accounting
from proxy.serve.metrics import Metrics
from proxy.serve.model_info import ModelInfo
from proxy.serve.relay import Relay
from proxy.serve.setup_watch import SetupWatch
from proxy.serve.stats_cache import StatsDocument
from proxy.serve.telemetry import Telemetry

__all__ = [
    "ACCOUNTING",
    "ADMIN_READY",
    "ADMIN_SESSION",
    "BACKGROUND",
    "CONFIG",
    "DASHBOARD",
    "MAIN_APP",
    "METRICS",
    "MODEL_INFO",
    "RELAY",
    "SESSION",
    "SETUP",
    "SINKS",
    "STATE_LOCK",
    "STATS",
    "STATS_DOCUMENT",
    "STREAM_SESSION",
    "TELEMETRY",
    "RecordSink",
]

RecordSink = Callable[[Record, RequestFacts, Observation | None], None]
"""Where a finished record goes (the log, ``/stats``, ``/metrics``, the accounting)."""

CONFIG = web.AppKey("config", Config)
SESSION = web.AppKey("session", aiohttp.ClientSession)
STREAM_SESSION = web.AppKey("stream_session", aiohttp.ClientSession)
RELAY = web.AppKey("relay", Relay)
STATS = web.AppKey("stats", Stats)
STATS_DOCUMENT = web.AppKey("stats_document", StatsDocument)
METRICS = web.AppKey("metrics", Metrics)
MODEL_INFO = web.AppKey("model_info", ModelInfo)
SINKS = web.AppKey("sinks", list[RecordSink])
ACCOUNTING: web.AppKey[Accounting | None] = web.AppKey("accounting")
SETUP = web.AppKey("setup", SetupWatch)
"""The setup findings and the served template's tool support (``/props``)."""
TELEMETRY: web.AppKey[Telemetry | None] = web.AppKey("telemetry")
"""The board's telemetry sampler, when ``[board] telemetry`` names one."""
STATE_LOCK = web.AppKey("state_lock", threading.RLock)
"""Held by the record sinks while they change what the admin pages read, and by the pages
while they read it: the admin listener runs on a thread of its own (:mod:`proxy.serve.admin`)."""
ADMIN_READY = web.AppKey("admin_ready", threading.Event)
"""Set by :func:`proxy.serve.app.run` once the agent's listener listens too: until then the
admin pages wait, so a page that answers means the proxy relays (readiness checks poll
``/stats``)."""
ADMIN_SESSION = web.AppKey("admin_session", aiohttp.ClientSession)
"""On the admin application: its own session to the upstream (for llama-server's
``/metrics``), opened on the admin listener's event loop."""
DASHBOARD = web.AppKey("dashboard", bytes)
"""The dashboard page, read from the package once."""
MAIN_APP = web.AppKey("main_app", web.Application)
"""On the admin application: the relaying one, whose state its pages show."""
BACKGROUND = web.AppKey("background", set[asyncio.Future[Any]])
"""Background tasks of the app itself (the upstream check), cancelled at cleanup."""
