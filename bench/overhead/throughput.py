"""Step 3, throughput of one long stream: as fast as the upstream writes it, several runs
per path in random order; events/s, the ratio to direct, the relays' CPU per event."""

from __future__ import annotations

import gc
import statistics
from typing import Any

from bench.overhead.client import chat_body, drain_stream
from bench.overhead.rig import Bench
from tests.fakes import DONE, llama_event_count


async def _one_run(
    bench: Bench, mode: str, body: bytes, n_events: int
) -> tuple[dict[str, float], int]:
    """One long stream through ``mode``: its figures, and the bytes received."""
    gc.collect()
    cpu0 = bench.cpu_all()
    secs, size, tail = await drain_stream(bench.session, bench.url(mode), body)
    cpu1 = bench.cpu_all()
    if not tail.endswith(DONE):
        raise RuntimeError(f"{mode}: long stream did not end with [DONE]")
    run = {
        "seconds": secs,
        "events_per_s": n_events / secs,
        "upstream_cpu_s": cpu1["upstream"] - cpu0["upstream"],
        "client_cpu_s": cpu1["client"] - cpu0["client"],
    }
    if mode != "direct":
        run["proxy_cpu_s"] = cpu1[mode] - cpu0[mode]
        run["proxy_cpu_us_per_event"] = run["proxy_cpu_s"] / n_events * 1e6
    return run, size


def _mode_entry(
    runs: list[dict[str, float]], direct: list[dict[str, float]], n_events: int, relayed: bool
) -> dict[str, Any]:
    """Median and best events/s of a path; for a relay also the ratios to direct and CPU."""
    eps = [r["events_per_s"] for r in runs]
    entry: dict[str, Any] = {
        "runs": runs,
        "events_per_s_median": statistics.median(eps),
        "events_per_s_best": max(eps),
    }
    if relayed:
        entry["ratio_median"] = entry["events_per_s_median"] / statistics.median(
            r["events_per_s"] for r in direct
        )
        entry["ratio_best"] = entry["events_per_s_best"] / max(r["events_per_s"] for r in direct)
        cpu = [r["proxy_cpu_us_per_event"] for r in runs]
        entry["proxy_cpu_us_per_event_median"] = statistics.median(cpu)
        entry["proxy_cpu_total_s"] = sum(r["proxy_cpu_s"] for r in runs)
        entry["proxy_cpu_us_per_event_all_runs"] = (
            entry["proxy_cpu_total_s"] / (n_events * len(runs)) * 1e6
        )
    return entry


async def measure_throughput(bench: Bench) -> dict[str, Any]:
    """A warm-up stream per path, then ``long_runs`` rounds of one long stream per path."""
    a = bench.args
    body = chat_body(a.long_tokens, True)
    n_events = llama_event_count(a.long_tokens)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in bench.modes}
    sizes: set[int] = set()
    await drain_stream(bench.session, bench.url("direct"), body)  # warm-up
    for m in bench.proxies:
        await drain_stream(bench.session, bench.url(m), body)
    for _ in range(a.long_runs):
        for m in bench.shuffled_modes():
            run, size = await _one_run(bench, m, body, n_events)
            sizes.add(size)
            runs[m].append(run)
    if len(sizes) != 1:
        raise RuntimeError(f"long stream sizes differ: {sizes}")
    return {
        "tokens": a.long_tokens,
        "sse_events": n_events,
        "bytes": sizes.pop(),
        "runs_per_mode": a.long_runs,
        "headline": "median of runs",
        "modes": {
            m: _mode_entry(runs[m], runs["direct"], n_events, m != "direct") for m in bench.modes
        },
    }
