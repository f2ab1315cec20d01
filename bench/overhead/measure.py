"""What the relay and peers benches measure, path by path, in one interleaved run: latency per
request (a stream and a JSON reply, in alternating blocks of rounds, every path once per
round in a fresh random order) and the throughput of one long stream. A path that fails a
request leaves the run with the reason; ``direct`` never does."""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.overhead.procs import Proc
from tests.fakes import CHAT_PATH, DONE, llama_event_count

KINDS = ("stream", "plain")
HEADERS = {"Content-Type": "application/json"}


def chat_body(tokens: int, stream: bool, interval_ms: float = 0.0) -> bytes:
    """A chat request for ``tokens`` tokens; ``interval_ms`` paces the fake's token events."""
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(max_tokens=tokens, stream=stream)
    if interval_ms:
        body["bench_interval_ms"] = interval_ms
    return orjson.dumps(body)


def pct(values: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0-100), linear interpolation between order statistics."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p90, p99 and mean of ``values``."""
    mean = statistics.fmean(values) if values else float("nan")
    return {"n": len(values), **{f"p{q}": pct(values, q) for q in (50, 90, 99)}, "mean": mean}


def added(path: list[float], direct: list[float]) -> dict[str, Any]:
    """What a path adds to direct: the differences of the p50s, p90s and p99s, and of the
    p50s in each quarter of the rounds."""
    q = max(1, len(direct) // 4)
    return {
        "median_diff": pct(path, 50) - pct(direct, 50),
        "p90_diff": pct(path, 90) - pct(direct, 90),
        "p99_diff": pct(path, 99) - pct(direct, 99),
        "quarters_p50": [
            pct(path[i : i + q], 50) - pct(direct[i : i + q], 50) for i in range(0, 4 * q, q)
        ],
    }


async def timed_request(session: Any, url: str, body: bytes) -> tuple[float, bytes]:
    """Wall time (ms) from sending to the last body byte, and the body; non-200 fails."""
    t0 = time.perf_counter_ns()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        data = await resp.read()
    ms = (time.perf_counter_ns() - t0) / 1e6
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
    return ms, data


async def drain_stream(session: Any, url: str, body: bytes) -> tuple[float, int, bytes]:
    """A long stream read as fast as it comes: seconds to the last byte, bytes, the tail."""
    size, tail = 0, b""
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            tail = (tail + chunk)[-32:]
    return time.perf_counter() - t0, size, tail


@dataclass
class Target:
    """One path: ``direct`` (no process) or a relay process, with a client session per kind
    (a stream ends with the upstream's close, so plain requests keep a pool of their own)."""

    name: str
    url: str
    proc: Proc | None
    sessions: dict[str, Any] = field(default_factory=dict)

    def cpu(self) -> float:
        return self.proc.cpu() if self.proc else 0.0


@dataclass
class Rig:
    """The live paths (``direct`` first), why others left the run, the random order."""

    targets: dict[str, Target]
    rng: random.Random
    failed: dict[str, str] = field(default_factory=dict)

    def shuffled(self) -> list[Target]:
        order = list(self.targets.values())
        self.rng.shuffle(order)
        return order

    def drop(self, name: str, why: str) -> None:
        if name == "direct":
            raise RuntimeError(f"direct path failed: {why}")
        self.targets.pop(name, None)
        self.failed[name] = why

    def cpu_all(self) -> dict[str, float]:
        return {n: t.cpu() for n, t in self.targets.items()}


async def _request(rig: Rig, t: Target, kind: str, body: bytes) -> tuple[float, bytes] | None:
    try:
        return await timed_request(t.sessions[kind], t.url + CHAT_PATH, body)
    except Exception as exc:  # any failure of a path: it leaves the run, the run goes on
        rig.drop(t.name, f"{kind} request failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None


class _Tally:
    """Per kind and path: wall times (ms, in round order), bodies equal to direct's, CPU s."""

    def __init__(self, names: list[str]) -> None:
        self.times: dict[str, dict[str, list[float]]] = {k: {n: [] for n in names} for k in KINDS}
        self.same = {k: dict.fromkeys(names, 0) for k in KINDS}
        self.cpu = {k: dict.fromkeys(names, 0.0) for k in KINDS}

    async def block(self, rig: Rig, kind: str, body: bytes, ref: bytes, n: int) -> None:
        """``n`` rounds of ``kind``; the paths' CPU over the block is that kind's."""
        cpu0 = rig.cpu_all()
        for _ in range(n):
            for t in rig.shuffled():
                if (got := await _request(rig, t, kind, body)) is not None:
                    self.times[kind][t.name].append(got[0])
                    self.same[kind][t.name] += got[1] == ref
        cpu1 = rig.cpu_all()
        for name in rig.targets:
            self.cpu[kind][name] += cpu1[name] - cpu0[name]

    def result(self, rig: Rig, kind: str, rounds: int) -> dict[str, Any]:
        times, out = self.times[kind], {}
        for name in rig.targets:
            out[name] = {
                "ms": summary(times[name]),
                "identical_to_direct": self.same[kind][name],
                "requests": len(times[name]),
                "cpu_us_per_request": self.cpu[kind][name] / rounds * 1e6,
            }
            if name != "direct":
                out[name]["added_ms"] = added(times[name], times["direct"])
        return out


async def measure_latency(
    rig: Rig, kinds: dict[str, bytes], rounds: int, warmup: int, block: int
) -> dict[str, Any]:
    """Warm-up (direct's bodies are the reference), then ``rounds`` rounds of each kind in
    alternating blocks of ``block`` rounds, so both kinds see the same drifts."""
    ref: dict[str, bytes] = {}
    for kind, body in kinds.items():
        for _ in range(max(1, warmup)):
            for t in rig.shuffled():
                got = await _request(rig, t, kind, body)
                if got is not None and t.name == "direct":
                    ref[kind] = got[1]
    tally = _Tally(list(rig.targets))
    gc.collect()
    t0, done = time.perf_counter(), 0
    while done < rounds:
        n = min(block, rounds - done)
        for kind, body in kinds.items():
            await tally.block(rig, kind, body, ref[kind], n)
        done += n
    return {
        "rounds": rounds,
        "warmup": warmup,
        "block": block,
        "seconds": time.perf_counter() - t0,
        "reference_bytes": {k: len(v) for k, v in ref.items()},
        "kinds": {kind: tally.result(rig, kind, rounds) for kind in kinds},
    }


async def _long_run(rig: Rig, t: Target, body: bytes, n_events: int) -> dict[str, Any] | None:
    gc.collect()
    cpu0 = t.cpu()
    try:
        secs, size, tail = await drain_stream(t.sessions["stream"], t.url + CHAT_PATH, body)
    except Exception as exc:  # a path that fails leaves the run
        rig.drop(t.name, f"long stream failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    cpu = t.cpu() - cpu0
    if not tail.endswith(DONE):
        rig.drop(t.name, f"long stream did not end with [DONE] ({size} bytes)")
        return None
    return {"seconds": secs, "bytes": size, "events_per_s": n_events / secs, "cpu_s": cpu}


async def measure_long_stream(rig: Rig, tokens: int, runs: int) -> dict[str, Any]:
    """A warm-up long stream per path, then ``runs`` rounds of one per path in random order;
    events/s = the upstream's events / time to the last byte (median of the runs)."""
    body, n_events = chat_body(tokens, True), llama_event_count(tokens)
    for t in rig.shuffled():
        await _long_run(rig, t, body, n_events)
    got: dict[str, list[dict[str, Any]]] = {n: [] for n in rig.targets}
    for _ in range(runs):
        for t in rig.shuffled():
            if (run := await _long_run(rig, t, body, n_events)) is not None:
                got[t.name].append(run)
    direct_eps = statistics.median(r["events_per_s"] for r in got["direct"])
    modes = {}
    for name in rig.targets:
        eps = statistics.median(r["events_per_s"] for r in got[name])
        modes[name] = {
            "runs": got[name],
            "events_per_s_median": eps,
            "ratio_to_direct": eps / direct_eps,
            "cpu_us_per_event_median": statistics.median(
                r["cpu_s"] / n_events * 1e6 for r in got[name]
            ),
            "same_size_as_direct": all(r["bytes"] == got["direct"][0]["bytes"] for r in got[name]),
        }
    return {"tokens": tokens, "sse_events": n_events, "runs_per_path": runs, "modes": modes}
