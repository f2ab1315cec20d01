#!/usr/bin/env python3
"""How long ``GET /stats`` holds the relay's event loop, with full windows.

The proxy's windows hold up to ``[stats] window`` records per kind (10,000 by default), and
``/stats`` is built again when a record has come in since the last read. The dashboard
polls every second, so under load the document is rebuilt on every poll. While it is built,
streams in flight wait. This script fills the windows of a proxy app in-process with
records of random timings (every summarised field uniform over 1-3,000: about 800 occupied
buckets per field, more than real latencies fill), then serves ``/stats`` while a ticker
task measures the longest gap between its turns on the event loop (what a relayed event
would wait at worst), and times ``Stats.snapshot`` alone. ``--apis 5`` spreads the records
over the five APIs in turn: every API's kinds then have windows of their own, twelve in
all, the most a read walks. A script to run by hand::

    .venv/bin/python bench/stats_stall.py [--window 10000] [--reads 20] [--apis 1]

Until issue 15 ``/stats`` sorted every field of every window when read: 17 ms of CPU with
10,000 records per kind, built a field at a time with the loop given back in between; it now
reads histograms (``proxy.core.stats``) in one go.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from proxy.config import load_config
from proxy.core.record import Kind, Outcome, Record
from proxy.core.stats import APIS, SUMMARY_FIELDS
from proxy.serve.app import STATS, build_admin_app, build_app


def record(i: int, rng: random.Random, apis: int) -> Record:
    values: dict[str, Any] = {name: rng.uniform(1.0, 3000.0) for name in SUMMARY_FIELDS}
    return Record(
        id=f"r-{i}",
        ts="2026-11-30T00:00:00.000Z",
        method="POST",
        path="/v1/chat/completions",
        kind=Kind.TOOL if i % 2 else Kind.CHAT,
        outcome=Outcome.COMPLETED,
        api=APIS[(i // 2) % apis],
        **values,
    )


async def longest_gap(work: asyncio.Future[Any]) -> float:
    """Longest time between two turns of a task yielding to the loop, until ``work`` ends."""
    gap, last = 0.0, time.perf_counter()
    while not work.done():
        await asyncio.sleep(0)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    return gap


async def main(window: int, reads: int, apis: int) -> None:
    config = load_config(None, {"stats": {"window": window}, "accounting": {"enabled": False}})
    app = build_app(config)
    stats = app[STATS]
    rng = random.Random(1)
    n = 0
    for _ in range(2 * window * apis):
        stats.add(record(n, rng, apis))
        n += 1
    async with (
        TestClient(TestServer(app)),
        TestClient(TestServer(build_admin_app(app))) as client,
    ):
        stalls: list[float] = []
        whole: list[float] = []
        for _ in range(reads):
            stats.add(record(n, rng, apis))  # a record came in: the next read rebuilds
            n += 1
            read = asyncio.ensure_future(client.get("/stats"))  # noqa: TID251 (held in read)
            stalls.append(await longest_gap(read))
            resp = await read
            assert resp.status == 200 and orjson.loads(await resp.read())["requests"] == n
            t = time.perf_counter()
            stats.snapshot()
            whole.append(time.perf_counter() - t)

    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values) * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms"

    windows = 2 + (2 * apis if apis > 1 else 0)
    print(
        f"windows: {window} records per kind, {len(SUMMARY_FIELDS)} fields, {apis} API(s): "
        f"{windows} windows; {reads} reads"
    )
    print(f"longest event-loop stall during GET /stats: {ms(stalls)}")
    print(f"Stats.snapshot alone: {ms(whole)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window", type=int, default=10_000)
    p.add_argument("--reads", type=int, default=20)
    p.add_argument("--apis", type=int, default=1, choices=range(1, len(APIS) + 1))
    a = p.parse_args()
    asyncio.run(main(a.window, a.reads, a.apis))
