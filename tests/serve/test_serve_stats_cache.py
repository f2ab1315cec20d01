"""StatsDocument: the ``/stats`` bytes, built again only when something came in, in one go
(the histograms need no sort), and once for all readers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.core.partials import BoardFields
from proxy.core.record import Kind, Record
from proxy.core.stats import Stats
from proxy.serve.accounting import Accounting
from proxy.serve.stats_cache import StatsDocument
from proxy.serve.telemetry import Telemetry


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

    def snapshot(self) -> dict[str, Any]:
        self.builds += 1
        return super().snapshot()


class FakeBoard(Telemetry):
    """A telemetry sampler whose snapshot the test sets."""

    mode = "fake"

    def __init__(self) -> None:
        self.board: dict[str, Any] = {"mode": "fake", "state": "running", "samples": 1}

    async def start(self) -> None:
        """Nothing to start."""

    async def close(self) -> None:
        """Nothing to stop."""

    async def sample(self, t0: float, t1: float, tokens: int | None) -> BoardFields:
        return BoardFields()

    def gauges(self) -> dict[str, float]:
        return {}

    def snapshot(self) -> dict[str, Any]:
        return dict(self.board)


@pytest.fixture
def stats() -> CountingStats:
    """Stats holding three chat records."""
    s = CountingStats()
    for i in range(3):
        s.add(record(i))
    return s


class TestStatsDocument:
    """When the document is built and what it holds."""

    def test_unchanged_stats_are_not_built_again(self, stats: CountingStats) -> None:
        """Two reads with nothing new in between give the same bytes from one build."""
        doc = StatsDocument(stats)
        first = doc.build(None)
        assert doc.build(None) is first
        assert stats.builds == 1
        parsed = orjson.loads(first)
        assert parsed["requests"] == 3 and parsed["schemas"] is None
        assert parsed["board"] is None  # no telemetry sampler
        expected = {
            **orjson.loads(orjson.dumps(stats.snapshot())),
            "schemas": None,
            "board": None,
            "template": None,  # no setup watch
            "findings": [],
        }
        assert parsed == expected

    def test_a_new_record_makes_the_next_read_build_again(self, stats: CountingStats) -> None:
        """After a record came in the document is built again and counts it."""
        doc = StatsDocument(stats)
        doc.build(None)
        stats.add(record(3))
        assert orjson.loads(doc.build(None))["requests"] == 4
        assert stats.builds == 2

    def test_a_newly_learnt_tool_schema_makes_the_next_read_build_again(
        self, stats: CountingStats
    ) -> None:
        """The accounting's per-tool counts are part of the version: a schema learnt since
        the last read rebuilds the document, which carries the accounting's section."""
        accounting = Accounting("http://127.0.0.1:9")
        doc = StatsDocument(stats)
        first = orjson.loads(doc.build(accounting))
        assert first["schemas"] == accounting.snapshot()
        doc.build(accounting)
        assert stats.builds == 1
        accounting.per_tool.put((None, "abc", 12), {"read_file": 12})
        doc.build(accounting)
        assert stats.builds == 2

    def test_a_board_snapshot_change_makes_the_next_read_build_again(
        self, stats: CountingStats
    ) -> None:
        """Any change in the board sampler's snapshot (more samples kept, not only a new
        state) is in the next document: a reader waiting for the sampler's samples sees
        them arrive."""
        board = FakeBoard()
        doc = StatsDocument(stats)
        assert orjson.loads(doc.build(None, board))["board"]["samples"] == 1
        doc.build(None, board)
        assert stats.builds == 1
        board.board["samples"] = 2
        assert orjson.loads(doc.build(None, board))["board"]["samples"] == 2
        assert stats.builds == 2
