#!/usr/bin/env python3
"""How long ``GET /stats`` holds the relay's event loop, with full windows.

The proxy's windows hold up to ``[stats] window`` records per kind (10,000 by default), and
``/stats`` sorts each summarised field of each window when a record has come in since the
last read. The dashboard polls every second, so under load the document is rebuilt on
every poll. While it is built, streams in flight wait. This script fills the windows of a
proxy app in-process with records of random timings, then serves ``/stats`` while a ticker
task measures the longest gap between its turns on the event loop (what a relayed event
would wait at worst). It compares the stepwise build the proxy uses with the whole
document built in one go (``Stats.snapshot``, as before). A script to run by hand::

    .venv/bin/python bench/stats_stall.py [--window 10000] [--reads 20]
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
from proxy.core.stats import SUMMARY_FIELDS
from proxy.serve.app import STATS, build_admin_app, build_app


def record(i: int, rng: random.Random) -> Record:
    values: dict[str, Any] = {name: rng.uniform(1.0, 3000.0) for name in SUMMARY_FIELDS}
    return Record(
        id=f"r-{i}",
        ts="2026-11-30T00:00:00.000Z",
        method="POST",
        path="/v1/chat/completions",
        kind=Kind.TOOL if i % 2 else Kind.CHAT,
        outcome=Outcome.COMPLETED,
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


async def main(window: int, reads: int) -> None:
    config = load_config(None, {"stats": {"window": window}, "accounting": {"enabled": False}})
    app = build_app(config)
    stats = app[STATS]
    rng = random.Random(1)
    n = 0
    for _ in range(2 * window):
        stats.add(record(n, rng))
        n += 1
    async with (
        TestClient(TestServer(app)),
        TestClient(TestServer(build_admin_app(app))) as client,
    ):
        stepwise: list[float] = []
        whole: list[float] = []
        for _ in range(reads):
            stats.add(record(n, rng))  # a record came in: the next read rebuilds
            n += 1
            read = asyncio.ensure_future(client.get("/stats"))  # noqa: TID251 (held in read)
            stepwise.append(await longest_gap(read))
            resp = await read
            assert resp.status == 200 and orjson.loads(await resp.read())["requests"] == n
            t = time.perf_counter()
            stats.snapshot()
            whole.append(time.perf_counter() - t)

    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values) * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms"

    print(f"windows: {window} records per kind, {len(SUMMARY_FIELDS)} fields; {reads} reads")
    print(f"longest event-loop stall during GET /stats (stepwise build): {ms(stepwise)}")
    print(f"document built in one go (Stats.snapshot, the loop held throughout): {ms(whole)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window", type=int, default=10_000)
    p.add_argument("--reads", type=int, default=20)
    a = p.parse_args()
    asyncio.run(main(a.window, a.reads))
