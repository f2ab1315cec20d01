"""Step 1, latency per request: streamed and plain requests to every path, interleaved in a
random order per round; added latency = proxied - direct (of medians, p99s, and paired)."""

from __future__ import annotations

import gc
import time
from typing import Any

from bench.overhead.client import chat_body, timed_request
from bench.overhead.percentiles import pct, summary
from bench.overhead.rig import Bench
from tests.fakes import llama_event_count, llama_plain_body


async def _warm_up(bench: Bench, kinds: dict[str, bytes], sessions: dict[str, Any]) -> None:
    """Warm every path up, and check that each relays the bytes unchanged."""
    for kind, body in kinds.items():
        got: dict[str, bytes] = {}
        for _ in range(max(1, bench.args.warmup)):
            got = {
                m: (await timed_request(sessions[kind], bench.url(m), body))[1] for m in bench.modes
            }
        if len(set(got.values())) != 1:
            raise RuntimeError(f"{kind}: proxied body differs from direct body")


async def _rounds(
    bench: Bench, kinds: dict[str, bytes], sessions: dict[str, Any]
) -> dict[str, dict[str, list[float]]]:
    """The measured rounds: per kind and path, the wall times (ms) in round order."""
    times: dict[str, dict[str, list[float]]] = {k: {m: [] for m in bench.modes} for k in kinds}
    for _ in range(bench.args.rounds):
        for kind, body in kinds.items():
            for m in bench.shuffled_modes():
                ms, _data = await timed_request(sessions[kind], bench.url(m), body)
                times[kind][m].append(ms)
    return times


def added(prox: list[float], direct: list[float]) -> dict[str, Any]:
    """What a relay adds: differences of percentiles, per quarter of the rounds, and of the
    paired (same round) times."""
    paired = [p - d for p, d in zip(prox, direct, strict=True)]
    q = max(1, len(direct) // 4)
    return {
        "blocks_p50": [
            pct(prox[i : i + q], 50) - pct(direct[i : i + q], 50)
            for i in range(0, len(direct) - q + 1, q)
        ][:4],
        "median_diff": pct(prox, 50) - pct(direct, 50),
        "p90_diff": pct(prox, 90) - pct(direct, 90),
        "p99_diff": pct(prox, 99) - pct(direct, 99),
        "paired": summary(paired),
    }


def _kind_summary(times: dict[str, list[float]], proxies: list[str]) -> dict[str, Any]:
    direct = times["direct"]
    k: dict[str, Any] = {"direct_ms": summary(direct)}
    for m in proxies:
        k[f"{m}_ms"] = summary(times[m])
        k[f"{m}_added_ms"] = added(times[m], direct)
    return k


def _plain_tokens(a: Any) -> int:
    """Tokens of the plain body: ``--plain-tokens``, else those of the stream."""
    return int(a.plain_tokens if a.plain_tokens is not None else a.stream_tokens)


async def measure_latency(bench: Bench) -> dict[str, Any]:
    """Warm-up and byte check, then ``rounds`` interleaved rounds; the relays' CPU per
    request over the measured rounds."""
    a = bench.args
    kinds = {
        "stream": chat_body(a.stream_tokens, True),
        "plain": chat_body(_plain_tokens(a), False),
    }
    sessions = {"stream": bench.session, "plain": bench.plain_session}
    await _warm_up(bench, kinds, sessions)
    gc.collect()
    cpu0 = bench.cpu_all()
    t0 = time.perf_counter()
    times = await _rounds(bench, kinds, sessions)
    elapsed = time.perf_counter() - t0
    cpu1 = bench.cpu_all()
    return {
        "rounds": a.rounds,
        "warmup": a.warmup,
        "proxy_cpu_us_per_request": {
            m: (cpu1[m] - cpu0[m]) / (len(kinds) * a.rounds) * 1e6 for m in bench.proxies
        },
        "tokens": a.stream_tokens,
        "stream_sse_events": llama_event_count(a.stream_tokens),
        "plain_tokens": _plain_tokens(a),
        "plain_body_bytes": len(llama_plain_body(_plain_tokens(a))),
        "seconds": elapsed,
        "kinds": {kind: _kind_summary(times[kind], list(bench.proxies)) for kind in kinds},
    }
