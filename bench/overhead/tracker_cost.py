"""The analysis cost in-process (no I/O): a long stream's bytes fed to ``StreamTracker`` one
event per chunk, four per chunk and in 64 KiB reads cut mid-event, and for scale
``orjson.loads`` of every event; CPU µs per event, min and median of the repetitions. Each
repetition of each tree (the checkout, a ``--baseline`` one: both are the package ``proxy``)
is a process of its own, ``python bench/overhead/tracker_cost.py TREE``: it imports TREE's
tracker, reads the events from stdin, runs once to warm up, then once for the figures."""

from __future__ import annotations

import gc
import json
import pickle
import random
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

import orjson

ORJSON = "reference_orjson_loads_every_event"


def cpu_us_per_event(fn: Any, n: int) -> float:
    """CPU µs per event of one call of ``fn`` over ``n`` events."""
    gc.collect()
    c0 = time.process_time()
    fn()
    return (time.process_time() - c0) / n * 1e6


def run_tracker(tracker: Any, chunks: list[bytes], n: int, tokens: int) -> None:
    """Feed ``chunks`` to a ``tracker`` (class) and finish it; fail if it saw them wrongly."""
    tr = tracker(time.perf_counter(), sse=True)
    feed = tr.feed
    for c in chunks:
        feed(c)
    obs = tr.finish()
    seen = (obs.events, obs.token_events, obs.done, obs.timings is None, obs.analysis_error)
    if seen != (n, tokens, True, False, None):
        raise RuntimeError(f"the tracker saw the stream wrongly: {obs}")


def measure(tracker: Any, events: list[bytes], tokens: int) -> dict[str, float]:
    """CPU µs per event of ``tracker`` per chunking of ``events``, and of ``orjson.loads``."""
    n, whole = len(events), b"".join(events)
    chunkings = {
        "1_event_per_chunk": events,
        "4_events_per_chunk": [b"".join(events[i : i + 4]) for i in range(0, n, 4)],
        "64_KiB_reads": [whole[i : i + 65536] for i in range(0, len(whole), 65536)],
    }
    out = {
        k: cpu_us_per_event(partial(run_tracker, tracker, c, n, tokens), n)
        for k, c in chunkings.items()
    }
    datas = [e[6:-2] for e in events[:-1]]  # every event's data but ``[DONE]``
    out[ORJSON] = cpu_us_per_event(partial(lambda ds: [orjson.loads(d) for d in ds], datas), n)
    return out


def tracker_cpu(tokens: int, reps: int, trees: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Per tree (name → checkout), the costs for the checkout's fake stream of ``tokens``
    tokens: ``reps`` repetitions, the trees in a fresh random order each time."""
    from tests.fakes import llama_stream

    events = llama_stream(tokens)
    stdin, rng = pickle.dumps((events, tokens)), random.Random(1)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(reps):
        for name in rng.sample(list(trees), len(trees)):
            cmd = [sys.executable, __file__, str(trees[name])]
            done = subprocess.run(cmd, input=stdin, capture_output=True, check=True)
            runs[name].append(json.loads(done.stdout))
    out: dict[str, dict[str, Any]] = {}
    for name, got in runs.items():
        out[name] = {"tokens": tokens, "sse_events": len(events), "reps": reps}
        for key in got[0]:
            us = [r[key] for r in got]
            cost = {"cpu_us_per_event_min": min(us), "cpu_us_per_event_median": median(us)}
            out[name][key] = cost if key == ORJSON else {"tracker": cost}
    return out


if __name__ == "__main__":
    sys.path[0] = sys.argv[1]  # TREE, not bench/overhead: no module of it shadows another
    from proxy.core.tracker import StreamTracker

    where = sys.modules[StreamTracker.__module__].__file__ or ""
    if not Path(where).resolve().is_relative_to(Path(sys.argv[1]).resolve()):
        raise SystemExit(f"imported {where}, not the tracker of {sys.argv[1]}")
    events, tokens = pickle.loads(sys.stdin.buffer.read())
    measure(StreamTracker, events, tokens)  # warm-up: first calls, caches, lazy imports
    print(json.dumps(measure(StreamTracker, events, tokens)))
