"""Step 6 (``--profile``): py-spy on the asyncio proxy during back-to-back long streams, the
robot load and back-to-back short requests; raw stacks summarised, and a flame graph of the
long stream (files in bench/results/)."""

from __future__ import annotations

import asyncio
import shlex
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.overhead.client import chat_body, drain_stream, timed_request
from bench.overhead.constants import PY, ROOT
from bench.overhead.processes import Proc
from bench.overhead.profile_stacks import summarize_raw
from bench.overhead.rig import Bench
from bench.overhead.robots import robots

Workload = Callable[[float], Awaitable[object]]


@dataclass(frozen=True)
class Profiler:
    """py-spy attached to one proxy process, writing into ``results_dir``."""

    pyspy: str
    proxy: Proc
    seconds: int
    rate: int
    results_dir: Path

    def command(self, fmt: str, target: Path, native: bool) -> list[str]:
        cmd = [
            self.pyspy,
            "record",
            "--pid",
            str(self.proxy.pid),
            "--duration",
            str(self.seconds),
            "--rate",
            str(self.rate),
            "--format",
            fmt,
            "-o",
            str(target),
        ]
        return [*cmd, "--native"] if native else cmd

    async def record(self, name: str, fmt: str, native: bool, workload: Workload) -> dict[str, Any]:
        """Sample the proxy while ``workload`` runs; the file, the command, the proxy's CPU
        share, and (raw format) the summarised stacks or the error."""
        suffix = ".svg" if fmt == "flamegraph" else ".raw.txt"
        target = self.results_dir / f"profile-{name}{suffix}"
        cmd = self.command(fmt, target, native)
        spy = await asyncio.create_subprocess_exec(
            *cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        await asyncio.sleep(1.0)  # let it attach
        cpu0, t0 = self.proxy.cpu(), time.perf_counter()
        await workload(self.seconds - 1.5)
        cpu1, t1 = self.proxy.cpu(), time.perf_counter()
        _, err = await spy.communicate()
        entry: dict[str, Any] = {
            "file": str(target.relative_to(ROOT)),
            "command": shlex.join(cmd),
            "native": native,
            "proxy_cpu_share": (cpu1 - cpu0) / (t1 - t0),
        }
        if spy.returncode != 0 or not target.exists():
            entry["error"] = err.decode(errors="replace")[-500:]
        elif fmt == "raw":
            entry.update(summarize_raw(target))
        return entry


def workloads(bench: Bench) -> dict[str, Workload]:
    """What the proxy does while sampled: ``long-stream``, ``robots``, ``requests``."""
    a = bench.args
    long_body = chat_body(a.long_tokens, True)
    kinds = [chat_body(a.stream_tokens, True), chat_body(a.stream_tokens, False)]

    async def long_streams(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await drain_stream(bench.session, bench.url("proxy"), long_body)

    async def robot_load(seconds: float) -> None:
        await robots(bench, "proxy", max(a.robot_concurrency), seconds)

    async def requests(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for body in kinds:
                await timed_request(bench.session, bench.url("proxy"), body)

    return {"long-stream": long_streams, "robots": robot_load, "requests": requests}


def find_pyspy() -> str | None:
    """py-spy next to this Python, else on PATH."""
    return shutil.which("py-spy", path=str(Path(PY).parent)) or shutil.which("py-spy")


async def profile(bench: Bench, results_dir: Path) -> dict[str, Any]:
    """Profile the asyncio proxy with py-spy during the long-stream run and the robot load."""
    pyspy = find_pyspy()
    if pyspy is None:
        return {"error": "py-spy not installed (.venv/bin/pip install py-spy)"}
    a = bench.args
    spy = Profiler(pyspy, bench.proxies["proxy"], a.profile_seconds, a.profile_rate, results_dir)
    work = workloads(bench)
    out: dict[str, Any] = {"py_spy": pyspy, "rate_hz": a.profile_rate, "seconds": a.profile_seconds}
    out["long_stream_raw"] = await spy.record("long-stream", "raw", True, work["long-stream"])
    if "error" in out["long_stream_raw"]:  # --native may be refused: try without
        out["long_stream_raw"] = await spy.record("long-stream", "raw", False, work["long-stream"])
    native = out["long_stream_raw"].get("native", False)
    out["robots_raw"] = await spy.record("robots", "raw", native, work["robots"])
    out["requests_raw"] = await spy.record("requests", "raw", native, work["requests"])
    svg = await spy.record("long-stream", "flamegraph", False, work["long-stream"])
    out["long_stream_svg"] = {k: svg[k] for k in ("file", "command") if k in svg}
    if "error" in svg:
        out["long_stream_svg"]["error"] = svg["error"]
    return out
