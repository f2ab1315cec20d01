"""Step 5, the analysis cost in-process (no I/O): a long stream's bytes fed to
``StreamTracker`` one event per chunk, four per chunk and in 64 KiB reads cut mid-event, the
framer alone, and for reference ``orjson.loads`` of every event; CPU and wall time per
event."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from proxy.core.sse import SSEFramer
from proxy.core.tracker import StreamTracker
from tests.fakes import llama_stream


def per_event_cost(fn: Callable[[], object], reps: int, n: int) -> dict[str, float]:
    """Min and median over ``reps`` runs of ``fn``: CPU and wall µs per event of ``n``."""
    cpu_us: list[float] = []
    wall_us: list[float] = []
    for _ in range(reps):
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        c1, w1 = time.process_time(), time.perf_counter()
        cpu_us.append((c1 - c0) / n * 1e6)
        wall_us.append((w1 - w0) / n * 1e6)
    return {
        "cpu_us_per_event_min": min(cpu_us),
        "cpu_us_per_event_median": statistics.median(cpu_us),
        "wall_us_per_event_min": min(wall_us),
        "wall_us_per_event_median": statistics.median(wall_us),
    }


def run_tracker(chunks: list[bytes], n: int, tokens: int) -> object:
    """Feed ``chunks`` to a tracker and finish it; fail if it saw the stream wrongly."""
    tr = StreamTracker(time.perf_counter(), sse=True)
    feed = tr.feed
    for c in chunks:
        feed(c)
    obs = tr.finish()
    if (
        obs.events != n
        or not obs.done
        or obs.timings is None
        or obs.token_events != tokens
        or obs.analysis_error is not None
    ):
        raise RuntimeError(f"tracker saw the stream wrongly: {obs}")
    return obs


def run_framer(chunks: list[bytes], n: int) -> object:
    """Feed ``chunks`` to the SSE framer alone; fail if it miscounts the events."""
    fr = SSEFramer()
    feed = fr.feed
    for c in chunks:
        feed(c)
    if fr.events != n:
        raise RuntimeError("framer miscounted")
    return fr


def parse_all(datas: list[bytes]) -> None:
    """``orjson.loads`` of every event's data but the last (``[DONE]``): the reference."""
    for d in datas[:-1]:
        orjson.loads(d)


def _cut(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def tracker_cpu(tokens: int, reps: int) -> dict[str, Any]:
    """The in-process costs for a stream of ``tokens`` tokens, ``reps`` repetitions each."""
    events = llama_stream(tokens)
    n = len(events)
    chunkings = {
        "1_event_per_chunk": events,
        "4_events_per_chunk": [b"".join(events[i : i + 4]) for i in range(0, n, 4)],
        # a fast stream's reads: 64 KiB cut wherever they fall, mid-event
        "64_KiB_reads": _cut(b"".join(events), 64 * 1024),
    }
    out: dict[str, Any] = {
        "tokens": tokens,
        "sse_events": n,
        "reps": reps,
        "bytes": sum(map(len, events)),
    }
    for name, chunks in chunkings.items():
        out[name] = {
            "tracker": per_event_cost(partial(run_tracker, chunks, n, tokens), reps, n),
            "framer_only": per_event_cost(partial(run_framer, chunks, n), reps, n),
            "chunks": len(chunks),
        }
    datas = [e[6:-2] for e in events]
    out["reference_orjson_loads_every_event"] = per_event_cost(partial(parse_all, datas), reps, n)
    return out
