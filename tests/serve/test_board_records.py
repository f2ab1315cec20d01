"""The board telemetry joined to the records by the proxy: a fake ``tegrastats`` (real line
format, constant input power) beside a proxy in front of a fake upstream.

At a constant power P the energy of a request is exactly P x its wall interval, and the
interval is the record's own ``e2e_ms`` (the relay's clock is the sampler's): the expected
millijoules are computed from the record, not assumed. The fake prints a line at start and
the next one when the test steps it, after the answer: the samples cover every request,
however late a loaded machine runs the fake.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fake_tegrastats import STEPPED_INTERVAL_MS, Stepped
from tests.fakes import SeenRequest, load_recording, replay

POWER_MW = 6250


async def _proxy_with_board(
    fake: Any, make_proxy: ProxyFactory, path: Path, interval_ms: int = STEPPED_INTERVAL_MS
) -> ProxyUnderTest:
    upstream, server = fake
    # the recorded arrival times at a fifth: the stream lasts over 150 ms, so the energies
    # stand far above the 0.001 mJ their fields are rounded to
    chat = replay(load_recording("chat_stream"), speed=0.2)

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        if request.path == "/metrics":  # a llama-server started without --metrics
            return web.json_response({"error": {"code": 501}}, status=501)
        return await chat(request, seen)

    upstream.script = script
    return await make_proxy(
        str(server.make_url("")).rstrip("/"),
        board={
            "telemetry": "tegrastats",
            "tegrastats_path": str(path),
            "telemetry_interval_ms": interval_ms,
        },
    )


async def _records(proxy: ProxyUnderTest, n: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while len(proxy.captured.records) < n:
        assert time.monotonic() < deadline, "no record"
        await asyncio.sleep(0.01)


async def _chat(proxy: ProxyUnderTest) -> None:
    resp = await proxy.client.post(
        "/v1/chat/completions", data=load_recording("chat_stream").request_body
    )
    await resp.read()


async def _wait_for_samples(proxy: ProxyUnderTest) -> None:
    """Until the sampler has its first line (its child process takes a moment to start)."""
    deadline = time.monotonic() + 20
    while True:
        doc = orjson.loads(await (await proxy.admin.get("/stats")).read())
        await (await proxy.admin.get("/metrics")).read()
        board = doc.get("board") or {}
        if board.get("state") == "running" and board.get("samples", 0) >= 1:
            return
        assert time.monotonic() < deadline, f"sampler not running: {board}"
        await asyncio.sleep(0.05)


async def test_energy_of_a_request_is_power_times_its_interval(
    fake: Any, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """A streamed chat through the proxy with tegrastats at a constant 6.25 W: the record's
    energy_mj is 6.25 W x e2e_ms exactly (the trapezoid of a constant is exact), its
    power_w_avg is 6.25, energy per token divides by predicted_n, and the line's GPU load,
    RAM and hottest sensor are carried over."""
    tegrastats = Stepped(tmp_path, "--power-mw", str(POWER_MW))
    proxy = await _proxy_with_board(fake, make_proxy, tegrastats.path)
    await _wait_for_samples(proxy)
    await _chat(proxy)
    tegrastats.step()  # the sample that closes the request's interval
    await _records(proxy, 1)
    record = proxy.captured.last
    assert record.e2e_ms is not None and record.e2e_ms > 100
    assert record.telemetry_error is None
    assert record.energy_mj == pytest.approx(POWER_MW / 1000.0 * record.e2e_ms, rel=1e-3)
    assert record.power_w_avg == pytest.approx(POWER_MW / 1000.0, rel=1e-3)
    assert record.predicted_n and record.energy_mj is not None
    assert record.energy_mj_per_token == pytest.approx(
        record.energy_mj / record.predicted_n, rel=1e-3
    )
    assert record.gpu_busy_pct == 37.0
    assert record.temp_max_c == pytest.approx(45.968)
    assert record.ram_used_mb is not None


async def test_stats_and_metrics_show_the_board(
    fake: Any, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """/stats has the sampler's state under board, /metrics the latest power as a gauge and
    the request's energy in joules."""
    tegrastats = Stepped(tmp_path, "--power-mw", str(POWER_MW))
    proxy = await _proxy_with_board(fake, make_proxy, tegrastats.path)
    await _wait_for_samples(proxy)
    await _chat(proxy)
    tegrastats.step()  # the sample that closes the request's interval
    await _records(proxy, 1)
    doc = orjson.loads(await (await proxy.admin.get("/stats")).read())
    assert doc["board"]["mode"] == "tegrastats" and doc["board"]["state"] == "running"
    assert doc["kinds"]["chat"]["energy_mj"]["p50"] == proxy.captured.last.energy_mj
    page = (await (await proxy.admin.get("/metrics")).read()).decode()
    fams = {f.name: f for f in text_string_to_metric_families(page)}
    assert fams["timing_proxy_board_power_watts"].samples[0].value == POWER_MW / 1000.0
    joules = [s.value for s in fams["timing_proxy_energy_joules"].samples]
    assert joules == [pytest.approx((proxy.captured.last.energy_mj or 0) / 1000.0)]


async def test_a_sampler_that_never_starts_leaves_the_fields_null_with_a_reason(
    fake: Any, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """With a tegrastats path that does not exist the proxy still relays; the record's
    energy is null and telemetry_error says why."""
    # a short interval: a record that ends while the first start is still failing waits
    # two intervals for a sample that never comes
    proxy = await _proxy_with_board(fake, make_proxy, tmp_path / "no-such-tegrastats", 20)
    await _chat(proxy)
    await _records(proxy, 1)
    record = proxy.captured.last
    assert record.status == 200
    assert record.energy_mj is None and record.power_w_avg is None
    assert record.telemetry_error is not None
