"""The board telemetry sampler: a fake tegrastats at a known power, restarts, the ring, the
/proc parsing, and the proc mode against the real llama-server.

Why the energy check is exact: the fake prints a constant ``VDD_IN``; the samples joined by
straight lines are then that constant whatever their stamps, so the integral over any covered
interval is P x (t1 - t0) up to the rounding of the field (0.001 mJ).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.commands.provision.server import LlamaServer
from proxy.config import BoardConfig, Config
from proxy.core.cpu_time import (
    cpu_ms,
    cpu_ms_between,
    listening_inodes,
    socket_inode,
    stat_ticks,
)
from proxy.serve.tasks import spawn
from proxy.serve.telemetry import (
    ProcTelemetry,
    TegrastatsTelemetry,
    backoff_delay,
    find_pid_by_port,
    telemetry_for,
)
from tests.fake_tegrastats import STEPPED_INTERVAL_MS, Stepped, fake_tegrastats

POWER_MW = 5000
INTERVAL_MS = 50


async def until(check: Callable[[], bool], within_s: float = 10.0) -> None:
    """Poll ``check`` until it holds (fails the test after ``within_s`` seconds)."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


class Events:
    """An ``on_event`` callback that keeps what it is given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.seen.append((event, fields))

    def names(self) -> list[str]:
        return [name for name, _ in self.seen]


def tegrastats(path: Path, events: Events | None = None, **kwargs: Any) -> TegrastatsTelemetry:
    options: dict[str, Any] = {
        "interval_ms": INTERVAL_MS,
        "ring": 1000,
        "clock": time.perf_counter,
        "on_event": events,
        **kwargs,
    }
    return TegrastatsTelemetry(str(path), **options)


class TestTegrastatsSampler:
    async def test_energy_at_a_known_power(self, tmp_path: Path) -> None:
        """A request over a known interval at a constant 5000 mW gets 5000 mW x seconds."""
        fake = Stepped(tmp_path, f"--power-mw {POWER_MW}")
        tel = tegrastats(fake.path, interval_ms=STEPPED_INTERVAL_MS)
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["samples"] >= 1)
            t0 = time.perf_counter()  # after the first sample: the start is covered
            await asyncio.sleep(0.05)
            t1 = time.perf_counter()
            fake.step()  # the sample after t1 closes the interval
            out = await tel.sample(t0, t1, tokens=12)
        finally:
            await tel.close()
        expected = POWER_MW * (t1 - t0)
        assert out.energy_mj == pytest.approx(expected, abs=1e-3)
        assert out.energy_mj_per_token == pytest.approx(expected / 12, abs=1e-3)
        assert out.power_w_avg == pytest.approx(POWER_MW / 1000)
        assert out.gpu_busy_pct == 37  # the fake line's GR3D_FREQ
        assert out.temp_max_c == 45.968  # its hottest zone
        assert out.ram_used_mb is not None and out.ram_used_mb >= 2  # the fake's sequence number
        assert out.telemetry_error is None
        assert tel.snapshot()["input_rail"] == "VDD_IN"

    async def test_sample_waits_for_the_closing_sample(self, tmp_path: Path) -> None:
        """An interval ending now is answered once the next sample arrives, not before."""
        fake = Stepped(tmp_path)
        tel = tegrastats(fake.path, interval_ms=STEPPED_INTERVAL_MS)
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["samples"] >= 1)
            t0 = time.perf_counter()  # after the first sample: the start is covered
            await asyncio.sleep(0.001)
            t1 = time.perf_counter()
            answer = spawn(tel.sample(t0, t1, tokens=None), set())
            for _ in range(10):  # every step the loop can run with no sample coming
                await asyncio.sleep(0)
            assert not answer.done(), "answered before the sample that closes the interval"
            fake.step()
            out = await asyncio.wait_for(answer, 30)
        finally:
            await tel.close()
        assert out.energy_mj == pytest.approx(POWER_MW * (t1 - t0), abs=1e-3)
        assert out.energy_mj is not None and out.energy_mj > 0
        assert out.energy_mj_per_token is None

    async def test_before_the_first_sample(self, tmp_path: Path) -> None:
        """An interval starting before the first sample is not covered, and says so."""
        t0 = time.perf_counter()
        tel = tegrastats(fake_tegrastats(tmp_path))
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["samples"] >= 2)
            out = await tel.sample(t0, time.perf_counter(), tokens=5)
        finally:
            await tel.close()
        assert out.energy_mj is None
        assert out.telemetry_error == "samples_do_not_cover_request"

    async def test_gauges(self, tmp_path: Path) -> None:
        """/metrics gauges are the latest sample's power, GPU %, RAM and hottest temperature."""
        tel = tegrastats(fake_tegrastats(tmp_path))
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["samples"] >= 1)
            gauges = tel.gauges()
        finally:
            await tel.close()
        assert gauges["power_w"] == POWER_MW / 1000
        assert gauges["gpu_busy_pct"] == 37
        assert gauges["temp_max_c"] == 45.968
        assert gauges["ram_used_mb"] >= 1
        assert tel.gauges() == {}  # closed: no stale gauges

    async def test_ring_is_bounded(self, tmp_path: Path) -> None:
        """The ring keeps the last ``ring`` samples however many lines were read."""
        tel = tegrastats(fake_tegrastats(tmp_path), ring=5, interval_ms=10)
        await tel.start()
        try:
            await until(lambda: tel.gauges().get("ram_used_mb", 0) >= 20)
            snapshot = tel.snapshot()
        finally:
            await tel.close()
        assert (snapshot["samples"], snapshot["ring"]) == (5, 5)

    async def test_dying_sampler_restarts_and_logs_once(self, tmp_path: Path) -> None:
        """A tegrastats that exits is started again (restarts counted), logged only once."""
        events = Events()
        path = fake_tegrastats(tmp_path, "--lines 2 --exit-code 3")
        tel = tegrastats(path, events, backoff_s=0.02, backoff_cap_s=0.05, healthy_s=60.0)
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["restarts"] >= 3)
            snapshot = tel.snapshot()
        finally:
            await tel.close()
        assert events.names() == ["telemetry_sampler_down"]
        error = events.seen[0][1]["error"]
        assert error.startswith(f"{path} exited with status 3")
        assert snapshot["last_error"].startswith(f"{path} exited with status 3")
        assert tel.snapshot()["state"] == "stopped"

    async def test_recovery_is_logged_once(self, tmp_path: Path) -> None:
        """A sampler failing on its first start only: one 'down', then one 'recovered'."""
        events = Events()
        path = fake_tegrastats(tmp_path, f"--once-marker {tmp_path / 'started'}")
        tel = tegrastats(path, events, backoff_s=0.02, healthy_s=0.1)
        await tel.start()
        try:
            await until(lambda: "telemetry_sampler_recovered" in events.names())
            await asyncio.sleep(0.2)
        finally:
            await tel.close()
        assert events.names() == ["telemetry_sampler_down", "telemetry_sampler_recovered"]
        assert "failing on the first start" in events.seen[0][1]["error"]

    async def test_missing_binary(self, tmp_path: Path) -> None:
        """No tegrastats: the sampler is down, records say why, and no gauges are exported."""
        events = Events()
        tel = tegrastats(tmp_path / "absent", events, backoff_s=5.0)
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["state"] == "restarting")
            out = await tel.sample(0.0, 1.0, tokens=1)
            gauges = tel.gauges()
        finally:
            await tel.close()
        assert out.energy_mj is None
        assert (out.telemetry_error or "").startswith("sampler_restarting: FileNotFoundError")
        assert gauges == {}
        assert events.names() == ["telemetry_sampler_down"]

    def test_backoff_doubles_to_the_cap(self) -> None:
        """The wait before a restart doubles with each failure in a row, up to the cap."""
        delays = [backoff_delay(n, 0.5, 30.0) for n in range(9)]
        assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
        assert backoff_delay(10_000, 0.5, 30.0) == 30.0


class TestFactory:
    def test_modes(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """off, and auto without tegrastats, give None; auto with it, tegrastats, proc a sampler."""
        monkeypatch.setenv("PATH", str(tmp_path))
        url = "http://127.0.0.1:8080"
        assert telemetry_for(Config(), url) is None
        assert telemetry_for(BoardConfig(telemetry="auto"), url) is None
        fake_tegrastats(tmp_path)
        auto = telemetry_for(Config(board=BoardConfig(telemetry="auto")), url)
        assert isinstance(auto, TegrastatsTelemetry)
        tegra = telemetry_for(BoardConfig(telemetry="tegrastats", telemetry_ring=7), url)
        assert isinstance(tegra, TegrastatsTelemetry)
        assert tegra.snapshot()["ring"] == 7
        proc = telemetry_for(BoardConfig(telemetry="proc", telemetry_interval_ms=250), url)
        assert isinstance(proc, ProcTelemetry)
        assert proc.snapshot()["interval_ms"] == 250

    async def test_remote_upstream_needs_a_pid(self) -> None:
        """proc mode with an upstream on another host cannot find it by port, and says so."""
        tel = ProcTelemetry(
            "http://10.1.2.3:8080", interval_ms=50, ring=10, clock=time.perf_counter, on_event=None
        )
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["state"] == "restarting")
        finally:
            await tel.close()
        assert "upstream_pid" in tel.snapshot()["last_error"]


# --- /proc ---------------------------------------------------------------------------------


class TestProcParsing:
    def test_stat_ticks(self) -> None:
        """utime + stime are fields 14 and 15, counted after the last ')' of the name."""
        fields = [str(n) for n in range(3, 53)]  # fields 3.. of the line, valued by their number
        text = f"1234 (llama (server) x) {' '.join(['S', *fields[1:]])}\n"
        assert stat_ticks(text) == 14 + 15

    def test_stat_ticks_of_this_process(self) -> None:
        """This process's own stat parses, and matches os.times() within a tick."""
        ticks = stat_ticks(Path("/proc/self/stat").read_text())
        times = os.times()
        hz = os.sysconf("SC_CLK_TCK")
        assert abs(ticks - round((times.user + times.system) * hz)) <= 2

    def test_bad_stat(self) -> None:
        """A text that is not /proc/PID/stat is an error, not a number."""
        with pytest.raises(ValueError):
            stat_ticks("no parenthesis here")

    def test_cpu_ms_between(self) -> None:
        """CPU ms over [t0, t1] is the difference of the interpolated readings."""
        readings = [(0.0, 100.0), (1.0, 300.0), (2.0, 300.0)]
        assert cpu_ms_between(readings, 0.5, 1.5) == 100.0
        assert cpu_ms_between(readings, 1.0, 2.0) == 0.0
        assert cpu_ms_between(readings, -1.0, 1.0) is None
        assert cpu_ms(250, 100) == 2500.0

    def test_listening_inodes_and_links(self) -> None:
        """A listening socket of this process is found in /proc/net/tcp and its fd link."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            inodes = listening_inodes(Path("/proc/net/tcp").read_text(), port)
            links = {os.readlink(f"/proc/self/fd/{s.fileno()}")}
        assert len(inodes) == 1
        assert {socket_inode(link) for link in links} == inodes
        assert socket_inode("pipe:[123]") is None
        assert listening_inodes(Path("/proc/net/tcp").read_text(), port) == set()

    def test_find_pid_by_port(self, tmp_path: Path) -> None:
        """The child process listening on a port is found by that port (IPv4 and IPv6)."""
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with listening_child(family, host, tmp_path) as (pid, port):
                assert find_pid_by_port(port) == pid


LISTENER = """
import socket, sys, time
s = socket.socket(int(sys.argv[1]))
s.bind((sys.argv[2], 0))
s.listen()
open(sys.argv[3], "w").write(str(s.getsockname()[1]))
time.sleep(60)
"""


@contextmanager
def listening_child(family: int, host: str, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A child process listening on a free port: (pid, port) while in the ``with``."""
    port_file = tmp_path / f"port-{int(family)}"
    child = subprocess.Popen([sys.executable, "-c", LISTENER, str(int(family)), host, port_file])
    try:
        deadline = time.monotonic() + 10
        while not (port_file.exists() and port_file.read_text()):
            assert time.monotonic() < deadline, "the child did not listen in time"
            time.sleep(0.01)
        yield child.pid, int(port_file.read_text())
    finally:
        child.kill()
        child.wait()


# --- the real llama-server -------------------------------------------------------------------


@pytest.fixture
def proc_telemetry(llama_server: LlamaServer) -> Iterator[ProcTelemetry]:
    """proc telemetry for the real llama-server, its pid found by its port."""
    yield ProcTelemetry(
        llama_server.url, interval_ms=50, ring=1000, clock=time.perf_counter, on_event=None
    )


async def measured(tel: ProcTelemetry, work: Callable[[], Awaitable[None]]) -> float | None:
    """The upstream CPU ms ``tel`` gives for the time ``work`` took, asked once two more
    readings came in: a record waits for its reading two intervals at most, which a loaded
    machine can miss, and that wait is not what these tests pin."""
    t0 = time.perf_counter()
    await work()
    t1 = time.perf_counter()
    seen = tel.snapshot()["samples"]
    await until(lambda: tel.snapshot()["samples"] >= seen + 2)
    out = await tel.sample(t0, t1, tokens=None)
    value = out.upstream_cpu_ms
    assert value is None or isinstance(value, float)
    return value


@pytest.mark.real
class TestProcReal:
    def test_pid_by_port(self, llama_server: LlamaServer) -> None:
        """The process listening on llama-server's port is llama-server's own."""
        assert llama_server.process is not None
        assert find_pid_by_port(llama_server.port) == llama_server.process.pid

    async def test_completion_costs_cpu_idle_does_not(
        self, llama_server: LlamaServer, proc_telemetry: ProcTelemetry
    ) -> None:
        """A completion request shows upstream CPU time, an idle interval about none, and the
        gauge is the process's whole CPU time so far."""
        tel = proc_telemetry
        await tel.start()
        try:
            await until(lambda: tel.snapshot()["samples"] >= 2)
            assert llama_server.process is not None
            assert tel.snapshot()["pid"] == llama_server.process.pid
            async with aiohttp.ClientSession() as session:

                async def complete() -> None:
                    body = {
                        "messages": [{"role": "user", "content": "Count from one to twenty."}],
                        "max_tokens": 48,
                        "temperature": 0,
                    }
                    url = f"{llama_server.url}/v1/chat/completions"
                    async with session.post(url, json=body) as resp:
                        assert resp.status == 200
                        await resp.read()

                busy = await measured(tel, complete)
            idle = await measured(tel, lambda: asyncio.sleep(0.5))
            gauges = tel.gauges()
        finally:
            await tel.close()
        assert busy is not None and busy > 0
        assert idle is not None
        hz = os.sysconf("SC_CLK_TCK")
        assert idle <= 2 * 1000 / hz  # two clock ticks of rounding at most
        assert busy > idle
        assert gauges["upstream_cpu_s"] >= busy / 1000  # the total since llama-server started
