"""Step 4, robot load: many concurrent clients, each sending back-to-back streamed requests
paced at 30 tok/s; events/s, per-event delay, and the streams one core carries."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from bench.overhead.client import chat_body, stamped_stream
from bench.overhead.constants import ROBOT_RATE
from bench.overhead.percentiles import summary
from bench.overhead.rig import Bench


def _relay_cost(out: dict[str, Any], relay_cpu: float, events: int, secs: float) -> None:
    """Add a relay's CPU figures to ``out``, and the streams one core carries at 30 tok/s."""
    per_event = relay_cpu / events
    out["cpu_s"]["proxy"] = relay_cpu
    out["proxy_cpu_share_of_one_core"] = relay_cpu / secs
    out["proxy_cpu_us_per_event"] = per_event * 1e6
    out["streams_per_core_at_30_tok_s"] = 1 / (per_event * ROBOT_RATE)


async def robots(bench: Bench, mode: str, concurrency: int, duration: float) -> dict[str, Any]:
    """``concurrency`` robots streaming through ``mode`` for ``duration`` seconds."""
    import aiohttp

    a = bench.args
    body = chat_body(a.robot_tokens, True, interval_ms=1000 / ROBOT_RATE, stamp=True)
    delays: list[float] = []
    counts = {"events": 0, "requests": 0}
    url = bench.url(mode)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.monotonic() + duration

        async def robot() -> None:
            await asyncio.sleep(bench.rng.uniform(0, 1.0))  # stagger the starts
            while time.monotonic() < deadline:
                got = await stamped_stream(session, url, body, delays)
                counts["events"] += got  # not `+= await`: that loses concurrent updates
                counts["requests"] += 1

        gc.collect()
        cpu0 = bench.cpu_all()
        t0 = time.perf_counter()
        await asyncio.gather(*(robot() for _ in range(concurrency)))
        secs = time.perf_counter() - t0
        cpu1 = bench.cpu_all()
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu1}
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "tokens_per_request": a.robot_tokens,
        "rate_tok_s": ROBOT_RATE,
        "seconds": secs,
        "requests": counts["requests"],
        "events": counts["events"],
        "events_per_s": counts["events"] / secs,
        "delay_ms": summary(delays),
        "cpu_s": {"upstream": cpu["upstream"], "client": cpu["client"]},
    }
    if mode != "direct":
        _relay_cost(out, cpu[mode], counts["events"], secs)
    return out


async def measure_robot_load(bench: Bench) -> dict[str, Any]:
    """Each concurrency level, each path in turn (direct first, then the relays)."""
    a = bench.args
    out: dict[str, Any] = {"levels": {}}
    for c in a.robot_concurrency:
        level: dict[str, Any] = {}
        for m in bench.modes:
            level[m] = await robots(bench, m, c, a.robot_seconds)
        for m in bench.proxies:
            level[m]["added_delay_ms"] = {
                q: level[m]["delay_ms"][q] - level["direct"]["delay_ms"][q]
                for q in ("p50", "p90", "p99")
            }
        out["levels"][str(c)] = level
    for m in bench.proxies:  # the headline: the least streams per core of all levels
        out[f"{m}_streams_per_core_at_30_tok_s"] = min(
            lv[m]["streams_per_core_at_30_tok_s"] for lv in out["levels"].values()
        )
    return out
