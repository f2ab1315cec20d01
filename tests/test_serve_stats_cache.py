"""StatsDocument: the ``/stats`` bytes, built again only when something came in, one field at
a time with the event loop given back, and once for all readers that arrive meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import orjson
import pytest

from proxy.core.record import Kind, Record
from proxy.core.stats import Stats
from proxy.serve.accounting import Accounting
from proxy.serve.stats_cache import StatsDocument, in_steps
from proxy.serve.tasks import spawn


def record(i: int) -> Record:
    """A chat record ``r-i`` with a TTFT of ``i`` ms."""
    return Record(
        id=f"r-{i}", ts="t", method="POST", path="/v1/chat/completions", kind=Kind.CHAT,
        ttft_ms=float(i),
    )  # fmt: skip


class CountingStats(Stats):
    """Stats that count how often the document is built."""

    def __init__(self) -> None:
        super().__init__(since="2026-11-30T00:00:00.000Z", recent=10, window=100)
        self.builds = 0

    def snapshot_steps(self) -> Generator[None, None, dict[str, Any]]:
        self.builds += 1
        return super().snapshot_steps()


@pytest.fixture
def stats() -> CountingStats:
    """Stats holding three chat records."""
    s = CountingStats()
    for i in range(3):
        s.add(record(i))
    return s


class TestStatsDocument:
    """When the document is built and what it holds."""

    async def test_unchanged_stats_are_not_built_again(self, stats: CountingStats) -> None:
        """Two reads with nothing new in between give the same bytes from one build."""
        doc = StatsDocument(stats)
        first = await doc.body(None)
        assert await doc.body(None) is first
        assert stats.builds == 1
        parsed = orjson.loads(first)
        assert parsed["requests"] == 3 and parsed["schemas"] is None
        assert parsed["board"] is None  # no telemetry sampler
        expected = {**orjson.loads(orjson.dumps(stats.snapshot())), "schemas": None, "board": None}
        assert parsed == expected

    async def test_a_new_record_makes_the_next_read_build_again(self, stats: CountingStats) -> None:
        """After a record came in the document is built again and counts it."""
        doc = StatsDocument(stats)
        await doc.body(None)
        stats.add(record(3))
        assert orjson.loads(await doc.body(None))["requests"] == 4
        assert stats.builds == 2

    async def test_a_newly_learnt_tool_schema_makes_the_next_read_build_again(
        self, stats: CountingStats
    ) -> None:
        """The accounting's per-tool counts are part of the version: a schema learnt since
        the last read rebuilds the document, which carries the accounting's section."""
        accounting = Accounting("http://127.0.0.1:9")
        doc = StatsDocument(stats)
        first = orjson.loads(await doc.body(accounting))
        assert first["schemas"] == accounting.snapshot()
        await doc.body(accounting)
        assert stats.builds == 1
        accounting.per_tool["abc"] = {"read_file": 12}
        await doc.body(accounting)
        assert stats.builds == 2

    async def test_concurrent_readers_share_one_build(self, stats: CountingStats) -> None:
        """Readers arriving while a build runs wait for it and get its bytes."""
        doc = StatsDocument(stats)
        bodies = await asyncio.gather(*(doc.body(None) for _ in range(5)))
        assert stats.builds == 1
        assert all(b is bodies[0] for b in bodies)

    async def test_the_build_yields_to_the_event_loop_between_fields(
        self, stats: CountingStats
    ) -> None:
        """Another task gets turns while the document is built (once per field at least)."""
        turns = 0
        done = asyncio.Event()

        async def other() -> None:
            nonlocal turns
            while not done.is_set():
                turns += 1
                await asyncio.sleep(0)

        steps = sum(1 for _ in stats.snapshot_steps())  # how many times a build yields
        stats.builds = 0
        doc = StatsDocument(stats)
        ticker = spawn(other(), set())
        await asyncio.sleep(0)
        before = turns
        await doc.body(None)
        during = turns - before
        done.set()
        await ticker
        assert steps > 1 and during >= steps


async def test_in_steps_returns_the_generators_value() -> None:
    """``in_steps`` runs every step and returns what the generator returns."""
    ran: list[int] = []

    def steps() -> Generator[None, None, str]:
        for i in range(3):
            ran.append(i)
            yield
        return "done"

    assert await in_steps(steps()) == "done"
    assert ran == [0, 1, 2]
