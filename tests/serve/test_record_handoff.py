"""When the relay hands a finished exchange's record to the sinks: ``HANDOFF_DELAY_S``
after the exchange ended, together with the others ended meanwhile, in order, with the
times of the end itself; at once when the proxy drains."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.core.headers import REQUEST_ID_HEADER
from proxy.serve import handoff as relay_module
from proxy.serve.app import RELAY
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import FakeUpstream, SeenRequest, json_response, llama_stream, stall_after

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'


async def _proxy(fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory) -> ProxyUnderTest:
    upstream, server = fake
    upstream.script = json_response(200, b'{"ok":true}')
    return await make_proxy(str(server.make_url("")).rstrip("/"))


async def _ask(proxy: ProxyUnderTest) -> str:
    """One request, read whole; its request id."""
    resp = await proxy.client.post("/v1/chat/completions", data=BODY)
    await resp.read()
    return resp.headers[REQUEST_ID_HEADER]


async def test_records_come_after_the_delay_in_order_with_the_end_times(
    fake: tuple[FakeUpstream, TestServer],
    make_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a 0.3 s hand-off, three exchanges ended in a row have no record at first, then
    all three arrive, in the order they ended, each with the e2e time of its own end (well
    under the delay), not of the hand-off."""
    monkeypatch.setattr(relay_module, "HANDOFF_DELAY_S", 0.3)
    proxy = await _proxy(fake, make_proxy)
    t0 = time.perf_counter()
    ids = [await _ask(proxy) for _ in range(3)]
    if time.perf_counter() - t0 < 0.25:  # a slow machine may pass the delay already
        assert proxy.captured.records == []
    for _ in range(200):
        if len(proxy.captured.records) == 3:
            break
        await asyncio.sleep(0.01)
    assert [r.id for r in proxy.captured.records] == ids
    for record in proxy.captured.records:
        assert record.e2e_ms is not None and record.e2e_ms < 250


async def test_drain_hands_off_at_once(
    fake: tuple[FakeUpstream, TestServer],
    make_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At shutdown the drain builds and hands off the waiting records itself (a 60 s
    hand-off never delays the exit), and the timer it replaces writes nothing twice."""
    monkeypatch.setattr(relay_module, "HANDOFF_DELAY_S", 60.0)
    proxy = await _proxy(fake, make_proxy)
    first = await _ask(proxy)
    second = await _ask(proxy)
    await asyncio.sleep(0.05)  # the handlers' ends have run
    assert proxy.captured.records == []
    relay = proxy.app[RELAY]
    await relay.drain()
    assert [r.id for r in proxy.captured.records] == [first, second]
    await relay.drain()
    await asyncio.sleep(0.05)
    assert len(proxy.captured.records) == 2


async def test_records_wait_while_the_relay_is_busy_until_the_limit(
    fake: tuple[FakeUpstream, TestServer],
    make_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a stream is in flight, an ended exchange's record is not handed off after
    the idle delay (the relay is busy), but it is at the limit, the stream still going;
    the stream's own record follows the idle delay after it ends."""
    monkeypatch.setattr(relay_module, "HANDOFF_DELAY_S", 0.05)
    monkeypatch.setattr(relay_module, "HANDOFF_MAX_DELAY_S", 0.6)
    upstream, server = fake
    ended = asyncio.Event()
    events = llama_stream(3)
    stream = stall_after(events[:1], ended, tail=events[1:])  # in flight until ended is set
    plain = json_response(200, b'{"ok":true}')

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        body = await request.read()
        return await (stream if b'"stream":true' in body else plain)(request, seen)

    upstream.script = script
    proxy = await make_proxy(str(server.make_url("")).rstrip("/"))
    streaming = await proxy.client.post("/v1/chat/completions", data=BODY[:-1] + b',"stream":true}')
    await streaming.content.readany()  # the stream is in flight
    t0 = time.perf_counter()
    quick = await _ask(proxy)
    await asyncio.sleep(0.3)  # six idle delays, well inside the limit
    if time.perf_counter() - t0 < 0.55:  # a slow machine may pass the limit already
        assert proxy.captured.records == [], "handed off while the relay was busy"
    for _ in range(300):
        if proxy.captured.records:
            break
        await asyncio.sleep(0.01)
    assert [r.id for r in proxy.captured.records] == [quick]
    assert not streaming.content.at_eof(), "the limit, not the stream's end, handed it off"
    ended.set()
    await streaming.read()
    for _ in range(300):
        if len(proxy.captured.records) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(proxy.captured.records) == 2
