"""Step 2, per-event forwarding delay: paced streams whose token events carry the upstream's
CLOCK_MONOTONIC; delay = arrival - stamp, added = proxied percentile - direct percentile."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.overhead.client import chat_body, stamped_stream
from bench.overhead.percentiles import pct, summary
from bench.overhead.rig import Bench


async def measure_event_delay(bench: Bench) -> dict[str, Any]:
    """``paced_rounds`` rounds of one paced stream per path, in random order per round; the
    relays' CPU per event (one wake-up per event)."""
    a = bench.args
    body = chat_body(a.paced_tokens, True, interval_ms=a.paced_interval_ms, stamp=True)
    delays: dict[str, list[float]] = {m: [] for m in bench.modes}
    cpu0 = bench.cpu_all()
    events: Counter[str] = Counter()
    for _ in range(a.paced_rounds):
        for m in bench.shuffled_modes():
            got = await stamped_stream(bench.session, bench.url(m), body, delays[m])
            events[m] += got
    cpu1 = bench.cpu_all()
    out: dict[str, Any] = {
        "streams_per_mode": a.paced_rounds,
        "tokens": a.paced_tokens,
        "interval_ms": a.paced_interval_ms,
        "direct_ms": summary(delays["direct"]),
    }
    for m in bench.proxies:
        out[f"{m}_ms"] = summary(delays[m])
        out[f"{m}_added_ms"] = {
            q: pct(delays[m], n) - pct(delays["direct"], n)
            for q, n in (("p50", 50), ("p90", 90), ("p99", 99))
        }
        out[f"{m}_proxy_cpu_us_per_event"] = (cpu1[m] - cpu0[m]) / events[m] * 1e6
    return out
