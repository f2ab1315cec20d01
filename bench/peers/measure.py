"""The two steps: latency per request (a 100-event stream and a JSON reply, interleaved) and
the long stream (20,000 events). The client reads of ``bench/overhead`` are used as they are;
each request goes to the path's own session, which carries the path's headers."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

from bench.overhead.client import chat_body, drain_stream, timed_request
from bench.overhead.latency import added
from bench.overhead.percentiles import summary
from bench.peers.rig import KINDS, Rig, Target
from tests.fakes import DONE, llama_event_count, llama_plain_body


def bodies(stream_tokens: int, plain_tokens: int) -> dict[str, bytes]:
    """The request of each kind."""
    return {
        "stream": chat_body(stream_tokens, True),
        "plain": chat_body(plain_tokens, False),
    }


async def _request(rig: Rig, t: Target, kind: str, body: bytes) -> tuple[float, bytes] | None:
    """One timed request; a failure drops the path from the run (``None``)."""
    try:
        return await timed_request(t.sessions[kind], t.url, body)
    except Exception as exc:  # any failure of a peer: it leaves the run, the run goes on
        rig.drop(t.name, f"{kind} request failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None


async def _warm_up(rig: Rig, kinds: dict[str, bytes], n: int) -> dict[str, bytes]:
    """``n`` requests of each kind to every path; the direct bodies (the reference)."""
    ref: dict[str, bytes] = {}
    for kind, body in kinds.items():
        for _ in range(max(1, n)):
            for t in rig.shuffled():
                got = await _request(rig, t, kind, body)
                if got is not None and t.name == "direct":
                    ref[kind] = got[1]
    return ref


class _Tally:
    """Per kind and path: wall times (ms, round order), bodies equal to direct's, CPU s."""

    def __init__(self, names: list[str]) -> None:
        self.times: dict[str, dict[str, list[float]]] = {k: {n: [] for n in names} for k in KINDS}
        self.same = {k: dict.fromkeys(names, 0) for k in KINDS}
        self.cpu = {k: dict.fromkeys(names, 0.0) for k in KINDS}


async def _block(rig: Rig, tally: _Tally, kind: str, body: bytes, ref: bytes, n: int) -> None:
    """``n`` rounds of ``kind``, each path once per round in a fresh random order; the paths'
    CPU over the block."""
    cpu0 = rig.cpu_all()
    for _ in range(n):
        for t in rig.shuffled():
            got = await _request(rig, t, kind, body)
            if got is None:
                continue
            tally.times[kind][t.name].append(got[0])
            tally.same[kind][t.name] += got[1] == ref
    cpu1 = rig.cpu_all()
    for name in rig.targets:
        tally.cpu[kind][name] += cpu1[name] - cpu0[name]


def _kind_result(rig: Rig, tally: _Tally, kind: str, rounds: int) -> dict[str, Any]:
    times = tally.times[kind]
    out: dict[str, Any] = {}
    for name in rig.targets:
        entry: dict[str, Any] = {
            "ms": summary(times[name]),
            "identical_to_direct": tally.same[kind][name],
            "requests": len(times[name]),
            "cpu_us_per_request": tally.cpu[kind][name] / rounds * 1e6,
        }
        if name != "direct":
            entry["added_ms"] = added(times[name], times["direct"])
        out[name] = entry
    return out


async def measure_latency(
    rig: Rig, kinds: dict[str, bytes], rounds: int, warmup: int, block: int
) -> dict[str, Any]:
    """Warm-up, then ``rounds`` rounds of each kind in alternating blocks of ``block`` rounds
    (so that both kinds see the same drifts, and each block's CPU belongs to one kind)."""
    ref = await _warm_up(rig, kinds, warmup)
    tally = _Tally(list(rig.targets))
    gc.collect()
    t0 = time.perf_counter()
    done = 0
    while done < rounds:
        n = min(block, rounds - done)
        for kind, body in kinds.items():
            await _block(rig, tally, kind, body, ref[kind], n)
        done += n
    return {
        "rounds": rounds,
        "warmup": warmup,
        "block": block,
        "seconds": time.perf_counter() - t0,
        "reference_bytes": {k: len(v) for k, v in ref.items()},
        "kinds": {kind: _kind_result(rig, tally, kind, rounds) for kind in kinds},
    }


async def _long_run(rig: Rig, t: Target, body: bytes, n_events: int) -> dict[str, Any] | None:
    gc.collect()
    cpu0 = t.cpu()
    try:
        secs, size, tail = await drain_stream(t.sessions["stream"], t.url, body)
    except Exception as exc:  # a peer that fails leaves the run
        rig.drop(t.name, f"long stream failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    cpu = t.cpu() - cpu0
    if not tail.endswith(DONE):
        rig.drop(t.name, f"long stream did not end with [DONE] ({size} bytes)")
        return None
    return {
        "seconds": secs,
        "bytes": size,
        "events_per_s": n_events / secs,
        "cpu_us_per_event": cpu / n_events * 1e6,
    }


async def measure_long_stream(rig: Rig, tokens: int, runs: int) -> dict[str, Any]:
    """One warm-up long stream per path, then ``runs`` rounds of one per path in random
    order; events/s is the upstream's event count over the time to the last byte."""
    body = chat_body(tokens, True)
    n_events = llama_event_count(tokens)
    for t in rig.shuffled():
        await _long_run(rig, t, body, n_events)
    got: dict[str, list[dict[str, Any]]] = {n: [] for n in rig.targets}
    for _ in range(runs):
        for t in rig.shuffled():
            run = await _long_run(rig, t, body, n_events)
            if run is not None:
                got[t.name].append(run)
    direct_eps = statistics.median(r["events_per_s"] for r in got["direct"])
    direct_bytes = got["direct"][0]["bytes"]
    modes: dict[str, Any] = {}
    for name in rig.targets:
        eps = statistics.median(r["events_per_s"] for r in got[name])
        modes[name] = {
            "runs": got[name],
            "events_per_s_median": eps,
            "ratio_to_direct": eps / direct_eps,
            "cpu_us_per_event_median": statistics.median(r["cpu_us_per_event"] for r in got[name]),
            "same_size_as_direct": all(r["bytes"] == direct_bytes for r in got[name]),
        }
    return {"tokens": tokens, "sse_events": n_events, "runs_per_path": runs, "modes": modes}


def plain_body_bytes(tokens: int) -> int:
    """Size of the upstream's JSON reply for ``tokens`` tokens."""
    return len(llama_plain_body(tokens))
