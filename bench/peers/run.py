"""One peers run: the fake upstream, every chosen path started (a peer that cannot be
installed or started is skipped with the reason), the two steps with the machine's load around
them, the memory of each path after, and the results dict (the JSON file and the report)."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.overhead.machine import machine_cpu, machine_info
from bench.overhead.processes import Proc, start_upstream, wait_ready
from bench.overhead.run import busy_cores_before_start
from bench.peers.install import PeerUnavailable
from bench.peers.launch import (
    KVPROF_REQUIREMENT,
    LITELLM_REQUIREMENT,
    MITMPROXY_REQUIREMENT,
    PATHS,
    PORTKEY_OVERRIDES,
    PORTKEY_PACKAGE,
    PORTKEY_VERSION,
    Started,
)
from bench.peers.measure import bodies, measure_latency, measure_long_stream, plain_body_bytes
from bench.peers.rig import KINDS, Rig, Target
from proxy.core.timestamps import iso_utc
from tests.fakes import llama_event_count

READY_TIMEOUT = 120.0
"""LiteLLM's proxy takes 20-60 s to import and start on this machine."""

VERSIONS = {
    "litellm": LITELLM_REQUIREMENT,
    "portkey": f"{PORTKEY_PACKAGE}@{PORTKEY_VERSION} (npm overrides {PORTKEY_OVERRIDES})",
    "kvprof": KVPROF_REQUIREMENT,
    "mitmproxy": MITMPROXY_REQUIREMENT,
}


def _progress(started: float, what: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f} s] {what}", file=sys.stderr, flush=True)


def _node_version() -> str | None:
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _last_line(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return f" (stderr: {lines[-1][:200]})" if lines else ""


async def _start_one(
    session: Any, name: str, upstream: Proc, tmp: Path, procs: list[Proc]
) -> Started:
    """Start ``name`` and wait until it answers; PeerUnavailable with the reason if not."""
    started = await asyncio.to_thread(PATHS[name].launch, upstream.url, tmp)
    procs.append(started.proc)
    try:
        await wait_ready(session, started.proc, started.ready_path, READY_TIMEOUT)
    except RuntimeError as exc:
        started.proc.stop()
        raise PeerUnavailable(f"{exc}{_last_line(started.stderr_log)}") from exc
    return started


async def start_paths(
    session: Any, names: list[str], upstream: Proc, tmp: Path, procs: list[Proc]
) -> tuple[dict[str, Started], dict[str, str]]:
    """Every path in ``names`` that starts, and why each other one did not."""
    up: dict[str, Started] = {}
    skipped: dict[str, str] = {}
    for name in names:
        try:
            up[name] = await _start_one(session, name, upstream, tmp, procs)
        except PeerUnavailable as exc:
            skipped[name] = str(exc)
            print(f"[peers] {name} skipped: {exc}", file=sys.stderr, flush=True)
    return up, skipped


def _targets(aiohttp: Any, upstream: Proc, started: dict[str, Started]) -> dict[str, Target]:
    """``direct`` and every started path, each with a session per kind."""

    def sessions(headers: dict[str, str]) -> dict[str, Any]:
        return {
            k: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers)
            for k in KINDS
        }

    out = {"direct": Target("direct", upstream.url, None, sessions({}))}
    for name, s in started.items():
        out[name] = Target(name, s.proc.url, s.proc, sessions(s.headers))
    return out


def _other_cores(m0: dict[str, float], m1: dict[str, float], ours: float, secs: float) -> float:
    """Cores busy with processes that are not the bench's over a step."""
    return (m1["busy"] - m0["busy"] - ours) / secs if secs > 0 else 0.0


def _ours(rig: Rig, upstream: Proc) -> float:
    return sum(rig.cpu_all().values()) + upstream.cpu() + time.process_time()


async def _steps(
    rig: Rig, upstream: Proc, args: argparse.Namespace, res: dict[str, Any], started: float
) -> None:
    load: dict[str, float] = {}
    _progress(started, f"latency: {args.rounds} rounds per kind over {len(rig.targets)} paths")
    m0, c0, t0 = machine_cpu(), _ours(rig, upstream), time.perf_counter()
    lat = await measure_latency(
        rig, bodies(args.stream_tokens, args.plain_tokens), args.rounds, args.warmup, args.block
    )
    lat["stream_sse_events"] = llama_event_count(args.stream_tokens)
    lat["plain_body_bytes"] = plain_body_bytes(args.plain_tokens)
    load["latency"] = _other_cores(
        m0, machine_cpu(), _ours(rig, upstream) - c0, time.perf_counter() - t0
    )
    res["latency"] = lat
    if args.long_runs > 0:
        _progress(started, f"long stream: {args.long_tokens} tokens, {args.long_runs} runs/path")
        m0, c0, t0 = machine_cpu(), _ours(rig, upstream), time.perf_counter()
        res["long_stream"] = await measure_long_stream(rig, args.long_tokens, args.long_runs)
        load["long_stream"] = _other_cores(
            m0, machine_cpu(), _ours(rig, upstream) - c0, time.perf_counter() - t0
        )
    res["rss_mib"] = {n: t.rss_mib() for n, t in rig.targets.items()}
    res["load_other_cores"] = load


def _paths_info(names: list[str]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "direct": {"does": "client → fake upstream, no process between", "analyses": False}
    }
    for n in names:
        spec = PATHS[n]
        info[n] = {"does": spec.does, "analyses": spec.analyses, "version": VERSIONS.get(n)}
    return info


async def run_peers(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The whole run; every process it started is stopped at the end."""
    import aiohttp

    started = time.perf_counter()
    stamp = datetime.now(UTC)
    machine = machine_info()
    machine["node"] = _node_version()
    machine["busy_cores_before_start"] = busy_cores_before_start()
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="peers-bench-"))
    procs: list[Proc] = []
    targets: dict[str, Target] = {}
    try:
        upstream = start_upstream(False)
        procs.append(upstream)
        async with aiohttp.ClientSession() as probe:
            await wait_ready(probe, upstream, "/v1/models")
            _progress(started, f"starting {', '.join(args.peers)}")
            up, skipped = await start_paths(probe, args.peers, upstream, tmp, procs)
        targets = _targets(aiohttp, upstream, up)
        rig = Rig(targets=dict(targets), rng=random.Random(args.seed))
        res: dict[str, Any] = {
            "timestamp": iso_utc(stamp, timespec="seconds"),
            "command": command,
            "machine": machine,
            "args": {k: v for k, v in vars(args).items() if k != "out"},
            "order": ["direct", *args.peers],
            "paths": _paths_info(args.peers),
            "skipped": skipped,
            "pids": {"upstream": upstream.pid, **{n: s.proc.pid for n, s in up.items()}},
        }
        await _steps(rig, upstream, args, res, started)
        res["failed"] = rig.failed
        res["runtime_s"] = time.perf_counter() - started
        res["load"] = {
            "before": list(load_before),
            "after": list(os.getloadavg()),
            "busy_cores_before_start": machine["busy_cores_before_start"],
            "other_cores": res.pop("load_other_cores"),
        }
        return res
    finally:
        for t in targets.values():
            for s in t.sessions.values():
                await s.close()
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
