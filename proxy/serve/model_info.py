"""What the served model weighs, read from the upstream's ``/v1/models``, and the roofline
fields it gives each record (``decode_gbs``, ``roof_ratio``).

The serving proxy fetches the model's metadata in the background the first time a record
with a decode rate needs it, and again at most every :attr:`ModelInfo.retry_s` seconds while
it is unknown (llama-server may still be loading, or have no ``meta``). The ``report``
command, which has no event loop, uses :meth:`ModelInfo.fetch_blocking`.

A llama-server in router mode (``--models-dir``) lists every model it can serve, each with a
``status``, and the ``meta`` of those loaded: each record then gets the metadata of the
entry named like its model (by id or alias), fetched while that model is loaded; a model
never seen loaded stays unknown.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from proxy.core.partials import RooflineFields, assemble
from proxy.core.record import Record
from proxy.core.roofline import Board, ModelMeta, record_roofline
from proxy.serve.tasks import spawn
from proxy.serve.upstream import auth_headers

__all__ = ["ModelInfo", "ModelInfoError"]

RETRY_S = 30.0
"""Seconds between two fetches of ``/v1/models`` while the metadata is unknown."""

FETCH_TIMEOUT_S = 5.0


class ModelInfoError(Exception):
    """``/v1/models`` could not be read (unreachable, or not JSON); the message says why,
    naming the URL."""


class ModelInfo:
    """The served model's :class:`ModelMeta` once known, and the roofline of each record."""

    def __init__(
        self,
        upstream_url: str,
        board: Board,
        *,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = RETRY_S,
    ) -> None:
        self._url = upstream_url.rstrip("/") + "/v1/models"
        self._board = board
        self._headers = auth_headers(api_key)
        self._clock = clock
        self.retry_s = retry_s
        self.meta: ModelMeta | None = None
        """The model's metadata; ``None`` until a fetch found it (and on a router, which
        serves several: see :attr:`by_model`)."""
        self.router = False
        """The upstream is a router: its ``/v1/models`` entries carry a ``status``."""
        self.by_model: dict[str, ModelMeta] = {}
        """On a router: each loaded model's metadata, under its id and aliases."""
        self._session: aiohttp.ClientSession | None = None
        self._last_try: dict[str | None, float] = {}
        self._fetching: set[asyncio.Future[Any]] = set()

    def attach(self, session: aiohttp.ClientSession) -> None:
        """Fetch through ``session`` from now on (none is made before one is attached)."""
        self._session = session

    async def close(self) -> None:
        """Stop using the session: cancel a fetch in flight (at shutdown)."""
        self._session = None
        for task in self._fetching:
            task.cancel()
        await self.settle()

    async def settle(self) -> None:
        """Wait until no fetch is in flight."""
        if self._fetching:
            await asyncio.gather(*self._fetching, return_exceptions=True)

    def meta_of(self, model: str | None) -> ModelMeta | None:
        """The served model's metadata: the named one's on a router, else the one's."""
        return self.by_model.get(model or "") if self.router else self.meta

    def roofline(self, record: Record) -> RooflineFields | None:
        """The roofline fields of ``record`` when it has a decode rate and the model is known;
        otherwise None (and, the model unknown, a fetch started in the background unless one
        was tried within ``retry_s``)."""
        if record.decode_tok_s is None:
            return None
        meta = self.meta_of(record.model)
        if meta is None:
            self._maybe_fetch(record.model if self.router else None)
            return None
        return record_roofline(record, meta, self._board)

    def enrich(self, record: Record) -> Record:
        """``record`` with its :meth:`roofline` fields, or unchanged when there are none."""
        fields = self.roofline(record)
        return record if fields is None else assemble(record, fields)

    def _maybe_fetch(self, model: str | None) -> None:
        """Fetch unless one was tried for ``model`` (None: the one model) within ``retry_s``."""
        now = self._clock()
        if self._session is None or now - self._last_try.get(model, float("-inf")) <= self.retry_s:
            return
        self._last_try[model] = now
        _ = spawn(self.fetch(self._session), self._fetching)

    async def fetch(self, session: aiohttp.ClientSession) -> ModelMeta | None:
        """GET ``/v1/models`` once; keeps and returns the metadata when the answer has it.
        Failures (unreachable, timeout, not JSON, no ``meta``) leave it unknown."""
        try:
            async with session.get(
                self._url,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S),
            ) as resp:
                if resp.status == 200:
                    self._read(orjson.loads(await resp.read()))
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            pass
        return self.meta

    def _read(self, models: Any) -> None:
        """Keep what a ``/v1/models`` answer says: the one model's metadata, or on a router
        each loaded model's, under its id and its aliases."""
        entries = models.get("data") if isinstance(models, dict) else None
        routed = [e for e in entries or () if isinstance(e, dict) and "status" in e]
        if not routed:
            self.meta = ModelMeta.from_models_json(models)
            return
        self.router = True
        for entry in routed:
            meta = ModelMeta.from_models_json({"data": [entry]})
            if meta is None:
                continue
            aliases = entry.get("aliases")
            for name in [entry.get("id"), *(aliases if isinstance(aliases, list) else ())]:
                if isinstance(name, str) and name:
                    self.by_model[name] = meta

    @staticmethod
    def fetch_blocking(
        upstream_url: str, timeout_s: float = FETCH_TIMEOUT_S, api_key: str | None = None
    ) -> ModelMeta | None:
        """GET ``{upstream_url}/v1/models`` and read its ``meta``; ``None`` when it has none.

        Blocking (urllib), for commands without an event loop. Raises
        :class:`ModelInfoError` naming the URL when the server cannot be reached or does not
        answer JSON.
        """
        url = upstream_url.rstrip("/") + "/v1/models"
        try:
            request = urllib.request.Request(url, headers=auth_headers(api_key))
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                body = resp.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ModelInfoError(f"{url}: {exc}") from None
        try:
            return ModelMeta.from_models_json(orjson.loads(body))
        except orjson.JSONDecodeError:
            raise ModelInfoError(f"{url}: the answer is not JSON") from None
