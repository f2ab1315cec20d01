"""One interleaved run over a set of paths, shared by the relay and peers benches: the fake
upstream, every path started (one that cannot be installed or started is skipped with the
reason), latency and long stream with the machine's other load around each, each path's
memory after, and the results dict (the JSON file and the report)."""

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.overhead.machine import command_line, first_line, machine_cpu, machine_info
from bench.overhead.measure import (
    KINDS,
    Rig,
    Target,
    chat_body,
    measure_latency,
    measure_long_stream,
)
from bench.overhead.procs import PY, ROOT, Proc, start_proxy, start_role, wait_ready
from bench.overhead.report import BARE, BASELINE, PROXY
from proxy.core.timestamps import iso_utc
from tests.fakes import llama_event_count, llama_plain_body

SIZE_HELP = {
    "rounds": "latency rounds per kind",
    "warmup": "warm-up requests per kind and path",
    "long_tokens": "tokens of the long stream",
    "long_runs": "long streams per path, 0: none",
    "tracker_reps": "in-process repetitions, 0: none",
}


def arg_parser(
    description: str, name: str, sizes: dict[str, tuple[int, int]]
) -> argparse.ArgumentParser:
    """The options the relay and peers benches share; ``sizes``: (full run, ``--quick``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: small sizes, figures mean little"
    )
    p.add_argument("--out", type=Path, help=f"JSON file (default bench/results/{name}-<UTC>.json)")
    p.add_argument("--seed", type=int, default=1, help="the random order of the paths")
    g = p.add_argument_group("sizes (full run; --quick)")
    for size, (full, quick) in sizes.items():
        g.add_argument(
            "--" + size.replace("_", "-"), type=int, help=f"{SIZE_HELP[size]} ({full}; {quick})"
        )
    g.add_argument("--block", type=int, default=25, help="rounds per block of one kind (25)")
    g.add_argument("--stream-tokens", type=int, default=97, help="97 tokens = a 100-event stream")
    g.add_argument("--plain-tokens", type=int, default=20, help="20 tokens = a 645-byte JSON reply")
    return p


def parse_sizes(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, sizes: dict[str, tuple[int, int]]
) -> argparse.Namespace:
    """The options; a size not given takes its full-run or ``--quick`` default."""
    args = p.parse_args(argv)
    for size, (full, quick) in sizes.items():
        if getattr(args, size) is None:
            setattr(args, size, quick if args.quick else full)
    return args


class Unavailable(RuntimeError):
    """A path that cannot be installed or started here; the message says why (one line)."""


@dataclass
class Started:
    """A started path: its process, the headers its requests carry, the URL that answers
    once it is up (default: the path's ``/health``), its stderr (the reason of a failure)."""

    proc: Proc
    headers: dict[str, str] = field(default_factory=dict)
    ready_url: str = ""
    stderr_log: Path | None = None


@dataclass(frozen=True)
class PathSpec:
    """A path of the run: how to start it (upstream URL, temp dir), what it does beyond
    forwarding, whether it is judged among those that do more than forward, its version."""

    launch: Callable[[str, Path], Started]
    does: str
    analyses: bool
    version: str | None = None


def start_timing_proxy(upstream: str, tmp: Path, name: str = PROXY, tree: Path = ROOT) -> Started:
    proc = start_proxy(name, upstream, tmp, tree=tree)
    return Started(proc, ready_url=proc.admin_url + "/stats")  # answers once the proxy listens


def baseline_path(tree: Path) -> PathSpec:
    """timing-proxy as the checkout ``tree`` has it; checked: ``python -m proxy`` there
    imports ``tree``'s package. Its version: the tree's commit."""
    probe = [PY, "-c", "import proxy; print(proxy.__file__)"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    got = subprocess.run(probe, cwd=tree, env=env, capture_output=True, text=True).stdout
    if not Path(got.strip()).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"python -m proxy in {tree} does not import its proxy/: {got!r}")
    commit = first_line(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], str(tree))
    launch = partial(start_timing_proxy, name=BASELINE, tree=tree)
    return PathSpec(launch, f"the same, as the code at {commit} has it", True, f"{commit} ({tree})")


def start_bare_relay(upstream: str, tmp: Path) -> Started:
    return Started(start_role(BARE, "--upstream", upstream))


DIRECT = "client → fake upstream, no process between"
RELAYS = {
    BARE: PathSpec(start_bare_relay, "reference: aiohttp relay loop, nothing else", False),
    PROXY: PathSpec(
        start_timing_proxy,
        "parses every event: timing record per request, /stats, metrics, log line",
        True,
    ),
}


def _last_line(path: Path | None) -> str:
    text = path.read_text(errors="replace").strip() if path and path.exists() else ""
    return f" (stderr: {text.splitlines()[-1][:200]})" if text else ""


async def _start_all(
    session: Any, paths: dict[str, PathSpec], upstream: Proc, tmp: Path, procs: list[Proc]
) -> tuple[dict[str, Started], dict[str, str]]:
    """Every path that starts and answers (LiteLLM takes up to a minute), and why each other
    one did not."""
    up: dict[str, Started] = {}
    skipped: dict[str, str] = {}
    for name, spec in paths.items():
        try:
            started = await asyncio.to_thread(spec.launch, upstream.url, tmp)
            procs.append(started.proc)
            try:
                ready = started.ready_url or started.proc.url + "/health"
                await wait_ready(session, started.proc, ready, 120.0)
            except RuntimeError as exc:
                started.proc.stop()
                raise Unavailable(f"{exc}{_last_line(started.stderr_log)}") from exc
            up[name] = started
        except Unavailable as exc:
            skipped[name] = str(exc)
            print(f"[bench] {name} skipped: {exc}", file=sys.stderr, flush=True)
    return up, skipped


def _targets(upstream: Proc, started: dict[str, Started]) -> dict[str, Target]:
    import aiohttp

    def sessions(headers: dict[str, str]) -> dict[str, Any]:
        new = aiohttp.ClientSession
        return {k: new(connector=aiohttp.TCPConnector(limit=0), headers=headers) for k in KINDS}

    out = {"direct": Target("direct", upstream.url, None, sessions({}))}
    for name, s in started.items():
        out[name] = Target(name, s.proc.url, s.proc, sessions(s.headers))
    return out


def _ours(rig: Rig, upstream: Proc) -> float:
    """CPU seconds so far of the bench's own processes: the paths, the upstream, the client."""
    return sum(rig.cpu_all().values()) + upstream.cpu() + time.process_time()


async def _steps(rig: Rig, upstream: Proc, args: argparse.Namespace, res: dict[str, Any]) -> None:
    """Latency, then the long stream; the cores other processes kept busy meanwhile."""
    t0, m0, c0 = time.perf_counter(), machine_cpu(), _ours(rig, upstream)
    kinds = {
        "stream": chat_body(args.stream_tokens, True),
        "plain": chat_body(args.plain_tokens, False),
    }
    print(
        f"[bench] latency: {args.rounds} rounds per kind, {len(rig.targets)} paths", file=sys.stderr
    )
    lat = await measure_latency(rig, kinds, args.rounds, args.warmup, args.block)
    lat["stream_sse_events"] = llama_event_count(args.stream_tokens)
    lat["plain_body_bytes"] = len(llama_plain_body(args.plain_tokens))
    res["latency"] = lat
    if args.long_runs > 0:
        print(f"[bench] long stream: {args.long_tokens} tokens", file=sys.stderr, flush=True)
        res["long_stream"] = await measure_long_stream(rig, args.long_tokens, args.long_runs)
    others = machine_cpu() - m0 - (_ours(rig, upstream) - c0)
    res["other_cores"] = others / (time.perf_counter() - t0)
    res["rss_mib"] = {n: t.proc.rss_mib() if t.proc else None for n, t in rig.targets.items()}


async def run_paths(
    args: argparse.Namespace, paths: dict[str, PathSpec], script: str
) -> dict[str, Any]:
    """The whole run over ``direct`` and ``paths``; every process it started is stopped."""
    import aiohttp

    started_at, stamp = time.perf_counter(), datetime.now(UTC)
    machine = machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    procs: list[Proc] = []
    targets: dict[str, Target] = {}
    try:
        upstream = start_role("upstream")
        procs.append(upstream)
        async with aiohttp.ClientSession() as probe:
            await wait_ready(probe, upstream, upstream.url + "/v1/models")
            up, skipped = await _start_all(probe, paths, upstream, tmp, procs)
        targets = _targets(upstream, up)
        rig = Rig(dict(targets), random.Random(args.seed))
        res: dict[str, Any] = {
            "timestamp": iso_utc(stamp, timespec="seconds"),
            "command": command_line(script),
            "machine": machine,
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "role", "upstream")},
            "order": ["direct", *paths],
            "paths": {"direct": {"does": DIRECT, "analyses": False}}
            | {n: {k: v for k, v in vars(s).items() if k != "launch"} for n, s in paths.items()},
            "skipped": skipped,
        }
        await _steps(rig, upstream, args, res)
        res["failed"] = rig.failed
        res["runtime_s"] = time.perf_counter() - started_at
        res["load"] = {"before": machine["load_average"], "after": os.getloadavg()}
        res["load"]["other_cores"] = res.pop("other_cores")
        return res
    finally:
        for t in targets.values():
            for s in t.sessions.values():
                await s.close()
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
