"""The peers benchmark's report (``bench/peers/report.py``) on fixed inputs: what the table
and the standing lines say follows from the results they are given (no processes, no
timing)."""

from __future__ import annotations

from typing import Any

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
            "other_cores": {"latency": 0.1, "long_stream": 0.2},
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
        assert f"{res['long_stream']['modes'][name]['events_per_s_median']:,.0f}" in cells[7]
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
