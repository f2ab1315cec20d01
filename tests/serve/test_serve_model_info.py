"""ModelInfo: the served model's metadata from ``/v1/models``, the retry while it is unknown,
the roofline fields it adds to a record, and the blocking fetch the ``report`` command uses."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.config import BoardConfig
from proxy.core.record import Kind, Record
from proxy.core.roofline import Board, ModelMeta, record_roofline
from proxy.serve.model_info import ModelInfo, ModelInfoError
from tests.fakes import FakeClock

ORIN = Board.from_config(BoardConfig(preset="jetson-orin-nano-8gb"))
WITH_META = orjson.dumps(
    {"data": [{"id": "m.gguf", "meta": {"size": 2_450_000_000, "n_params": 4_000_000_000}}]}
)
WITHOUT_META = orjson.dumps({"data": [{"id": "m.gguf"}]})
POLL_S = 0.02  # how often the server's thread looks for its shutdown (http.server: 0.5 s)


def decoded(rate: float | None = 10.0) -> Record:
    """A completed chat record with a decode rate of ``rate`` tokens per second."""
    return Record(
        id="r-1",
        ts="2026-11-30T00:00:00.000Z",
        method="POST",
        path="/v1/chat/completions",
        kind=Kind.CHAT,
        decode_tok_s=rate,
    )


class Models:
    """A tiny upstream whose ``/v1/models`` answers ``body``; counts the requests."""

    def __init__(self) -> None:
        self.body = WITHOUT_META
        self.requests = 0
        self.authorization: list[str | None] = []
        self.app = web.Application()
        self.app.router.add_get("/v1/models", self._models)

    async def _models(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.authorization.append(request.headers.get("Authorization"))
        return web.Response(body=self.body, content_type="application/json")


@pytest.fixture
async def models(aiohttp_server: Any) -> tuple[Models, str]:
    """A started :class:`Models` upstream and its URL."""
    upstream = Models()
    server = await aiohttp_server(upstream.app)
    return upstream, str(server.make_url("")).rstrip("/")


class TestRetry:
    """While the model is unknown, a fetch is tried at most every ``retry_s`` seconds."""

    async def test_fetches_again_only_after_the_retry_interval(
        self, models: tuple[Models, str]
    ) -> None:
        """Unknown model: the first record starts a fetch; records within 30 s of it start
        none; the first record after 30 s starts the next."""
        upstream, url = models
        clock = FakeClock(1000.0)
        info = ModelInfo(url, ORIN, clock=clock)
        async with aiohttp.ClientSession() as session:
            info.attach(session)
            assert info.enrich(decoded()) == decoded()
            await info.settle()
            assert upstream.requests == 1 and info.meta is None
            for step in (10.0, 20.0):  # 10 s, then exactly 30 s after the first try
                clock.advance(step)
                info.enrich(decoded())
                await info.settle()
            assert upstream.requests == 1
            clock.advance(0.5)
            info.enrich(decoded())
            await info.settle()
            assert upstream.requests == 2

    async def test_known_model_is_not_fetched_again(self, models: tuple[Models, str]) -> None:
        """Once a fetch found the metadata, records are enriched and nothing is fetched."""
        upstream, url = models
        upstream.body = WITH_META
        clock = FakeClock(1000.0)
        info = ModelInfo(url, ORIN, clock=clock)
        async with aiohttp.ClientSession() as session:
            info.attach(session)
            info.enrich(decoded())
            await info.settle()
            assert info.meta == ModelMeta(2_450_000_000, 4_000_000_000, "m.gguf", "/v1/models meta")
            clock.advance(3600.0)
            assert info.enrich(decoded()).decode_gbs is not None
            await info.settle()
        assert upstream.requests == 1

    async def test_nothing_is_fetched_without_a_session_or_a_decode_rate(
        self, models: tuple[Models, str]
    ) -> None:
        """Before a session is attached no fetch is tried (and no try is counted, so the
        first record after attaching fetches); a record without a decode rate never
        fetches."""
        upstream, url = models
        clock = FakeClock(1000.0)
        info = ModelInfo(url, ORIN, clock=clock)
        info.enrich(decoded())
        async with aiohttp.ClientSession() as session:
            info.attach(session)
            info.enrich(decoded(rate=None))
            await info.settle()
            assert upstream.requests == 0
            info.enrich(decoded())
            await info.settle()
        assert upstream.requests == 1

    async def test_unreachable_upstream_leaves_the_model_unknown(self) -> None:
        """A fetch that cannot connect keeps the records unchanged and raises nothing."""
        info = ModelInfo("http://127.0.0.1:9", ORIN, clock=FakeClock(1000.0))
        async with aiohttp.ClientSession() as session:
            info.attach(session)
            assert info.enrich(decoded()) == decoded()
            await info.settle()
        assert info.meta is None

    async def test_api_key_is_sent(self, models: tuple[Models, str]) -> None:
        """The upstream's API key goes with the fetch as a bearer token."""
        upstream, url = models
        info = ModelInfo(url, ORIN, api_key="sekrit", clock=FakeClock(1000.0))
        async with aiohttp.ClientSession() as session:
            await info.fetch(session)
        assert upstream.authorization == ["Bearer sekrit"]


class TestEnrich:
    """The roofline fields a known model gives a record."""

    def test_fields_are_the_roofline_of_the_record(self) -> None:
        """2.45 GB of weights at 10 tok/s moved 24.5 GB/s; roof_ratio is record_roofline's."""
        info = ModelInfo("http://127.0.0.1:9", ORIN)
        info.meta = ModelMeta(2_450_000_000, 4_000_000_000)
        record = info.enrich(decoded(10.0))
        expected = record_roofline(decoded(10.0), info.meta, ORIN)
        assert record.decode_gbs == 24.5
        assert record.roof_ratio is not None and record.roof_ratio == expected.roof_ratio
        assert record.roof_ratio > 1.0  # slower than the bandwidth floor, as every board is
        assert record.id == "r-1" and record.decode_tok_s == 10.0

    def test_board_without_bandwidth_gives_no_ratio(self) -> None:
        """With no board bandwidth the GB/s is known, the ratio to the floor is not."""
        info = ModelInfo("http://127.0.0.1:9", Board.from_config(BoardConfig()))
        info.meta = ModelMeta(2_450_000_000, 4_000_000_000)
        record = info.enrich(decoded(10.0))
        assert (record.decode_gbs, record.roof_ratio) == (24.5, None)


class _Handler(http.server.BaseHTTPRequestHandler):
    body: ClassVar[bytes] = b""
    seen_auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen_auth.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def blocking_server() -> Iterator[tuple[str, type[_Handler]]]:
    """An http.server in a thread answering every GET with ``_Handler.body``."""
    handler = type("Handler", (_Handler,), {"body": b"", "seen_auth": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()
    thread.join()


class TestFetchBlocking:
    """``ModelInfo.fetch_blocking``: what ``report.fetch_model_meta`` did, without a loop."""

    def test_meta(self, blocking_server: tuple[str, type[_Handler]]) -> None:
        """The model's size, parameters and id are read; a trailing slash is harmless."""
        url, handler = blocking_server
        handler.body = WITH_META
        meta = ModelInfo.fetch_blocking(url + "/")
        assert meta is not None and (meta.size_bytes, meta.n_params, meta.name) == (
            2_450_000_000,
            4_000_000_000,
            "m.gguf",
        )
        assert handler.seen_auth == [None]

    def test_api_key_is_sent(self, blocking_server: tuple[str, type[_Handler]]) -> None:
        """With an API key the request carries it as a bearer token."""
        url, handler = blocking_server
        handler.body = WITH_META
        ModelInfo.fetch_blocking(url, api_key="sekrit")
        assert handler.seen_auth == ["Bearer sekrit"]

    def test_no_meta(self, blocking_server: tuple[str, type[_Handler]]) -> None:
        """An answer without ``meta`` gives None."""
        url, handler = blocking_server
        handler.body = WITHOUT_META
        assert ModelInfo.fetch_blocking(url) is None

    def test_not_json(self, blocking_server: tuple[str, type[_Handler]]) -> None:
        """An answer that is not JSON is a ModelInfoError naming the URL."""
        url, handler = blocking_server
        handler.body = b"<html>"
        with pytest.raises(ModelInfoError, match=r"/v1/models: the answer is not JSON"):
            ModelInfo.fetch_blocking(url)

    def test_unreachable(self) -> None:
        """An upstream that does not answer is a ModelInfoError naming the URL."""
        with pytest.raises(ModelInfoError, match=r"^http://127\.0\.0\.1:9/v1/models: "):
            ModelInfo.fetch_blocking("http://127.0.0.1:9", timeout_s=2.0)

    def test_not_a_url(self) -> None:
        """Something that is not a URL is a ModelInfoError too, not a ValueError."""
        with pytest.raises(ModelInfoError, match="nowhere/v1/models"):
            ModelInfo.fetch_blocking("nowhere")
