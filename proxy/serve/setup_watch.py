"""Setup findings, live: what ``/props`` says of the served template's tool support and of
the server's slot count (at start, again when the served model changes, and again after an
answer that the server was still loading its model), and each finished record's setup
causes (:mod:`proxy.core.setup`), each logged once per cause and model, not per request.

A llama-server in router mode (``--models-dir``) answers ``/props`` for itself
(``"role": "router"``, no template): each model's template is then read from
``/props?model=NAME&autoload=false`` once a record of that model arrives (the model is
loaded then; ``autoload=false`` keeps the read from loading one that was unloaded since).

Everything here runs off the request path: ``/props`` is read by a background task, and the
record sink only counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from proxy.core.record import Kind, Record
from proxy.core.request import RequestFacts
from proxy.core.setup import SETUP_FIXES, SetupCause, SetupFindings, TemplateCaps
from proxy.core.tracker import Observation
from proxy.serve.tasks import spawn
from proxy.serve.upstream import auth_headers

__all__ = ["SetupWatch"]

PROPS_TIMEOUT_S = 5.0
PROPS_RETRY_S = 2.0
"""After ``/props`` answered 503 (llama-server still loading its model), the next record
reads it again once this long has passed."""
LOADING = 503
"""llama-server's status for every request but ``/health`` while it loads its model."""
DECODE_CHECK_EVERY = 50
"""Records between two looks at the tool-vs-chat decode rates (for the log line)."""


class SetupWatch:
    """The template's capabilities and the setup findings of one proxy."""

    def __init__(
        self,
        upstream_url: str,
        log: Any,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = upstream_url.rstrip("/") + "/props"
        self._headers = auth_headers(api_key)
        self._log = log
        self.findings = SetupFindings()
        self.caps: TemplateCaps | None = None
        """The latest ``/props`` answer's template capabilities (``None`` until read)."""
        self._session: aiohttp.ClientSession | None = None
        self._last_model: str | None = None
        self._warned: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._seen = 0
        self.router: bool | None = None
        """The upstream is a router (``/props`` said ``"role": "router"``); None: not read."""
        self.caps_by_model: dict[str, TemplateCaps] = {}
        """On a router: each model's template capabilities, as read once per model."""
        self._probing: set[str] = set()
        self._clock = clock
        self._read_at = float("-inf")
        """When ``/props`` was last asked for the upstream itself."""
        self._loading = False
        """That read was answered "loading": read it again (:data:`PROPS_RETRY_S`)."""
        self._slots: dict[str | None, int] = {}
        """``/props`` ``total_slots``: the one server's under None, a router's models' by
        name."""

    def attach(self, session: aiohttp.ClientSession) -> None:
        """Read ``/props`` through ``session`` from now on."""
        self._session = session

    async def close(self) -> None:
        """Stop: cancel a ``/props`` read in flight."""
        self._session = None
        for task in self._tasks:
            task.cancel()
        await self.settle()

    async def settle(self) -> None:
        """Wait until no ``/props`` read is in flight."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def probe(self, model: str | None = None) -> TemplateCaps | None:
        """GET ``/props`` once (a router's, for ``model``); warn (once per model) when the
        template drops tools. A router's own answer (no ``model``) holds no template: it
        only marks the upstream as a router."""
        if model is None:
            self._read_at = self._clock()
        props = await self._props(model)
        if not isinstance(props, dict):
            return None
        if props.get("role") == "router":
            self.router = True
            return None
        if model is None:
            self.router = False
        slots = props.get("total_slots")
        if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0:
            self._slots[model] = slots
        caps = TemplateCaps.from_props(props)
        self.caps = caps
        name = caps.model or model or "unknown"
        if model is not None:
            self.caps_by_model[model] = caps
        self.findings.template_drops_tools[name] = caps.drops_tools
        if caps.drops_tools:
            self._warn_once(SetupCause.TOOLS_NEVER_REACH_MODEL, name, source="/props")
        return caps

    async def _props(self, model: str | None) -> Any:
        """The ``/props`` answer (for ``model`` on a router, never loading it), or None."""
        if self._session is None:
            return None
        params = {} if model is None else {"model": model, "autoload": "false"}
        try:
            async with self._session.get(
                self._url,
                params=params,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=PROPS_TIMEOUT_S),
            ) as resp:
                if model is None:
                    self._loading = resp.status == LOADING
                if resp.status != 200:
                    return None
                return orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            return None

    def slots_of(self, model: str | None) -> int | None:
        """How many requests the server runs at once (``/props`` ``total_slots``): the
        named model's on a router, else the one server's; None until read."""
        return self._slots.get(model if self.router else None)

    def _warn_once(self, cause: SetupCause, model: str, **extra: Any) -> None:
        key = (str(cause), model)
        if key in self._warned:
            return
        self._warned.add(key)
        self._log.warning(
            "setup_finding", cause=str(cause), model=model, fix=SETUP_FIXES[cause], **extra
        )

    def sink(self, record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        """Record sink: count the record's setup causes (a new one is logged once), and read
        ``/props`` again when the served model changed or the last read found it loading."""
        for cause, model in self.findings.add(record, limit_known=facts.body is not None):
            self._warn_once(cause, model, id=record.id)
        self._seen += 1
        if self._seen % DECODE_CHECK_EVERY == 0:
            for found in self.findings.findings():
                if found["cause"] == SetupCause.TOOL_DECODE_SLOWER:
                    self._warn_once(
                        SetupCause.TOOL_DECODE_SLOWER, found["model"], **found["detail"]
                    )
        if self._loading:
            self._probe_again()
        elif self.router:
            # a model's turns only: a management request (``POST /models`` downloading or
            # loading one) names a model it does not run, and a ``/props`` read then makes
            # the router rescan its models and forget one it has just downloaded
            if facts.kind is not Kind.OTHER:
                self._probe_model(facts.model)
        elif record.model is not None and record.model != self._last_model:
            if self._last_model is not None:
                _ = spawn(self.probe(), self._tasks)
            self._last_model = record.model

    def _probe_again(self) -> None:
        """``/props`` said the server was loading: read it again, at most once per
        :data:`PROPS_RETRY_S`."""
        if self._clock() - self._read_at >= PROPS_RETRY_S:
            self._read_at = self._clock()
            _ = spawn(self.probe(), self._tasks)

    def _probe_model(self, model: str | None) -> None:
        """On a router: read ``model``'s template once (again after a failed read)."""
        if model is None or model in self.caps_by_model or model in self._probing:
            return
        self._probing.add(model)

        async def probe() -> None:
            try:
                await self.probe(model)
            finally:
                self._probing.discard(model)

        _ = spawn(probe(), self._tasks)

    def snapshot(self) -> dict[str, Any]:
        """The template's capabilities as last read, for ``/stats``; on a router also each
        model's (``by_model``)."""
        caps = self.caps
        doc: dict[str, Any] = {
            "supports_tools": caps.supports_tools if caps else None,
            "supports_tool_calls": caps.supports_tool_calls if caps else None,
            "model": caps.model if caps else None,
        }
        if self.router:
            doc["by_model"] = {
                name: {
                    "supports_tools": c.supports_tools,
                    "supports_tool_calls": c.supports_tool_calls,
                }
                for name, c in self.caps_by_model.items()
            }
        return doc
