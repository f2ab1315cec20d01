"""The benches' report (``bench/overhead/report.py``, ``bench/peers/report.py``) on fixed
inputs: what the table, the targets and the standing lines say follows from the results they
are given (no processes, no timing)."""

from __future__ import annotations

from typing import Any

from bench.overhead.report import BARE, targets
from bench.overhead.report import report as relay_report
from bench.peers.report import PROXY, report, standing, table


def _lat_entry(p50: float, p90: float, p99: float, cpu: float, same: int, n: int) -> Any:
    return {
        "ms": {"p50": 1.0 + p50, "p90": 2.0 + p90, "p99": 3.0 + p99},
        "added_ms": {"median_diff": p50, "p90_diff": p90, "p99_diff": p99},
        "cpu_us_per_request": cpu,
        "identical_to_direct": same,
        "requests": n,
    }


def _results() -> dict[str, Any]:
    """A run of direct, timing-proxy, two peers (one beats it on JSON CPU) and a skipped one."""
    n = 10
    direct = {"ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}, "identical_to_direct": n, "requests": n}
    kinds = {
        "stream": {
            "direct": direct,
            PROXY: _lat_entry(0.4, 0.6, 0.9, 900.0, n, n),
            "gw": _lat_entry(30.0, 40.0, 50.0, 9000.0, 0, n),
            "tap": _lat_entry(0.7, 1.1, 2.0, 1200.0, n - 3, n),
        },
        "plain": {
            "direct": direct,
            PROXY: _lat_entry(0.3, 0.5, 0.8, 700.0, n, n),
            "gw": _lat_entry(3.0, 4.0, 5.0, 3000.0, 0, n),
            "tap": _lat_entry(0.5, 0.8, 1.0, 400.0, n, n),
        },
    }

    def long_entry(eps: float, same: bool) -> dict[str, Any]:
        return {
            "events_per_s_median": eps,
            "ratio_to_direct": eps / 100_000.0,
            "cpu_us_per_event_median": 1e6 / eps,
            "same_size_as_direct": same,
        }

    paths = {
        "direct": {"does": "nothing between", "analyses": False},
        PROXY: {"does": "records", "analyses": True, "version": None},
        "gw": {"does": "translates", "analyses": True, "version": "gw==1"},
        "tap": {"does": "taps", "analyses": True, "version": "tap==2"},
        "gone": {"does": "would relay", "analyses": True, "version": "gone==3"},
    }
    return {
        "timestamp": "2026-12-01T00:00:00Z",
        "command": ".venv/bin/python bench/peers.py",
        "runtime_s": 12.0,
        "machine": {
            "nproc": 2,
            "cpu_model": "cpu",
            "kernel": "k",
            "python": "3.11",
            "aiohttp": "3",
            "node": "v20",
            "git_commit": "abc",
            "proxy_dir_modified": False,
        },
        "load": {
            "before": [0.5, 0.4, 0.3],
            "after": [1.5, 1.4, 1.3],
            "other_cores": 0.15,
        },
        "order": ["direct", PROXY, "gw", "tap", "gone"],
        "paths": paths,
        "skipped": {"gone": "npm install failed"},
        "failed": {},
        "latency": {
            "rounds": n,
            "warmup": 1,
            "block": 5,
            "stream_sse_events": 100,
            "plain_body_bytes": 645,
            "kinds": kinds,
        },
        "long_stream": {
            "sse_events": 20_003,
            "runs_per_path": 1,
            "modes": {
                "direct": long_entry(100_000.0, True),
                PROXY: long_entry(90_000.0, True),
                "gw": long_entry(1_000.0, False),
                "tap": long_entry(20_000.0, True),
            },
        },
        "rss_mib": {"direct": None, PROXY: 47.0, "gw": 400.0, "tap": 28.0},
    }


def _row(lines: list[str], name: str) -> list[str]:
    (line,) = [x for x in lines if x.startswith(f"| {name} |")]
    return [c.strip() for c in line.split("|")[1:-1]]


def test_table_has_a_row_per_path_with_the_added_latency_cpu_and_byte_identity() -> None:
    """Each path's row shows its added p50/p90/p99 of both kinds, CPU per request, RSS,
    long-stream rate with the ratio to direct, and whether its streamed bytes equal direct's;
    direct's row shows absolute latencies."""
    res = _results()
    lines = table(res)
    assert len(lines) == 2 + len(res["order"])
    for name in (PROXY, "gw", "tap"):
        cells = _row(lines, name)
        s = res["latency"]["kinds"]["stream"][name]
        a = s["added_ms"]
        assert cells[2] == f"{a['median_diff']:+.2f} / {a['p90_diff']:+.2f} / {a['p99_diff']:+.2f}"
        assert cells[4] == f"{s['cpu_us_per_request']:,.0f}"
        assert cells[6] == f"{res['rss_mib'][name]:,.0f}"
        long = res["long_stream"]["modes"][name]
        assert cells[7] == (
            f"{long['events_per_s_median']:,.0f} ({long['ratio_to_direct']:.2f}×; "
            f"{long['cpu_us_per_event_median']:.1f} µs CPU/event)"
        )
    direct = _row(lines, "direct")
    assert "absolute" in direct[2]
    assert _row(lines, PROXY)[8] == "yes"
    assert _row(lines, "gw")[8].startswith("no")
    assert "long stream differs" in _row(lines, "gw")[8]
    tap_stream = res["latency"]["kinds"]["stream"]["tap"]
    differ = tap_stream["requests"] - tap_stream["identical_to_direct"]
    assert f"{differ} of {tap_stream['requests']} differ" in _row(lines, "tap")[8]


def test_a_skipped_peer_shows_its_reason() -> None:
    """A peer that could not be installed or started keeps its row, with the reason."""
    res = _results()
    cells = _row(table(res), "gone")
    assert f"skipped: {res['skipped']['gone']}" in cells


def test_standing_ranks_timing_proxy_among_the_analysing_paths() -> None:
    """The standing ranks timing-proxy among the paths that do more than forward (lowest
    latency and CPU, highest long-stream rate), names the better peer and by how much where
    it is not best, and leaves out skipped paths."""
    res = _results()
    lines = standing(res)
    assert "gone" not in lines[0]
    stream = next(x for x in lines if x.startswith("* stream added p50:"))
    assert "rank 1 of 3" in stream and "best, by" in stream
    cpu_plain = next(x for x in lines if x.startswith("* CPU per JSON reply:"))
    plain = res["latency"]["kinds"]["plain"]
    gap = plain[PROXY]["cpu_us_per_request"] - plain["tap"]["cpu_us_per_request"]
    assert "rank 2 of 3" in cpu_plain and "**not best**: tap" in cpu_plain
    assert f"{gap:,.0f} µs better" in cpu_plain
    eps = next(x for x in lines if x.startswith("* long-stream events/s:"))
    assert "rank 1 of 3" in eps


def test_report_header_quotes_the_command_load_and_versions() -> None:
    """The report's header carries the exact command, its runtime, the load average before
    and after, and each peer's version, so that the table can be pasted with its context."""
    res = _results()
    text = report(res)
    assert f"`{res['command']}` ({res['runtime_s']:.0f} s)" in text
    assert " / ".join(f"{x:.2f}" for x in res["load"]["before"]) in text
    assert " / ".join(f"{x:.2f}" for x in res["load"]["after"]) in text
    for name in ("gw", "tap"):
        assert res["paths"][name]["version"] in text


def _relay_results(stream_over: float, json_over: float, ratio: float, us: float) -> Any:
    """A relay run: timing-proxy ``stream_over`` / ``json_over`` ms above the bare relay's
    added p50 (in every quarter too), its long stream at ``ratio`` × direct, its analysis at
    ``us`` µs per event."""
    res = _results()
    for kind, over in (("stream", stream_over), ("plain", json_over)):
        entries = res["latency"]["kinds"][kind]
        ours = entries[PROXY]["added_ms"]
        ours["quarters_p50"] = [ours["median_diff"]] * 4
        bare = _lat_entry(ours["median_diff"] - over, 0.5, 0.8, 500.0, 10, 10)
        bare["added_ms"]["quarters_p50"] = [bare["added_ms"]["median_diff"]] * 4
        entries[BARE] = bare
    res["long_stream"]["modes"][PROXY]["ratio_to_direct"] = ratio
    res["tracker"] = {
        "sse_events": 20_003,
        "reps": 1,
        **{
            name: {"tracker": {"cpu_us_per_event_median": us}}
            for name in ("1_event_per_chunk", "4_events_per_chunk", "64_KiB_reads")
        },
        "reference_orjson_loads_every_event": {"cpu_us_per_event_median": 0.5},
    }
    return res


def test_relay_targets_are_met_within_their_limits() -> None:
    """Within every limit (+0.10 ms per stream and +0.05 ms per JSON reply over the bare
    relay, the long stream at 1.0× direct or more, 3 µs of analysis per event), each target
    row shows its figure and says yes, and none says no."""
    rows = targets(_relay_results(0.09, 0.04, 1.2, 0.8))[2:-1]
    assert len(rows) == 4
    assert all(row.endswith("| yes |") for row in rows), rows
    assert "+0.090 ms" in rows[0] and "+0.040 ms" in rows[1]
    assert "1.20×" in rows[2] and "0.80 µs" in rows[3]


def test_relay_targets_missed_say_no() -> None:
    """Past every limit, each target row says a bold no with the figure that missed it."""
    rows = targets(_relay_results(0.11, 0.06, 0.9, 3.5))[2:-1]
    assert all(row.endswith("| **no** |") for row in rows), rows
    assert "+0.110 ms" in rows[0] and "+0.060 ms" in rows[1]
    assert "0.90×" in rows[2] and "3.50 µs" in rows[3]


def test_relay_report_without_the_bare_relay_judges_no_latency_target() -> None:
    """A run without the bare relay has no added latency to judge against it: the report
    shows no latency target rather than one against a missing reference."""
    res = _relay_results(0.0, 0.0, 1.2, 0.8)
    for kind in ("stream", "plain"):
        del res["latency"]["kinds"][kind][BARE]
    text = relay_report(res)
    assert "over the bare aiohttp relay" not in text
    assert "direct's events/s" in text and "analysis in-process" in text
