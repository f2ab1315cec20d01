"""Tests for proxy.core.stats: percentiles, per-kind and per-API summaries, upstream errors
by status, the bounded /stats aggregate, and the error of its histograms against the exact
percentiles of the same records."""

from __future__ import annotations

import gc
import json
import math
import random
import tracemalloc
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.record import Kind, Outcome, Record
from proxy.core.stats import (
    ALPHA,
    APIS,
    QUANTILES,
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
from tests.profiles import examples

GC_NOISE = 4
"""Objects the collector tracks that may appear or vanish between two counts for reasons
other than the code under test (seen: 1 in CI)."""
SEED_TOOL_TOTALS = [3172.0, 1813.0, 2061.0, 1432.0, 4071.0]  # ms, the seed's five tool calls
ROUNDING = 0.0011
"""Both sides are rounded to 0.001 (0.0005 each), plus float noise."""


def bound(ordered: list[float], q: float) -> float:
    """How far a /stats percentile may be from ``percentile(ordered, q)``, as stated in
    proxy.core.stats: ``ALPHA`` times the interpolation of the magnitudes of the two order
    statistics (``ALPHA * |exact|`` when they have one sign), plus the rounding."""
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    f = pos - lo
    return ALPHA * ((1 - f) * abs(ordered[lo]) + f * abs(ordered[hi])) + ROUNDING


def close(got: float | None, exact: float | None) -> bool:
    """``got`` is within the stated error of ``exact``, values of one sign (both None is
    close: no values)."""
    if got is None or exact is None:
        return got is None and exact is None
    return abs(got - exact) <= ALPHA * abs(exact) + ROUNDING


def assert_summary_close(got: dict[str, Any], exact: dict[str, Any], where: str = "") -> None:
    """A /stats kind summary against :func:`summarize_kind` of the same records: the same
    keys, counts equal, each percentile within the stated error. The split percentages
    follow from two medians each within ``ALPHA``: off by at most ``100 * ALPHA`` points
    (twice the worst case, 2·ALPHA·p(1-p) ≤ ALPHA/2), plus their rounding to 0.1."""
    assert set(got) == set(exact), where
    for key, value in exact.items():
        here = f"{where}/{key}"
        if isinstance(value, dict):
            assert_summary_close(got[key], value, here)
        elif key.endswith("_pct") and value is not None:
            assert abs(got[key] - value) <= 100 * ALPHA + 0.1, (here, got[key], value)
        elif key in ("p50", "p90", "p99", "prefill_ms", "decode_ms") or "_p50_" in key:
            assert close(got[key], value), (here, got[key], value)
        else:
            assert got[key] == value, (here, got[key], value)


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

    def test_windows_hold_nothing_that_grows_with_the_records(self) -> None:
        """Beyond the ``recent`` records, the windows keep no object the garbage collector
        tracks but their fixed arrays, however many records they hold: full windows add
        nothing to a full collection's pause (whole records made each one about 10 ms)."""
        stats = Stats(since="s", recent=5, window=1000)
        gc.collect()
        before = len(gc.get_objects())
        counts = []
        for batch in range(3):
            for i in range(1000 * batch, 1000 * (batch + 1)):
                kind = Kind.TOOL if i % 2 else Kind.CHAT
                stats.add(rec(i, kind, ttft_ms=float(i), prefill_ms=None, decode_tok_s=12.5))
            gc.collect()
            counts.append(len(gc.get_objects()) - before)
        # a few objects of the interpreter's own (another test's thread, a cache) may come
        # and go meanwhile: growth with the records would be thousands
        assert max(counts) - min(counts) <= GC_NOISE and max(counts) < 60
        assert stats.snapshot()["kinds"]["tool"]["window"] == 1000

    def test_memory_stops_growing_once_the_windows_are_full(self) -> None:
        """Once a window holds ``window`` records, more records (of values it has seen)
        allocate nothing that stays: the ring is overwritten in place."""
        stats = Stats(since="s", recent=5, window=500)

        def fill(start: int) -> None:
            for i in range(start, start + 2000):
                stats.add(rec(i, Kind.CHAT, ttft_ms=float(i % 700), e2e_ms=float(i % 300)))

        fill(0)
        tracemalloc.start()
        try:
            fill(2000)
            first, _ = tracemalloc.get_traced_memory()
            fill(4000)
            second, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert second - first < 4096

    def test_the_window_is_exactly_the_last_records(self) -> None:
        """A window covers exactly its last ``window`` completed records: after many values
        pushed through, three equal ones leave nothing else in any bucket (each percentile
        is that value, exactly, and ``window`` is 3)."""
        rng = random.Random(7)
        stats = Stats(since="s", window=3)
        for i in range(2000):
            stats.add(rec(i, Kind.CHAT, ttft_ms=rng.lognormvariate(5, 2), e2e_ms=rng.random()))
        for i in range(3):
            stats.add(rec(5000 + i, Kind.CHAT, ttft_ms=7.25, e2e_ms=None))
        chat = stats.snapshot()["kinds"]["chat"]
        assert chat["window"] == 3
        assert chat["ttft_ms"] == {"p50": 7.25, "p90": 7.25, "p99": 7.25}
        assert chat["e2e_ms"] == {"p50": None, "p90": None, "p99": None}

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
        records of the kind (count and window equal, percentiles within the stated error);
        the kinds stay across APIs."""
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
                assert_summary_close(entry["kinds"][str(kind)], expected, f"{api}/{kind}")
        assert doc["kinds"]["tool"]["count"] == sum(1 for r in records if r.kind is Kind.TOOL)
        tool = {**summarize(records)["tool"], "window": doc["kinds"]["tool"]["window"]}
        assert_summary_close(doc["kinds"]["tool"], tool, "tool")

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

    def test_one_api_shares_the_kinds_window(self) -> None:
        """While one API serves every completed record of a kind its summaries are the
        kinds' (but for ``count``, which counts that API's requests), and no second window
        is kept for it."""
        stats = Stats(since="s", window=10)
        for i in range(30):
            kind = Kind.TOOL if i % 2 else Kind.CHAT
            outcome = Outcome.CLIENT_CLOSED if i % 7 == 0 else Outcome.COMPLETED
            stats.add(rec(i, kind, outcome, api="messages", ttft_ms=float(i)))
        stats.add(rec(99, Kind.CHAT, Outcome.UPSTREAM_ERROR, api="responses", status=500))
        doc = stats.snapshot()
        kinds = doc["by_api"]["messages"]["kinds"]
        for name in ("chat", "tool"):
            assert {k: v for k, v in kinds[name].items() if k != "count"} == {
                k: v for k, v in doc["kinds"][name].items() if k != "count"
            }
        assert kinds["chat"]["count"] == doc["kinds"]["chat"]["count"] - 1
        assert doc["by_api"]["responses"]["kinds"]["chat"]["window"] == 0
        assert stats._api_windows == {}

    def test_a_second_api_splits_the_windows(self) -> None:
        """When a second API serves a kind, the first keeps the records it had (a copy of
        the kind's window) and from then on each API's window and the kind's go their own
        way, each over its own last ``window`` records."""
        stats = Stats(since="s", window=4)
        a = [float(v) for v in range(1, 7)]
        for i, v in enumerate(a):
            stats.add(rec(i, Kind.CHAT, api="responses", ttft_ms=v))
        stats.add(rec(10, Kind.CHAT, api="messages", ttft_ms=100.0))
        stats.add(rec(11, Kind.CHAT, api="responses", ttft_ms=7.0))
        doc = stats.snapshot()
        kind = [5.0, 6.0, 100.0, 7.0]  # the last four of the kind, across APIs
        own = {"responses": [4.0, 5.0, 6.0, 7.0], "messages": [100.0], "": kind}
        got = {api: e["kinds"]["chat"] for api, e in doc["by_api"].items()}
        got[""] = doc["kinds"]["chat"]
        for api, values in own.items():
            # each value sits alone in its bucket, so the histogram is exact here
            assert got[api]["ttft_ms"] == quantiles(sorted(values)), api
            assert got[api]["window"] == len(values)

    def test_several_busy_apis_match_the_exact_percentiles(self) -> None:
        """Five APIs interleaved past the window: each API's and each kind's percentiles
        are within the stated error of the exact ones over its own last ``window``
        completed records."""
        rng = random.Random(11)
        window = 200
        stats = Stats(since="s", window=window)
        records = []
        for i in range(3000):
            api = rng.choice(APIS)
            kind = rng.choice((Kind.CHAT, Kind.TOOL))
            scale = 1 + APIS.index(api)
            record = rec(i, kind, api=api, e2e_ms=scale * rng.paretovariate(1.2) * 100.0)
            records.append(record)
            stats.add(record)
        doc = stats.snapshot()
        for api in APIS:
            for kind in (Kind.CHAT, Kind.TOOL):
                mine = [r for r in records if r.api == api and r.kind is kind][-window:]
                got = doc["by_api"][api]["kinds"][str(kind)]
                assert got["window"] == len(mine)
                exact = summarize_kind(mine)
                assert_summary_close({**got, "count": len(mine)}, {**exact, "window": len(mine)})
        for kind in (Kind.CHAT, Kind.TOOL):
            mine = [r for r in records if r.kind is kind][-window:]
            exact = {**summarize_kind(mine), "window": window, "count": doc["kinds"][kind]["count"]}
            assert_summary_close(doc["kinds"][str(kind)], exact, str(kind))

    def test_api_summaries_share_nothing_with_the_kinds(self) -> None:
        """A summary copied from its kind's is a copy: changing one leaves the other."""
        stats = Stats(since="s")
        stats.add(rec(0, Kind.CHAT, api="responses", ttft_ms=5.0))
        doc = stats.snapshot()
        doc["by_api"]["responses"]["kinds"]["chat"]["ttft_ms"]["p50"] = -1.0
        assert doc["kinds"]["chat"]["ttft_ms"]["p50"] == 5.0

    def test_api_windows_hold_nothing_that_grows_with_the_records(self) -> None:
        """With two APIs (each with windows of its own) the objects the collector tracks
        stay a fixed number per window (its arrays: about 50), however many records come
        in."""
        stats = Stats(since="s", recent=5, window=1000)
        gc.collect()
        before = len(gc.get_objects())
        counts = []
        for batch in range(3):
            for i in range(1000 * batch, 1000 * (batch + 1)):
                api = "responses" if i % 2 else "messages"
                kind = Kind.TOOL if i % 4 < 2 else Kind.CHAT
                stats.add(rec(i, kind, api=api, ttft_ms=float(i)))
            gc.collect()
            counts.append(len(gc.get_objects()) - before)
        assert max(counts) - min(counts) <= GC_NOISE  # see the test above
        assert max(counts) < 4 * 60  # four API windows
        assert stats.snapshot()["by_api"]["responses"]["kinds"]["tool"]["window"] == 750


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


def seed_style(rng: random.Random, n: int) -> list[Record]:
    """Records shaped like the seed's measurements: tool calls whose totals are the seed's
    five (3,172 / 1,813 / 2,061 / 1,432 / 4,071 ms) again and again, each within 10 ms of
    its first time as in its repeated runs, TTFT about 820 ms, prefill 796, decode 1,265 ms
    at 6.0 tok/s; chat turns at TTFT 162 ms and 10.7 tok/s; a third of the chat turns
    drafted. Spread between prompts, not runs: log-normal around the seed's medians."""
    out = []
    for i in range(n):
        if i % 3:
            total = SEED_TOOL_TOTALS[i % 5] + rng.uniform(-10.0, 10.0)
            out.append(
                rec(
                    i,
                    Kind.TOOL,
                    ttft_ms=820.0 * rng.lognormvariate(0, 0.1),
                    prefill_ms=796.0 * rng.lognormvariate(0, 0.1),
                    decode_ms=1265.0 * rng.lognormvariate(0, 0.3),
                    decode_tok_s=6.0 * rng.lognormvariate(0, 0.05),
                    e2e_ms=total,
                    tool_call_ms=total,
                    overhead_ms=rng.uniform(0.2, 1.5),
                )
            )
        else:
            out.append(
                rec(
                    i,
                    Kind.CHAT,
                    ttft_ms=162.0 * rng.lognormvariate(0, 0.2),
                    prefill_ms=140.0 * rng.lognormvariate(0, 0.2),
                    decode_ms=2300.0 * rng.lognormvariate(0, 0.5),
                    decode_tok_s=10.7 * rng.lognormvariate(0, 0.05),
                    draft_acceptance=rng.random() if i % 9 == 0 else None,
                    e2e_ms=2500.0 * rng.lognormvariate(0, 0.5),
                    overhead_ms=rng.uniform(0.2, 1.5),
                )
            )
    return out


def window_of(values: list[float | None], window: int) -> list[float]:
    """The known values among the last ``window`` records, sorted."""
    return sorted(v for v in values[-window:] if v is not None)


def push(values: list[float | None], window: int) -> dict[str, Any]:
    """The ``ttft_ms`` percentiles of a Stats fed one chat record per value."""
    stats = Stats(since="s", window=window)
    for i, v in enumerate(values):
        stats.add(rec(i, Kind.CHAT, ttft_ms=v))
    return stats.snapshot()["kinds"]["chat"]["ttft_ms"]  # type: ignore[no-any-return]


def assert_within_bound(got: dict[str, Any], ordered: list[float]) -> None:
    """Each of p50/p90/p99 within :func:`bound` of the exact percentile of ``ordered``."""
    for name, q in QUANTILES:
        exact = percentile(ordered, q)
        if exact is None:
            assert got[name] is None
            continue
        assert abs(got[name] - exact) <= bound(ordered, q), (name, got[name], exact)


class TestHistogramError:
    """/stats reads percentiles from log-bucket histograms: each p50/p90/p99 within ALPHA
    of the exact percentile (linear interpolation between order statistics, as
    ``timing-proxy report`` computes) of the same records."""

    def test_seed_style_records_match_the_report(self) -> None:
        """Over 3,000 seed-style records through a window of 1,000, every percentile of
        every field of both kinds, the split and the speculation medians are within the
        stated error of summarize_kind over the same last 1,000 records of the kind."""
        records = seed_style(random.Random(15), 3000)
        stats = Stats(since="s", window=1000)
        for r in records:
            stats.add(r)
        kinds = stats.snapshot()["kinds"]
        for kind in (Kind.CHAT, Kind.TOOL):
            mine = [r for r in records if r.kind is kind]
            exact = {**summarize_kind(mine[-1000:]), "window": 1000, "count": len(mine)}
            assert_summary_close(kinds[str(kind)], exact, str(kind))

    def test_the_seeds_five_tool_calls_are_exact(self) -> None:
        """Values further apart than a bucket's width are each alone in their bucket, whose
        mean is the value: the seed's five totals give the report's percentiles exactly
        (median 2,061 ms)."""
        stats = Stats(since="s")
        for i, total in enumerate(SEED_TOOL_TOTALS):
            stats.add(rec(i, Kind.TOOL, tool_call_ms=total))
        got = stats.snapshot()["kinds"]["tool"]["tool_call_ms"]
        assert got == quantiles(sorted(SEED_TOOL_TOTALS))
        assert got["p50"] == 2061.0

    # about 1 s each: the fast loop draws one seed per law, the whole suite three
    @pytest.mark.parametrize(
        "seed", [1, *(pytest.param(s, marks=pytest.mark.slow) for s in (2, 3))]
    )
    @pytest.mark.parametrize(
        "draw",
        [
            lambda rng: 100.0 * rng.paretovariate(1.1),  # infinite variance
            lambda rng: rng.lognormvariate(3.0, 2.0),  # six decades
            lambda rng: rng.expovariate(0.01) if rng.random() > 0.1 else 0.0,  # zeros
        ],
        ids=["pareto-1.1", "lognormal-sigma-2", "exponential-with-zeros"],
    )
    def test_heavy_tailed_values_through_a_sliding_window(self, seed: int, draw: Any) -> None:
        """20,000 heavy-tailed values (with a fifth unknown) through a window of 5,000:
        p50/p90/p99 within ALPHA of the exact percentiles of the last 5,000 records'
        values."""
        rng = random.Random(seed)
        values = [draw(rng) if rng.random() > 0.2 else None for _ in range(20_000)]
        assert_within_bound(push(values, 5000), window_of(values, 5000))

    @settings(max_examples=examples(300), deadline=None)
    @given(
        values=st.lists(
            st.one_of(
                st.none(),
                st.floats(min_value=1e-6, max_value=1e9),
                st.floats(min_value=-1e6, max_value=-1e-6),
                st.just(0.0),
                st.sampled_from(SEED_TOOL_TOTALS),
            ),
            max_size=120,
        ),
        window=st.integers(min_value=1, max_value=50),
    )
    def test_any_values_any_window(self, values: list[float | None], window: int) -> None:
        """For any values (over fifteen decades, either sign, zeros, unknowns) and any
        window, each percentile is within ALPHA of the interpolated magnitudes of its two
        order statistics, over exactly the last ``window`` records: ALPHA of the exact
        percentile when they have one sign."""
        assert_within_bound(push(values, window), window_of(values, window))

    def test_repeated_values_are_exact(self) -> None:
        """A bucket answers with the mean of its values: one value repeated is read back
        exactly, at any percentile (the single request of the relay's tests)."""
        assert push([186.123] * 50, 100) == {"p50": 186.123, "p90": 186.123, "p99": 186.123}
        assert push([0.0, 0.0], 10) == {"p50": 0.0, "p90": 0.0, "p99": 0.0}

    def test_values_that_are_not_finite_are_unknown(self) -> None:
        """Infinity and NaN (no bucket holds them) count as unknown values, like None."""
        assert push([math.inf, math.nan, -math.inf], 10) == {"p50": None, "p90": None, "p99": None}
        assert push([5.0, math.inf, 7.0, math.nan], 10) == quantiles([5.0, 7.0])

    def test_speculation_medians_within_the_error(self) -> None:
        """The decode rate's medians with and without drafts come from histograms of their
        own: within ALPHA of the exact medians of each group over the window."""
        rng = random.Random(5)
        records = [
            rec(
                i,
                decode_tok_s=rng.lognormvariate(3.0, 0.5),
                draft_acceptance=rng.random() if i % 3 == 0 else None,
            )
            for i in range(5000)
        ]
        stats = Stats(since="s", window=2000)
        for r in records:
            stats.add(r)
        got = stats.snapshot()["kinds"]["chat"]["speculation"]
        exact = summarize_kind(records[-2000:])["speculation"]
        assert got["drafted"] == exact["drafted"]
        for key in ("decode_tok_s_p50_with", "decode_tok_s_p50_without"):
            assert close(got[key], exact[key]), (key, got[key], exact[key])
