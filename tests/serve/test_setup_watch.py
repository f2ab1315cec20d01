"""Tests for proxy.serve.setup_watch's slot count: ``/props`` ``total_slots`` read at start,
read again after a failed read (a server still loading its model answers 503), and per model
on a router."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from proxy.core.record import Kind, Record
from proxy.core.request import RequestFacts
from proxy.serve.setup_watch import PROPS_RETRY_S, SetupWatch


class Props:
    """A ``/props`` that answers 503 until ``loaded``, then ``answer`` (a router's per
    ``model`` from ``models``)."""

    def __init__(self, answer: dict[str, Any], models: dict[str, int] | None = None) -> None:
        self.answer, self.models, self.loaded, self.reads = answer, models, False, 0
        self.app = web.Application()
        self.app.router.add_get("/props", self._props)

    async def _props(self, request: web.Request) -> web.Response:
        self.reads += 1
        if not self.loaded:
            return web.json_response(
                {"error": {"code": 503, "message": "Loading model"}}, status=503
            )
        model = request.query.get("model")
        if self.models is not None and model is not None:
            return web.json_response({"model_alias": model, "total_slots": self.models[model]})
        return web.json_response(self.answer)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(model: str = "m") -> tuple[Record, RequestFacts]:
    return Record(id="r", ts=None, method="POST", path="/v1/chat/completions", model=model), (
        RequestFacts(kind=Kind.CHAT, model=model)
    )


async def _watch(aiohttp_server: Any, props: Props, clock: Clock) -> tuple[SetupWatch, Any]:
    server = await aiohttp_server(props.app)
    watch = SetupWatch(str(server.make_url("")), log=_Log(), clock=clock)
    return watch, server


class _Log:
    def warning(self, *_: Any, **__: Any) -> None:
        pass


async def test_read_again_after_the_server_finished_loading(aiohttp_server: Any) -> None:
    """The start's read met a loading server (503): the slot count is unknown; a record
    within PROPS_RETRY_S reads nothing; the first record after it reads ``/props`` again
    and the count is the server's."""
    props, clock = Props({"total_slots": 2}), Clock()
    watch, _ = await _watch(aiohttp_server, props, clock)
    async with aiohttp.ClientSession() as session:
        watch.attach(session)
        await watch.probe()
        assert watch.slots_of(None) is None and watch.slots_of("m") is None
        props.loaded = True
        clock.now += PROPS_RETRY_S / 2
        watch.sink(*_record(), None)
        await watch.settle()
        assert props.reads == 1 and watch.slots_of(None) is None
        clock.now += PROPS_RETRY_S
        watch.sink(*_record(), None)
        await watch.settle()
        assert props.reads == 2
        assert watch.slots_of(None) == 2 and watch.slots_of("m") == 2
        watch.sink(*_record(), None)
        await watch.settle()
        assert props.reads == 2  # read once it answered


async def test_a_server_without_props_is_not_asked_again(aiohttp_server: Any) -> None:
    """A ``/props`` that does not exist (404) is read once, at start, never again."""
    app = web.Application()
    reads: list[str] = []

    async def missing(request: web.Request) -> web.Response:
        reads.append(request.path)
        raise web.HTTPNotFound

    app.router.add_get("/props", missing)
    server = await aiohttp_server(app)
    clock = Clock()
    watch = SetupWatch(str(server.make_url("")), log=_Log(), clock=clock)
    async with aiohttp.ClientSession() as session:
        watch.attach(session)
        await watch.probe()
        for _ in range(3):
            clock.now += PROPS_RETRY_S
            watch.sink(*_record(), None)
            await watch.settle()
        assert reads == ["/props"] and watch.slots_of(None) is None


async def test_no_slot_count_in_the_answer_is_unknown(aiohttp_server: Any) -> None:
    """A ``/props`` without ``total_slots`` (or with a value that is no count) leaves it
    unknown."""
    for answer in ({}, {"total_slots": 0}, {"total_slots": "2"}, {"total_slots": True}):
        props = Props(answer)
        props.loaded = True
        watch, _ = await _watch(aiohttp_server, props, Clock())
        async with aiohttp.ClientSession() as session:
            watch.attach(session)
            await watch.probe()
            assert watch.slots_of(None) is None, answer


async def test_a_routers_models_each_have_their_own(aiohttp_server: Any) -> None:
    """On a router each model's count is read with its template (``/props?model=``); a
    model not read yet is unknown."""
    props = Props({"role": "router"}, models={"a": 4, "b": 1})
    props.loaded = True
    watch, _ = await _watch(aiohttp_server, props, Clock())
    async with aiohttp.ClientSession() as session:
        watch.attach(session)
        await watch.probe()
        assert watch.router is True
        assert watch.slots_of("a") is None
        watch.sink(*_record("a"), None)
        await watch.settle()
        assert (watch.slots_of("a"), watch.slots_of("b"), watch.slots_of(None)) == (4, None, None)
