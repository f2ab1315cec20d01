"""The analysis cost in-process (no I/O): a long stream's bytes fed to ``StreamTracker`` one
event per chunk, four per chunk and in 64 KiB reads cut mid-event, and for scale
``orjson.loads`` of every event. CPU µs per event, min and median of the repetitions."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from proxy.core.tracker import StreamTracker
from tests.fakes import llama_stream


def per_event_cost(fn: Callable[[], object], reps: int, n: int) -> dict[str, float]:
    """Min and median over ``reps`` runs of ``fn`` of its CPU µs per event of ``n``."""
    cpu_us: list[float] = []
    for _ in range(reps):
        gc.collect()
        c0 = time.process_time()
        fn()
        cpu_us.append((time.process_time() - c0) / n * 1e6)
    return {
        "cpu_us_per_event_min": min(cpu_us),
        "cpu_us_per_event_median": statistics.median(cpu_us),
    }


def run_tracker(chunks: list[bytes], n: int, tokens: int) -> None:
    """Feed ``chunks`` to a tracker and finish it; fail if it saw the stream wrongly."""
    tr = StreamTracker(time.perf_counter(), sse=True)
    feed = tr.feed
    for c in chunks:
        feed(c)
    obs = tr.finish()
    if (obs.events, obs.token_events, obs.done) != (n, tokens, True) or obs.timings is None:
        raise RuntimeError(f"the tracker saw the stream wrongly: {obs}")
    if obs.analysis_error is not None:
        raise RuntimeError(f"the tracker saw the stream wrongly: {obs}")


def parse_all(datas: list[bytes]) -> None:
    """``orjson.loads`` of every event's data but the last (``[DONE]``)."""
    for d in datas[:-1]:
        orjson.loads(d)


def tracker_cpu(tokens: int, reps: int) -> dict[str, Any]:
    """The in-process costs for a stream of ``tokens`` tokens, ``reps`` repetitions each."""
    events = llama_stream(tokens)
    n, whole = len(events), b"".join(events)
    chunkings = {
        "1_event_per_chunk": events,
        "4_events_per_chunk": [b"".join(events[i : i + 4]) for i in range(0, n, 4)],
        "64_KiB_reads": [whole[i : i + 65536] for i in range(0, len(whole), 65536)],
    }
    out: dict[str, Any] = {"tokens": tokens, "sse_events": n, "reps": reps, "bytes": len(whole)}
    for name, chunks in chunkings.items():
        out[name] = {
            "tracker": per_event_cost(partial(run_tracker, chunks, n, tokens), reps, n),
            "chunks": len(chunks),
        }
    datas = [e[6:-2] for e in events]
    out["reference_orjson_loads_every_event"] = per_event_cost(partial(parse_all, datas), reps, n)
    return out
