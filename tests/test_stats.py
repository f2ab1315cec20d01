"""Tests for proxy.core.stats: percentiles, per-kind and per-API summaries, upstream errors
by status and the bounded /stats aggregate."""

from __future__ import annotations

import gc
import json
from typing import Any

import orjson
import pytest

from proxy.core.record import Kind, Outcome, Record
from proxy.core.stats import (
    APIS,
    SUMMARY_FIELDS,
    Stats,
    api_name,
    cache_ratio,
    percentile,
    quantiles,
    status_name,
    summarize,
    summarize_cache,
    summarize_kind,
)

SEED_TOOL_TOTALS = [3172.0, 1813.0, 2061.0, 1432.0, 4071.0]  # ms, the seed's five tool calls


def rec(
    i: int = 0, kind: Kind = Kind.CHAT, outcome: Outcome = Outcome.COMPLETED, **fields: Any
) -> Record:
    """A record with id ``r-i`` and the given fields."""
    return Record(
        id=f"r-{i}",
        ts="2025-11-30T03:40:00Z",
        method="POST",
        path="/v1/chat/completions",
        kind=kind,
        outcome=outcome,
        **fields,
    )


class TestPercentile:
    def test_seed_median(self) -> None:
        """The seed's five tool-call totals have median 2061 ms (the third of five)."""
        assert percentile(sorted(SEED_TOOL_TOTALS), 0.5) == 2061.0

    def test_empty(self) -> None:
        """No values give None, not 0."""
        assert percentile([], 0.5) is None

    def test_single(self) -> None:
        """One value is every percentile."""
        assert [percentile([7.0], q) for q in (0.0, 0.5, 0.9, 0.99, 1.0)] == [7.0] * 5

    @pytest.mark.parametrize(
        ("q", "expected"),
        [
            (0.0, 10.0),
            (0.5, 55.0),  # pos 4.5 → 50 + 0.5*10
            (0.9, 91.0),  # pos 8.1 → 90 + 0.1*10
            (0.99, 99.1),  # pos 8.91 → 90 + 0.91*10
            (1.0, 100.0),
        ],
    )
    def test_linear_interpolation(self, q: float, expected: float) -> None:
        """Percentiles of 10..100 interpolate linearly between ranks (numpy's default)."""
        values = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]
        assert percentile(values, q) == pytest.approx(expected, abs=1e-9)

    def test_seed_p90_p99(self) -> None:
        """p90/p99 of the seed's totals by hand: positions 3.6 and 3.96, between 3172 and 4071."""
        values = sorted(SEED_TOOL_TOTALS)
        assert percentile(values, 0.9) == pytest.approx(3172 + 0.6 * (4071 - 3172))  # 3711.4
        assert percentile(values, 0.99) == pytest.approx(3172 + 0.96 * (4071 - 3172))  # 4035.04

    def test_two_values(self) -> None:
        """With two values the median is their mean."""
        assert percentile([1.0, 2.0], 0.5) == 1.5

    def test_rounded_to_microsecond(self) -> None:
        """Results are rounded to 3 decimals."""
        assert percentile([0.0, 1.0], 1 / 3) == 0.333


class TestSummarizeKind:
    def test_count_and_fields(self) -> None:
        """The summary has count, {p50,p90,p99} for each summary field, the split and the
        speculation split."""
        out = summarize_kind([rec(i, tool_call_ms=v) for i, v in enumerate(SEED_TOOL_TOTALS)])
        assert out["count"] == 5
        assert set(out) == {"count", "split", "speculation", *SUMMARY_FIELDS}
        for name in SUMMARY_FIELDS:
            assert set(out[name]) == {"p50", "p90", "p99"}

    def test_unsorted_input_is_sorted(self) -> None:
        """Records in arrival order (unsorted values) give the right percentiles."""
        out = summarize_kind([rec(i, tool_call_ms=v) for i, v in enumerate(SEED_TOOL_TOTALS)])
        assert out["tool_call_ms"]["p50"] == 2061.0
        assert out["tool_call_ms"]["p90"] == pytest.approx(3711.4)

    def test_unknown_values_skipped(self) -> None:
        """None values are left out of the percentiles, not counted as 0."""
        records = [rec(0, ttft_ms=100.0), rec(1, ttft_ms=None), rec(2, ttft_ms=300.0)]
        out = summarize_kind(records)
        assert out["count"] == 3
        assert out["ttft_ms"]["p50"] == 200.0
        assert out["e2e_ms"] == {"p50": None, "p90": None, "p99": None}

    def test_split_from_medians(self) -> None:
        """The split is median prefill vs median decode: 796 and 1265 ms → 38.6 % / 61.4 %."""
        records = [
            rec(0, prefill_ms=700.0, decode_ms=1265.0),
            rec(1, prefill_ms=796.0, decode_ms=1500.0),
            rec(2, prefill_ms=900.0, decode_ms=1000.0),
        ]
        assert summarize_kind(records)["split"] == {
            "prefill_ms": 796.0,
            "decode_ms": 1265.0,
            "prefill_pct": 38.6,
            "decode_pct": 61.4,
        }

    def test_split_unknown(self) -> None:
        """Without both medians the split percentages are None."""
        split = summarize_kind([rec(0, prefill_ms=796.0)])["split"]
        assert split == {
            "prefill_ms": 796.0,
            "decode_ms": None,
            "prefill_pct": None,
            "decode_pct": None,
        }

    def test_split_zero_total(self) -> None:
        """A zero prefill+decode total gives no percentages (no division by zero)."""
        split = summarize_kind([rec(0, prefill_ms=0.0, decode_ms=0.0)])["split"]
        assert split["prefill_pct"] is None and split["decode_pct"] is None

    def test_empty(self) -> None:
        """No records: count 0 and every percentile None."""
        out = summarize_kind([])
        assert out["count"] == 0
        assert out["ttft_ms"]["p50"] is None
        assert out["split"]["prefill_pct"] is None


class TestSummarize:
    def test_only_chat_and_tool(self) -> None:
        """summarize gives a chat and a tool summary; other records are left out."""
        records = [
            rec(0, Kind.CHAT, ttft_ms=10.0),
            rec(1, Kind.TOOL, ttft_ms=20.0),
            rec(2, Kind.TOOL, ttft_ms=40.0),
            rec(3, Kind.OTHER, ttft_ms=999.0),
        ]
        out = summarize(records)
        assert set(out) == {"chat", "tool"}
        assert out["chat"]["count"] == 1
        assert out["tool"]["count"] == 2
        assert out["tool"]["ttft_ms"]["p50"] == 30.0

    def test_empty(self) -> None:
        """No records still yields both kinds with count 0."""
        out = summarize([])
        assert out["chat"]["count"] == 0 and out["tool"]["count"] == 0


class TestStats:
    def test_empty_snapshot(self) -> None:
        """A fresh aggregate reports zero requests, no hit ratio and no recent records."""
        snap = Stats(since="2025-11-30T03:40:00Z").snapshot()
        assert snap["requests"] == 0
        assert snap["since"] == "2025-11-30T03:40:00Z"
        assert snap["outcomes"] == {}
        assert snap["cache"] == {"cache_n": 0, "prompt_tokens": 0, "hit_ratio": None}
        assert snap["recent"] == []
        assert snap["kinds"]["chat"]["count"] == 0
        assert snap["kinds"]["tool"]["window"] == 0

    def test_window_bounded(self) -> None:
        """Percentiles cover only the last ``window`` records; count is the running total."""
        window = 10
        stats = Stats(since="s", window=window)
        # 50 records at 10_000 ms, then the last `window` at 1..10 ms
        for i in range(50):
            stats.add(rec(i, Kind.TOOL, ttft_ms=10_000.0))
        for i in range(window):
            stats.add(rec(50 + i, Kind.TOOL, ttft_ms=float(i + 1)))
        tool = stats.snapshot()["kinds"]["tool"]
        assert tool["count"] == window + 50
        assert tool["window"] == window
        assert tool["ttft_ms"]["p50"] == 5.5
        assert tool["ttft_ms"]["p99"] == pytest.approx(9.91)

    def test_windows_per_kind(self) -> None:
        """Each kind has its own window: chat records do not push tool records out."""
        stats = Stats(since="s", window=3)
        for i in range(3):
            stats.add(rec(i, Kind.TOOL, ttft_ms=1.0))
        for i in range(10):
            stats.add(rec(10 + i, Kind.CHAT, ttft_ms=2.0))
        kinds = stats.snapshot()["kinds"]
        assert kinds["tool"]["window"] == 3
        assert kinds["tool"]["ttft_ms"]["p50"] == 1.0
        assert kinds["chat"]["count"] == 10

    def test_windows_hold_nothing_the_collector_walks(self) -> None:
        """Beyond the ``recent`` records, the windows keep no object the garbage collector
        tracks, so full windows add nothing to a full collection's pause."""
        stats = Stats(since="s", recent=5, window=1000)
        gc.collect()
        before = len(gc.get_objects())
        for i in range(1000):
            stats.add(
                rec(
                    i,
                    Kind.TOOL if i % 2 else Kind.CHAT,
                    ttft_ms=float(i),
                    prefill_ms=None,
                    decode_tok_s=12.5,
                )
            )
        gc.collect()
        # the 5 recent records and what they hold; not the 1,000 window rows
        assert len(gc.get_objects()) - before < 100
        assert stats.snapshot()["kinds"]["tool"]["ttft_ms"]["p50"] == 500.0

    def test_snapshot_in_steps_gives_the_same_document(self) -> None:
        """snapshot_steps yields once per field of each window (each step sorts one
        column) and returns exactly what snapshot() returns."""
        stats = Stats(since="s", window=50)
        for i in range(80):
            stats.add(
                rec(
                    i,
                    Kind.TOOL if i % 3 else Kind.CHAT,
                    ttft_ms=float(i % 17),
                    prefill_ms=float(i),
                    cache_n=i,
                    prompt_tokens=2 * i + 1,
                )
            )
        steps = stats.snapshot_steps()
        yields = 0
        doc: dict[str, Any] = {}
        while True:
            try:
                next(steps)
            except StopIteration as done:
                doc = done.value
                break
            yields += 1
        assert yields == 2 * len(SUMMARY_FIELDS)
        assert doc == stats.snapshot()

    def test_snapshot_steps_keep_the_state_they_started_with(self) -> None:
        """Records added while a stepwise snapshot is under way neither break it (no
        mutated-deque error) nor enter it: the document is the state at its start."""
        stats = Stats(since="s", recent=3, window=5)
        for i in range(5):
            stats.add(rec(i, Kind.CHAT, ttft_ms=1.0))
        steps = stats.snapshot_steps()
        next(steps)
        for i in range(5, 20):
            stats.add(rec(i, Kind.CHAT, ttft_ms=100.0))
        doc = None
        while doc is None:
            try:
                next(steps)
            except StopIteration as done:
                doc = done.value
        assert doc["requests"] == 5
        assert doc["kinds"]["chat"]["ttft_ms"]["p99"] == 1.0
        assert [r["id"] for r in doc["recent"]] == ["r-4", "r-3", "r-2"]
        assert stats.snapshot()["kinds"]["chat"]["ttft_ms"]["p50"] == 100.0

    def test_recent_bounded_newest_first(self) -> None:
        """recent keeps the last N records whole, newest first."""
        stats = Stats(since="s", recent=3)
        for i in range(7):
            stats.add(rec(i))
        recent = stats.snapshot()["recent"]
        assert [r["id"] for r in recent] == ["r-6", "r-5", "r-4"]
        assert recent[0] == rec(6).to_dict()

    def test_cache_sums_and_hit_ratio(self) -> None:
        """Cache sums add cache_n and prompt_tokens of records that know both; hit_ratio divides."""
        stats = Stats(since="s")
        stats.add(rec(0, cache_n=35, prompt_tokens=40))
        stats.add(rec(1, cache_n=301, prompt_tokens=306))
        stats.add(rec(2, cache_n=None, prompt_tokens=500))  # unknown: left out of both sums
        stats.add(rec(3, cache_n=7, prompt_tokens=None))
        assert stats.snapshot()["cache"] == {
            "cache_n": 336,
            "prompt_tokens": 346,
            "hit_ratio": round(336 / 346, 6),
        }

    def test_cache_sums_are_running_totals(self) -> None:
        """Cache sums include records already pushed out of the window."""
        stats = Stats(since="s", window=1, recent=1)
        for i in range(5):
            stats.add(rec(i, Kind.TOOL, cache_n=1, prompt_tokens=4))
        assert stats.snapshot()["cache"] == {"cache_n": 5, "prompt_tokens": 20, "hit_ratio": 0.25}

    def test_outcomes_counted(self) -> None:
        """Each outcome is counted under its string value."""
        stats = Stats(since="s")
        for i, outcome in enumerate(
            [Outcome.COMPLETED, Outcome.COMPLETED, Outcome.CLIENT_CLOSED, Outcome.UPSTREAM_TIMEOUT]
        ):
            stats.add(rec(i, outcome=outcome))
        assert stats.snapshot()["outcomes"] == {
            "completed": 2,
            "client_closed": 1,
            "upstream_timeout": 1,
        }

    def test_other_counted_in_requests_not_kinds(self) -> None:
        """``other`` requests count in requests (and recent) but have no kinds entry."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.OTHER))
        stats.add(rec(1, Kind.OTHER))
        stats.add(rec(2, Kind.CHAT))
        snap = stats.snapshot()
        assert snap["requests"] == 3
        assert set(snap["kinds"]) == {"chat", "tool"}
        assert snap["kinds"]["chat"]["count"] == 1
        assert snap["kinds"]["tool"]["count"] == 0
        assert len(snap["recent"]) == 3

    def test_snapshot_serialises_with_orjson(self) -> None:
        """The /stats document serialises with plain orjson.dumps and has only str keys."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.TOOL, Outcome.CLIENT_CLOSED, ttft_ms=1.0, cache_n=1, prompt_tokens=2))
        stats.add(rec(1, Kind.OTHER, Outcome.COMPLETED))
        snap = stats.snapshot()
        assert all(type(k) is str for k in snap["outcomes"])
        doc = orjson.loads(orjson.dumps(snap))
        assert doc["outcomes"] == {"client_closed": 1, "completed": 1}
        assert doc == json.loads(json.dumps(snap))


class TestQuantilesAndCache:
    """The public helpers that ``/stats`` and ``report`` share."""

    def test_quantiles(self) -> None:
        """p50/p90/p99 of the seed's sorted five tool totals: 2,061 / 3,711.4 / 4,035.04 ms."""
        assert quantiles(sorted(SEED_TOOL_TOTALS)) == {
            "p50": 2061.0,
            "p90": 3711.4,
            "p99": 4035.04,
        }

    def test_quantiles_empty(self) -> None:
        """No values: every quantile is None."""
        assert quantiles([]) == {"p50": None, "p90": None, "p99": None}

    def test_cache_ratio(self) -> None:
        """The ratio is cached over prompt tokens; no prompt tokens give None, not 0."""
        assert cache_ratio(336, 346) == {
            "cache_n": 336,
            "prompt_tokens": 346,
            "hit_ratio": 0.971098,
        }
        assert cache_ratio(0, 0) == {"cache_n": 0, "prompt_tokens": 0, "hit_ratio": None}

    def test_summarize_cache_is_the_stats_cache(self) -> None:
        """Over the same records, summarize_cache gives /stats's cache object."""
        records = [
            rec(0, cache_n=35, prompt_tokens=40),
            rec(1, cache_n=301, prompt_tokens=306),
            rec(2, cache_n=None, prompt_tokens=500),
            rec(3, cache_n=7, prompt_tokens=None),
        ]
        stats = Stats(since="s")
        for r in records:
            stats.add(r)
        assert summarize_cache(records) == stats.snapshot()["cache"]
        assert summarize_cache(records)["cache_n"] == 336


class TestOnlyCompletedLatencies:
    def test_errors_count_but_stay_out_of_the_percentiles(self) -> None:
        """An upstream error answered in 3 ms is counted under its outcome, not in the
        kind's latency percentiles (it would pull the tool p50 down)."""
        stats = Stats(since="t")
        stats.add(rec(1, Kind.TOOL, e2e_ms=15_000.0))
        stats.add(rec(2, Kind.TOOL, Outcome.UPSTREAM_ERROR, e2e_ms=3.0, status=500))
        doc = stats.snapshot()
        assert doc["outcomes"] == {"completed": 1, "upstream_error": 1}
        assert doc["kinds"]["tool"]["e2e_ms"]["p50"] == 15_000.0

    def test_requests_are_counted_per_api(self) -> None:
        """``apis`` counts every request by the API it was read with (``other`` when a log
        line had none); the chat and tool figures stay across APIs."""
        stats = Stats(since="t")
        stats.add(rec(1, Kind.TOOL, api="responses", e2e_ms=10.0))
        stats.add(rec(2, Kind.TOOL, api="chat_completions", e2e_ms=20.0))
        stats.add(rec(3, Kind.OTHER))
        doc = stats.snapshot()
        assert doc["apis"] == {"responses": 1, "chat_completions": 1, "other": 1}
        assert doc["kinds"]["tool"]["count"] == 2


def run_steps(stats: Stats) -> tuple[int, dict[str, Any]]:
    """How many times ``stats.snapshot_steps()`` yields, and the document it returns."""
    steps = stats.snapshot_steps()
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return yields, done.value
        yields += 1


def two_apis() -> tuple[Stats, list[Record]]:
    """A Stats fed completed chat and tool records of two APIs with different timings
    (Responses slower), interleaved, and the records."""
    records = [
        rec(
            i,
            Kind.TOOL if i % 3 else Kind.CHAT,
            api="responses" if i % 2 else "chat_completions",
            ttft_ms=float(10 * i + (500 if i % 2 else 0)),
            e2e_ms=float(1000 + i),
            prefill_ms=float(i),
            decode_ms=float(2 * i),
        )
        for i in range(40)
    ]
    stats = Stats(since="s", window=100)
    for r in records:
        stats.add(r)
    return stats, records


class TestPerApi:
    """``by_api``: each API's requests, upstream errors and chat/tool latency summaries."""

    def test_each_api_is_summarised_over_its_own_records(self) -> None:
        """Each API's chat and tool summaries are summarize_kind over that API's completed
        records of the kind (count and window included); the kinds stay across APIs."""
        stats, records = two_apis()
        doc = stats.snapshot()
        assert list(doc["by_api"]) == ["chat_completions", "responses"]
        for api, entry in doc["by_api"].items():
            mine = [r for r in records if r.api == api]
            assert entry["requests"] == len(mine) == doc["apis"][api]
            assert entry["upstream_errors"] == {}
            for kind in (Kind.CHAT, Kind.TOOL):
                of_kind = [r for r in mine if r.kind is kind]
                expected = {**summarize_kind(of_kind), "window": len(of_kind)}
                assert entry["kinds"][str(kind)] == expected
        assert doc["kinds"]["tool"]["count"] == sum(1 for r in records if r.kind is Kind.TOOL)
        assert doc["kinds"]["tool"]["ttft_ms"] == summarize(records)["tool"]["ttft_ms"]

    def test_only_apis_with_requests_are_listed(self) -> None:
        """An API with no request is absent; one with only ``other`` requests (the
        completion endpoints) is listed with empty chat and tool summaries."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.OTHER, api="completions", e2e_ms=5.0))
        stats.add(rec(1, Kind.CHAT, api="messages", e2e_ms=7.0))
        by_api = stats.snapshot()["by_api"]
        assert set(by_api) == {"messages", "completions"}
        empty = by_api["completions"]["kinds"]
        assert (empty["chat"]["count"], empty["chat"]["window"]) == (0, 0)
        assert empty["tool"]["e2e_ms"] == {"p50": None, "p90": None, "p99": None}
        assert by_api["messages"]["kinds"]["chat"]["e2e_ms"]["p50"] == 7.0
        assert Stats(since="s").snapshot()["by_api"] == {}

    def test_unknown_api_names_fold_into_other(self) -> None:
        """A record with no ``api`` or a name no dialect has counts as ``other``, so the
        set of APIs is bounded by APIS whatever the records say."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.CHAT, api=None, e2e_ms=1.0))
        stats.add(rec(1, Kind.CHAT, api="made_up", e2e_ms=3.0))
        stats.add(rec(2, Kind.CHAT, api="responses", e2e_ms=9.0))
        doc = stats.snapshot()
        assert doc["apis"] == {"other": 2, "responses": 1}
        assert set(doc["by_api"]) <= set(APIS)
        assert doc["by_api"]["other"]["kinds"]["chat"]["e2e_ms"]["p50"] == 2.0
        assert [api_name(a) for a in (None, "made_up", *APIS)] == ["other", "other", *APIS]
        assert set(APIS) == {"chat_completions", "responses", "messages", "completions", "other"}

    def test_api_windows_are_bounded_and_keep_a_rare_api(self) -> None:
        """Each API's window holds its own last ``window`` completed records of the kind:
        a busy API cannot push a rare one's records out, and none grows past the bound."""
        stats = Stats(since="s", window=5)
        stats.add(rec(0, Kind.TOOL, api="messages", e2e_ms=777.0))
        for i in range(1, 50):
            stats.add(rec(i, Kind.TOOL, api="chat_completions", e2e_ms=float(i)))
        doc = stats.snapshot()
        rare = doc["by_api"]["messages"]["kinds"]["tool"]
        busy = doc["by_api"]["chat_completions"]["kinds"]["tool"]
        assert (rare["count"], rare["window"], rare["e2e_ms"]["p50"]) == (1, 1, 777.0)
        assert (busy["count"], busy["window"]) == (49, 5)
        assert busy["e2e_ms"]["p50"] == percentile([45.0, 46.0, 47.0, 48.0, 49.0], 0.5)
        assert doc["kinds"]["tool"]["window"] == 5
        assert 777.0 not in doc["kinds"]["tool"]["e2e_ms"].values()

    def test_errors_count_per_api_but_stay_out_of_its_percentiles(self) -> None:
        """A request that did not complete counts in its API's requests and kind count,
        not in the window or the percentiles."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.TOOL, api="responses", e2e_ms=900.0))
        stats.add(rec(1, Kind.TOOL, Outcome.UPSTREAM_ERROR, api="responses", e2e_ms=2.0))
        stats.add(rec(2, Kind.TOOL, Outcome.CLIENT_CLOSED, api="responses", e2e_ms=1.0))
        entry = stats.snapshot()["by_api"]["responses"]
        tool = entry["kinds"]["tool"]
        assert entry["requests"] == 3
        assert (tool["count"], tool["window"]) == (3, 1)
        assert tool["e2e_ms"] == {"p50": 900.0, "p90": 900.0, "p99": 900.0}

    def test_one_api_costs_no_extra_sort(self) -> None:
        """While one API serves every request its summaries are the kinds' (but for
        ``count``, which counts that API's requests): the snapshot yields once per field of
        the two kind windows only."""
        stats = Stats(since="s", window=10)
        for i in range(30):
            kind = Kind.TOOL if i % 2 else Kind.CHAT
            outcome = Outcome.CLIENT_CLOSED if i % 7 == 0 else Outcome.COMPLETED
            stats.add(rec(i, kind, outcome, api="messages", ttft_ms=float(i)))
        stats.add(rec(99, Kind.CHAT, Outcome.UPSTREAM_ERROR, api="responses", status=500))
        yields, doc = run_steps(stats)
        assert yields == 2 * len(SUMMARY_FIELDS)
        kinds = doc["by_api"]["messages"]["kinds"]
        for name in ("chat", "tool"):
            assert {k: v for k, v in kinds[name].items() if k != "count"} == {
                k: v for k, v in doc["kinds"][name].items() if k != "count"
            }
        assert kinds["chat"]["count"] == doc["kinds"]["chat"]["count"] - 1
        assert doc["by_api"]["responses"]["kinds"]["chat"]["window"] == 0
        assert doc == stats.snapshot()

    def test_several_apis_sort_each_window_in_steps(self) -> None:
        """With two APIs each window of each API's kind is sorted in its own steps (one per
        field), and the stepwise document equals snapshot()."""
        stats, _ = two_apis()
        yields, doc = run_steps(stats)
        assert yields == (2 + 2 * 2) * len(SUMMARY_FIELDS)
        assert doc == stats.snapshot()

    def test_api_summaries_share_nothing_with_the_kinds(self) -> None:
        """A summary copied from its kind's is a copy: changing one leaves the other."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.CHAT, api="responses", ttft_ms=5.0))
        doc = stats.snapshot()
        doc["by_api"]["responses"]["kinds"]["chat"]["ttft_ms"]["p50"] = -1.0
        assert doc["kinds"]["chat"]["ttft_ms"]["p50"] == 5.0

    def test_stepwise_snapshot_keeps_the_api_state_it_started_with(self) -> None:
        """Records of another API added during a stepwise snapshot enter neither its
        ``apis``, ``by_api`` nor ``upstream_errors``."""
        stats = Stats(since="s", window=5)
        for i in range(4):
            stats.add(rec(i, Kind.CHAT, api="chat_completions", ttft_ms=1.0))
        steps = stats.snapshot_steps()
        next(steps)
        for i in range(4, 10):
            stats.add(rec(i, Kind.CHAT, api="responses", ttft_ms=50.0))
            stats.add(rec(i + 10, Kind.TOOL, Outcome.UPSTREAM_ERROR, api="responses", status=500))
        doc = None
        while doc is None:
            try:
                next(steps)
            except StopIteration as done:
                doc = done.value
        assert doc["apis"] == {"chat_completions": 4}
        assert list(doc["by_api"]) == ["chat_completions"]
        assert doc["by_api"]["chat_completions"]["kinds"]["chat"]["ttft_ms"]["p99"] == 1.0
        assert doc["upstream_errors"] == {}
        assert stats.snapshot()["by_api"]["responses"]["upstream_errors"] == {"500": 6}

    def test_api_windows_hold_nothing_the_collector_walks(self) -> None:
        """The windows per API hold the kind windows' own rows: with two APIs, 1,000
        records still leave only the recent records (and a few deques) to the collector."""
        stats = Stats(since="s", recent=5, window=1000)
        gc.collect()
        before = len(gc.get_objects())
        for i in range(1000):
            api = "responses" if i % 2 else "messages"
            stats.add(rec(i, Kind.TOOL if i % 4 < 2 else Kind.CHAT, api=api, ttft_ms=float(i)))
        gc.collect()
        assert len(gc.get_objects()) - before < 100
        assert stats.snapshot()["by_api"]["responses"]["kinds"]["tool"]["window"] == 250


class TestUpstreamErrors:
    """``upstream_errors``: requests llama-server answered with an HTTP error, by status."""

    def test_counted_by_status(self) -> None:
        """Only upstream_error records count, under their status as a string, in status
        order; other outcomes (a completed 200, a client that left) do not."""
        stats = Stats(since="s")
        statuses = [500, 400, 500, 500, 503]
        for i, status in enumerate(statuses):
            stats.add(rec(i, Kind.TOOL, Outcome.UPSTREAM_ERROR, status=status, e2e_ms=3.0))
        stats.add(rec(10, Kind.TOOL, status=200, e2e_ms=800.0))
        stats.add(rec(11, Kind.TOOL, Outcome.CLIENT_CLOSED, status=200))
        doc = stats.snapshot()
        expected = {str(s): statuses.count(s) for s in sorted(set(statuses))}
        assert doc["upstream_errors"] == expected
        assert list(doc["upstream_errors"]) == ["400", "500", "503"]
        assert doc["outcomes"]["upstream_error"] == len(statuses)
        assert doc["kinds"]["tool"]["e2e_ms"]["p50"] == 800.0

    def test_per_api_and_across(self) -> None:
        """Each API has its own counts; the top level sums them. A record without a status
        counts as ``unknown``."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.TOOL, Outcome.UPSTREAM_ERROR, api="responses", status=500))
        stats.add(rec(1, Kind.CHAT, Outcome.UPSTREAM_ERROR, api="messages", status=500))
        stats.add(rec(2, Kind.OTHER, Outcome.UPSTREAM_ERROR, api="completions", status=None))
        doc = stats.snapshot()
        assert doc["upstream_errors"] == {"500": 2, "unknown": 1}
        assert {api: e["upstream_errors"] for api, e in doc["by_api"].items()} == {
            "responses": {"500": 1},
            "messages": {"500": 1},
            "completions": {"unknown": 1},
        }
        assert status_name(None) == "unknown" and status_name(404) == "404"

    def test_empty(self) -> None:
        """No upstream error: an empty object, not a missing key."""
        stats = Stats(since="s")
        stats.add(rec(0))
        assert stats.snapshot()["upstream_errors"] == {}


class TestSpeculation:
    def test_acceptance_and_decode_rates_with_and_without_drafts(self) -> None:
        """A kind's summary gives p50 draft_acceptance over the speculative records only,
        how many drafted, and the median decode rate with and without speculation apart."""
        records = [
            rec(0, decode_tok_s=80.0, draft_acceptance=0.9),
            rec(1, decode_tok_s=100.0, draft_acceptance=0.5),
            rec(2, decode_tok_s=120.0, draft_acceptance=0.7),
            rec(3, decode_tok_s=40.0),
            rec(4, decode_tok_s=60.0),
        ]
        out = summarize_kind(records)
        assert out["draft_acceptance"]["p50"] == 0.7
        assert out["speculation"] == {
            "drafted": 3,
            "decode_tok_s_p50_with": 100.0,
            "decode_tok_s_p50_without": 50.0,
        }

    def test_no_speculation_gives_none_not_zero(self) -> None:
        """Without drafts the acceptance is unknown and only the plain decode rate is given."""
        out = summarize_kind([rec(0, decode_tok_s=40.0)])
        assert out["draft_acceptance"]["p50"] is None
        assert out["speculation"] == {
            "drafted": 0,
            "decode_tok_s_p50_with": None,
            "decode_tok_s_p50_without": 40.0,
        }

    def test_stats_document_matches_summarize_kind(self) -> None:
        """/stats computes the speculation split from its windows exactly as the report does
        from whole records."""
        records = [
            rec(i, decode_tok_s=float(50 + i), draft_acceptance=(i % 3) / 3 if i % 2 else None)
            for i in range(9)
        ]
        stats = Stats(since="t")
        for r in records:
            stats.add(r)
        kind = stats.snapshot()["kinds"]["chat"]
        expected = summarize_kind(records)
        assert kind["speculation"] == expected["speculation"]
        assert kind["draft_acceptance"] == expected["draft_acceptance"]
