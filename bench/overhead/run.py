"""One run of the benchmark: start the fake upstream, the proxies and the references, run
the chosen steps with the machine's load around each, and collect the results (the dict
that becomes the JSON file and the report)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.overhead.client import PATH
from bench.overhead.constants import BARE, LEAN, REFERENCES, RESULTS_DIR, SPLICE
from bench.overhead.event_delay import measure_event_delay
from bench.overhead.latency import measure_latency
from bench.overhead.machine import command_line, machine_cpu, machine_info
from bench.overhead.processes import (
    Proc,
    start_proxy,
    start_reference,
    start_upstream,
    uses_uvloop,
    wait_ready,
)
from bench.overhead.profile import profile
from bench.overhead.rig import Bench
from bench.overhead.robots import measure_robot_load
from bench.overhead.throughput import measure_throughput
from bench.overhead.tracker_cost import tracker_cpu
from proxy.core.timestamps import iso_utc

Step = Callable[[Bench], Awaitable[dict[str, Any]]]
STEP_FUNCTIONS: list[tuple[str, Step]] = [
    ("latency", measure_latency),
    ("event_delay", measure_event_delay),
    ("throughput", measure_throughput),
    ("robots", measure_robot_load),
]


def busy_cores_before_start() -> float:
    """How busy the machine is (others' processes) over 2 s before anything starts; warn
    when it is more than a tenth of a core."""
    m0 = machine_cpu()
    time.sleep(2.0)
    busy = (machine_cpu()["busy"] - m0["busy"]) / 2.0
    if busy > 0.1:
        print(
            f"warning: the machine is already busy ({busy:.2f} "
            "cores) before the bench starts: results will be noisy",
            file=sys.stderr,
        )
    return busy


def _progress(started: float, what: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f} s] {what} ...", file=sys.stderr, flush=True)


def _relays_wanted(args: argparse.Namespace, want_uvloop: bool) -> list[tuple[str, bool]]:
    """(name, is a proxy on uvloop) of the proxies, then (name, False) of the references."""
    wanted = [("proxy", False)] + ([("proxy-uvloop", True)] if want_uvloop else [])
    if not args.no_bare:
        wanted.append((BARE, False))
    if not args.no_lean and importlib.util.find_spec("httptools") is not None:
        wanted.append((LEAN, False))
    if not args.no_splice:
        wanted.append((SPLICE, False))
    return wanted


def start_relays(
    args: argparse.Namespace, upstream: Proc, tmp: Path, want_uvloop: bool, procs: list[Proc]
) -> dict[str, Proc]:
    """Start every relay in front of ``upstream`` (each also appended to ``procs``)."""
    config = tmp / "config.toml"
    # The default pool (16) would queue the robot load inside the proxy.
    text = f"[upstream]\nmax_connections = {max(args.robot_concurrency) + 16}\n"
    if args.no_attribution:  # a diagnostic: the fake upstream answers its look-ups with 404
        text += "[accounting]\nattribution = false\n"
    config.write_text(text)
    proxies: dict[str, Proc] = {}
    for mode, uv in _relays_wanted(args, want_uvloop):
        if mode in REFERENCES:
            proxies[mode] = start_reference(mode, upstream.url)
        else:
            log = tmp / f"{mode}.jsonl" if args.log_file else None
            proxies[mode] = start_proxy(mode, upstream.url, config, log, uv)
        procs.append(proxies[mode])
    return proxies


async def wait_all_ready(session: Any, upstream: Proc, proxies: dict[str, Proc]) -> None:
    """Wait until every process answers; check that the uvloop proxy runs uvloop."""
    await wait_ready(session, upstream, PATH.replace("chat/completions", "models"))
    for proc in proxies.values():
        await wait_ready(session, proc, "/health")
        if proc.name == "proxy-uvloop" and not uses_uvloop(proc.pid):
            raise RuntimeError("the uvloop proxy does not run uvloop")


def run_header(
    args: argparse.Namespace, stamp: datetime, machine: dict[str, Any], bench: Bench
) -> dict[str, Any]:
    """What the results say about the run before any step: time, command, machine, args,
    paths and their pids."""
    return {
        "timestamp": iso_utc(stamp, timespec="seconds"),
        "command": command_line(),
        "machine": machine,
        "args": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "role"
        },
        "proxy_modes": list(bench.proxies),
        "processes": {
            "client_pid": os.getpid(),
            "upstream_pid": bench.upstream.pid,
            **{f"{m}_pid": p.pid for m, p in bench.proxies.items()},
        },
        "proxy_log": "stdout to /dev/null" + (" + --log-file (temp file)" if args.log_file else ""),
    }


async def run_step(bench: Bench, step: Step) -> dict[str, Any]:
    """One step's results, with its duration and the machine's CPU use during it (the
    bench's processes and the others)."""
    t0, m0, c0 = time.perf_counter(), machine_cpu(), bench.cpu_all()
    out = await step(bench)
    t1, m1, c1 = time.perf_counter(), machine_cpu(), bench.cpu_all()
    ours = sum(c1[k] - c0[k] for k in c1)
    out["step_seconds"] = t1 - t0
    out["machine_cpu_s"] = {
        "busy": m1["busy"] - m0["busy"],
        "steal": m1["steal"] - m0["steal"],
        "bench_processes": ours,
        "other_processes": m1["busy"] - m0["busy"] - ours,
    }
    return out


async def run_steps(bench: Bench, res: dict[str, Any], started: float) -> None:
    """The chosen steps into ``res``; then, if asked, the profile."""
    args = bench.args
    for name, step in STEP_FUNCTIONS:
        if name in args.steps:
            _progress(started, name)
            res[name] = await run_step(bench, step)
    _progress(started, "tracker")
    if "tracker" in args.steps:
        res["tracker"] = tracker_cpu(args.long_tokens, args.tracker_reps)
    res["runtime_s"] = time.perf_counter() - started
    if args.profile:
        _progress(started, "profile")
        res["profile"] = await profile(bench, RESULTS_DIR)
        res["runtime_with_profile_s"] = time.perf_counter() - started


async def proxy_stats_requests(session: Any, proxies: dict[str, Proc]) -> dict[str, Any]:
    """Each timing-proxy's ``requests`` count from its ``/stats`` (not the references)."""
    out: dict[str, Any] = {}
    for proc in proxies.values():
        if proc.name in REFERENCES:
            continue
        async with session.get(proc.admin_url + "/stats") as resp:
            stats = await resp.json()
        out[proc.name] = stats.get("requests")
    return out


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run; every process it started is stopped at the end."""
    import aiohttp

    started = time.perf_counter()
    stamp = datetime.now(UTC)
    machine = machine_info()
    machine["busy_cores_before_start"] = busy_cores_before_start()
    want_uvloop = args.uvloop
    if want_uvloop and machine["uvloop"] is None:
        print("uvloop is not importable: running the asyncio proxy only", file=sys.stderr)
        want_uvloop = False
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    procs: list[Proc] = []
    try:
        upstream = start_upstream(args.keep_streams_alive)
        procs.append(upstream)
        proxies = start_relays(args, upstream, tmp, want_uvloop, procs)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as plain,
        ):
            await wait_all_ready(session, upstream, proxies)
            bench = Bench(args, upstream, proxies, session, plain, random.Random(args.seed))
            res = run_header(args, stamp, machine, bench)
            await run_steps(bench, res, started)
            if res_stats := await proxy_stats_requests(session, proxies):
                res["proxy_stats_requests"] = res_stats
        return res
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
