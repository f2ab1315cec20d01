"""Tests for proxy.commands.report (reading logs, the report, the text table) and plot."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.commands.report import (
    ReportError,
    Run,
    build_report,
    load_runs,
    median_call,
    median_record,
    render_text,
    run_report,
)
from proxy.commands.report.summary import TOP_CONVERSATIONS, upstream_errors
from proxy.config import BoardConfig
from proxy.core.findings import FIXES, Cause, Finding
from proxy.core.numbers import figure_or_dash
from proxy.core.record import Kind, Outcome, Record
from proxy.core.roofline import Board, ModelMeta
from proxy.core.stats import ALPHA, APIS, SUMMARY_FIELDS, Stats, percentile

SEED_TOOL_TOTALS = [3172.0, 1813.0, 2061.0, 1432.0, 4071.0]  # ms, the seed's five tool calls
SEED_RUN_MEDIANS = [2070.0, 2061.0, 2066.0]  # ms, the seed's three reruns
SEED_META = ModelMeta(2_450_000_000, 4_000_000_000, "qwen3-4b")
ORIN = Board.from_config(BoardConfig(preset="jetson-orin-nano-8gb"))

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def rec(
    i: int = 0, kind: Kind = Kind.TOOL, outcome: Outcome = Outcome.COMPLETED, **fields: Any
) -> Record:
    """A record with id ``r-i`` and the given fields."""
    return Record(
        id=f"r-{i}",
        ts="2026-10-04T10:00:00Z",
        method="POST",
        path="/v1/chat/completions",
        model="qwen3-4b",
        kind=kind,
        outcome=outcome,
        **fields,
    )


def tool_call(i: int, total: float, **fields: Any) -> Record:
    """A completed tool call of ``total`` ms: TTFT 820, prefill 796, 10 tokens."""
    base: dict[str, Any] = {
        "ttft_ms": 820.0,
        "prefill_ms": 796.0,
        "overhead_ms": 24.0,
        "decode_ms": total - 820.0,
        "e2e_ms": total,
        "tool_call_ms": total,
        "predicted_n": 10,
        "decode_tok_s": 6.0,
        "tool_calls": 1,
        "tool_call_valid": True,
        "tool_call_tokens": 10,
        "prompt_n": 420,
        "cache_n": 0,
        "prompt_tokens": 420,
    }
    base.update(fields)
    return rec(i, Kind.TOOL, **base)


def log_line(record: Record) -> bytes:
    """The proxy's log line for a record: the record's fields flat at the top level."""
    return orjson.dumps(
        {
            "event": "request_completed",
            "level": "info",
            "timestamp": "2026-10-04T10:00:00Z",
            **record.to_dict(),
        }
    )


def write_log(path: Path, records: Sequence[Record], extra: Sequence[bytes] = ()) -> str:
    """Write a JSON-lines log of ``records`` (plus ``extra`` raw lines) and return its path."""
    data = b"\n".join([*map(log_line, records), *extra]) + b"\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return str(path)


def seed_run(tmp_path: Path, name: str, median: float) -> str:
    """A run of five tool calls whose median total is ``median`` (the seed's spread around it)."""
    shift = median - 2061.0
    records = [tool_call(i, t + shift) for i, t in enumerate(SEED_TOOL_TOTALS)]
    return write_log(tmp_path / name, records)


@pytest.fixture(name="three_runs")
def _three_runs(tmp_path: Path) -> list[str]:
    return [seed_run(tmp_path, f"run{i + 1}.jsonl", m) for i, m in enumerate(SEED_RUN_MEDIANS)]


class TestLoadRuns:
    def test_records_read_back(self, tmp_path: Path) -> None:
        """Each request_completed line becomes the same Record again."""
        records = [tool_call(i, t) for i, t in enumerate(SEED_TOOL_TOTALS)]
        (run,) = load_runs([write_log(tmp_path / "a.jsonl", records)])
        assert run.name == "a.jsonl"
        assert run.records == records
        assert run.skipped == {}
        assert run.missing == {}

    def test_junk_skipped_and_counted(self, tmp_path: Path) -> None:
        """Non-JSON lines, other events, lines with neither a kind nor a timing and invalid
        records are skipped and counted by reason."""
        extra = [
            b"not json at all",
            b'{"event":"request_completed","id":"x"',  # cut off mid-write
            b"[1, 2]",
            b'{"event":"proxy_started","listen":"127.0.0.1:8081"}',
            b'{"event":"schema_prefilled_again","id":"r-1"}',
            b'{"event":"request_completed","id":"x"}',  # neither a kind nor a timing
            b'{"event":"request_completed","id":"x","ts":"t","method":"POST","path":"/",'
            b'"kind":"robot"}',
            b"",
        ]
        path = write_log(tmp_path / "a.jsonl", [tool_call(0, 2061.0)], extra)
        (run,) = load_runs([path])
        assert len(run.records) == 1
        assert run.skipped == {
            "not_json": 3,
            "other_event": 2,
            "no_kind_or_timing": 1,
            "bad_record": 1,
        }
        assert run.skipped_total == 7

    def test_a_field_the_line_lacks_is_unknown(self, tmp_path: Path) -> None:
        """A request_completed line without a field (an older log) is read, the field None,
        and counted as missing."""
        line = orjson.loads(log_line(tool_call(0, 2061.0)))
        del line["tool_args_chars"], line["ts"]
        (run,) = load_runs([write_log(tmp_path / "a.jsonl", [], [orjson.dumps(line)])])
        read = [r.to_dict() for r in run.records]  # as dicts: Record types ts as a str
        assert [(d["e2e_ms"], d["ts"], d["tool_args_chars"]) for d in read] == [
            (2061.0, None, None)
        ]
        assert run.missing == {"ts": 1, "tool_args_chars": 1}

    def test_gzip(self, tmp_path: Path) -> None:
        """A .gz log is decompressed."""
        path = write_log(tmp_path / "a.jsonl.gz", [tool_call(0, 2061.0)])
        (run,) = load_runs([path])
        assert [r.e2e_ms for r in run.records] == [2061.0]

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing file is a ReportError naming it."""
        with pytest.raises(ReportError, match=r"nope\.jsonl"):
            load_runs([str(tmp_path / "nope.jsonl")])

    def test_same_base_names_keep_paths(self, tmp_path: Path) -> None:
        """Runs with the same file name in different folders are named by their paths."""
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        paths = [write_log(tmp_path / d / "log.jsonl", [tool_call(0, 1.0)]) for d in "ab"]
        assert [run.name for run in load_runs(paths)] == paths


HARNESS_LOG = b"""\
{"kind": "tool", "ttft_ms": 1234.5, "prefill_ms": 796.0, "decode_ms": 1265.0, "e2e_ms": 2061.0}
{"kind": "tool", "ttft_ms": 1100.0, "prefill_ms": 700.0, "decode_ms": 1200.0, "e2e_ms": 1900.0}
{"kind": "tool", "ttft_ms": 1500.0, "prefill_ms": 900.0, "decode_ms": 1400.0, "e2e_ms": 2500.0}
{"ttft_ms": 150.0, "e2e_ms": 900.0}
{"note": "harness started", "model": "qwen3-4b"}
"""
"""Another harness's per-call summary: three tool calls with their times and nothing else,
one call without a kind, and a line with neither a kind nor a timing."""


@pytest.fixture(name="harness_log")
def _harness_log(tmp_path: Path) -> str:
    path = tmp_path / "harness.jsonl"
    path.write_bytes(HARNESS_LOG)
    return str(path)


class TestPartialLog:
    def test_lines_with_a_kind_or_a_timing_are_records(self, harness_log: str) -> None:
        """Lines without an event but with a kind or a timing are read, the fields they
        lack unknown; the line with neither is skipped and says so."""
        (run,) = load_runs([harness_log])
        assert [r.ttft_ms for r in run.records] == [1234.5, 1100.0, 1500.0, 150.0]
        read = [r.to_dict() for r in run.records]  # as dicts: Record types id and ts as str
        assert {(d["id"], d["ts"], d["outcome"]) for d in read} == {(None, None, "completed")}
        assert [r.kind for r in run.records] == [Kind.TOOL] * 3 + [Kind.OTHER]
        assert run.skipped == {"no_kind_or_timing": 1}

    def test_missing_fields_counted(self, harness_log: str) -> None:
        """Each record field a kept line lacks is counted by name; present ones are not, nor
        are those derived (the call without prefill and decode gets them from its TTFT and
        end-to-end time, and the derivation is counted)."""
        (run,) = load_runs([harness_log])
        assert run.missing["ts"] == run.missing["outcome"] == 4
        assert run.missing["kind"] == 1
        assert "ttft_ms" not in run.missing and "e2e_ms" not in run.missing
        assert "prefill_ms" not in run.missing and "decode_ms" not in run.missing
        assert run.derived == {"prefill_ms": 1, "decode_ms": 1}
        assert run.records[3].prefill_ms == 150.0 and run.records[3].decode_ms == 750.0

    def test_summarised_as_completed(self, harness_log: str) -> None:
        """The tool calls without an outcome count as completed: their median is 2,061 ms."""
        report = build_report(load_runs([harness_log]))
        tool = report["kinds"]["tool"]
        assert (tool["count"], tool["window"]) == (3, 3)
        assert tool["e2e_ms"]["p50"] == 2061.0 and tool["ttft_ms"]["p50"] == 1234.5
        assert report["requests"] == 3
        assert report["kinds"]["chat"]["count"] == 0
        assert report["unknown"] == {
            "outcome": "counted as completed",
            "kind": "in neither the chat nor the tool summary",
        }

    def test_document_lists_missing_fields(self, harness_log: str) -> None:
        """The document has the missing fields, those the summary needs first (kind,
        predicted_n), then the most often missing, also per run."""
        report = build_report(load_runs([harness_log]))
        missing = report["missing_fields"]
        assert missing["outcome"] == 4 and missing["kind"] == 1
        assert list(missing)[:6] == ["kind", "predicted_n", "id", "ts", "method", "path"]
        assert report["runs"][0]["missing_fields"] == missing

    def test_text_says_what_was_missing(self, harness_log: str) -> None:
        """The text names the missing fields with counts and how such records were counted."""
        text = render_text(build_report(load_runs([harness_log])))
        assert "1 run, 3 requests" in text
        assert "1 line skipped (1 no kind or timing)" in text
        assert "fields missing (read as unknown): kind 1, predicted_n 4, id 4, ts 4," in text
        assert "outcome 4" in text and "(all in --json)" in text
        assert "4 records with no outcome: counted as completed" in text
        assert "1 record with no kind: in neither the chat nor the tool summary" in text
        assert "median call               (no id): 2,061 ms end to end" in text
        assert "valid tool calls" not in text  # unknown, not "3 no call"

    def test_proxy_log_says_nothing_missing(self, tmp_path: Path) -> None:
        """The proxy's own log has every field: no missing-fields line, no unknowns."""
        report = build_report(load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)]))
        assert report["missing_fields"] == {} and report["unknown"] == {}
        assert "fields missing" not in render_text(report)

    def test_a_time_that_is_not_a_number(self, tmp_path: Path) -> None:
        """A line whose time is not a number is skipped as a bad record, not summarised."""
        path = tmp_path / "a.jsonl"
        path.write_bytes(b'{"kind": "tool", "ttft_ms": "fast"}\n{"kind": "tool", "e2e_ms": 5}\n')
        (run,) = load_runs([str(path)])
        assert [r.e2e_ms for r in run.records] == [5]
        assert run.skipped == {"bad_record": 1}

    def test_report_command_on_a_partial_log(self, harness_log: str) -> None:
        """run_report prints the table for a harness's log instead of 0 requests."""
        out = run_report([harness_log], json_out=False, kind=None, plot=None, board=None, meta=None)
        assert "3 requests" in out and "2,061" in out


HARNESS_SUMMARY: dict[str, list[dict[str, Any]]] = {
    "chat": [
        {"ttft_ms": 150.0, "tokens": 33, "total_ms": 3226.9},
        {"ttft_ms": 158.0, "tokens": 40, "total_ms": 3703.5},
        {"ttft_ms": 162.0, "tokens": 29, "total_ms": 2778.8},
        {"ttft_ms": 171.0, "tokens": 36, "total_ms": 3382.0},
        {"ttft_ms": 185.0, "tokens": 25, "total_ms": 2470.7},
    ],
    "tool": [
        {"ttft_ms": 820.0, "tokens": 10, "total_ms": 3172.0},
        {"ttft_ms": 850.0, "tokens": 10, "total_ms": 1813.0},
        {"ttft_ms": 796.0, "tokens": 10, "total_ms": 2061.0},
        {"ttft_ms": 432.0, "tokens": 7, "total_ms": 1432.0},
        {"ttft_ms": 900.0, "tokens": 10, "total_ms": 4071.0},
    ],
}
"""The Jetson measurement's harness summary, in its own shape (one JSON document, calls per
kind, each ``{ttft_ms, tokens, total_ms}``). From the measurement: the five tool totals
3,172 / 1,813 / 2,061 / 1,432 / 4,071 ms (median 2,061), tool TTFT median 820 ms, chat TTFT
median 162 ms, tool-call tokens 10, tool decode 6.0 tok/s as the median of the calls' rates,
chat decode 10.7 tok/s, and the median call's split 796 ms + 1,265 ms (its own rate
9 / 1.265 s = 7.1 tok/s). The log is not published: the per-call chat TTFTs, token counts and
totals and the other tool calls' TTFTs and tokens are chosen here to be consistent with those
medians (decode rate = (tokens - 1) / (total - TTFT))."""


def write_summary(path: Path, indent: bool = True) -> str:
    """Write the harness summary as one JSON document (indented, or on one line)."""
    path.write_text(json.dumps(HARNESS_SUMMARY, indent=2 if indent else None))
    return str(path)


def flattened(path: Path) -> str:
    """Write the harness summary as JSON lines, one call a line, with the harness's names
    and the call's kind."""
    lines = [
        json.dumps({"kind": kind, **call})
        for kind, calls in HARNESS_SUMMARY.items()
        for call in calls
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


SUMMARY_MAPPED = (
    "names mapped: total_ms -> e2e_ms, tokens -> predicted_n,"
    " tokens -> tool_call_tokens for tool calls"
)


class TestHarnessSummary:
    """The measurement's harness summary, read as it was written."""

    @pytest.mark.parametrize("indent", [True, False])
    def test_document_read_as_calls_per_kind(self, tmp_path: Path, indent: bool) -> None:
        """The JSON document (indented or on one line) is read whole: five calls of each
        kind, the harness's names mapped, nothing skipped."""
        (run,) = load_runs([write_summary(tmp_path / "s.json", indent)])
        assert [str(r.kind) for r in run.records] == ["chat"] * 5 + ["tool"] * 5
        assert run.skipped == {}
        assert run.read_as == "a JSON document: calls per kind (chat 5, tool 5)"
        assert sorted(r.e2e_ms or 0 for r in run.records if r.kind is Kind.TOOL) == sorted(
            SEED_TOOL_TOTALS
        )
        assert [r.tool_call_tokens for r in run.records if r.kind is Kind.TOOL] == [
            10,
            10,
            10,
            7,
            10,
        ]
        assert {r.tool_call_tokens for r in run.records if r.kind is Kind.CHAT} == {None}

    def test_reproduces_the_measurement(self, tmp_path: Path) -> None:
        """The table has the measurement's figures: tool TTFT p50 820, chat 162, tool total
        p50 2,061, tool-call tokens 10, tool decode 6.0 tok/s (median of the calls' rates)
        beside the median call's own 7.1, chat decode 10.7."""
        report = build_report(load_runs([write_summary(tmp_path / "s.json")]))
        tool, chat = report["kinds"]["tool"], report["kinds"]["chat"]
        assert (tool["ttft_ms"]["p50"], chat["ttft_ms"]["p50"]) == (820.0, 162.0)
        assert tool["e2e_ms"]["p50"] == 2061.0
        assert tool["tool_call_tokens"]["p50"] == 10
        assert round(tool["decode_tok_s"]["p50"], 1) == 6.0
        assert round(chat["decode_tok_s"]["p50"], 1) == 10.7
        call = tool["median_call"]
        assert (call["prefill_ms"], call["decode_ms"]) == (796.0, 1265.0)
        text = render_text(report)
        assert "its own rate 7.1 tok/s; the p50 above, 6.0, is the calls' median" in text

    def test_cross_check_line(self, tmp_path: Path) -> None:
        """The text has the measurement's cross-check, tool TTFT - chat TTFT = 658 ms; with
        the model and the board, the tokens it stands for at each peak's compute time."""
        path = write_summary(tmp_path / "s.json")
        plain = render_text(build_report(load_runs([path])))
        assert "tool TTFT - chat TTFT = 658 ms of prefill per call for the tools" in plain
        assert "820 - 162 ms, 4.1x the chat TTFT" in plain
        assert "tokens at" not in plain
        report = build_report(load_runs([path]), meta=SEED_META, board=ORIN)
        text = render_text(report)
        assert "= about 105 tokens at 6.25 ms per token" in text
        assert "= about 842 tokens at 0.78 ms per token" in text
        tokens = {t["basis"]: round(t["tokens"]) for t in report["tools_prefill"]["tokens"]}
        assert tokens == {"FP16 tensor": 842, "FP32 CUDA cores": 105}

    def test_says_what_was_mapped_and_derived(self, tmp_path: Path) -> None:
        """One line names the mapping used; the derived fields are named with their formula,
        and the caveat that prefill = TTFT is an upper bound; the document has both."""
        report = build_report(load_runs([write_summary(tmp_path / "s.json")]))
        lines = render_text(report).splitlines()
        assert SUMMARY_MAPPED in lines
        assert "read s.json as a JSON document: calls per kind (chat 5, tool 5)" in lines
        derived = next(line for line in lines if line.startswith("derived:"))
        assert "prefill_ms = ttft_ms" in derived and "decode_ms = e2e_ms - ttft_ms" in derived
        assert "an upper bound" in render_text(report)
        assert report["mapped"] == {
            "total_ms -> e2e_ms": 10,
            "tokens -> predicted_n": 10,
            "tokens -> tool_call_tokens for tool calls": 5,
        }
        assert set(report["derived"]) == {
            "prefill_ms = ttft_ms",
            "decode_ms = e2e_ms - ttft_ms",
            "decode_tok_s = (predicted_n - 1) / decode_ms x 1000",
        }

    def test_flattened_lines_keep_total_and_tokens(self, tmp_path: Path) -> None:
        """Flattened to one call a line with the harness's names, total_ms and tokens are
        read (not dropped), and the fields the summary needs are not missing."""
        report = build_report(load_runs([flattened(tmp_path / "f.jsonl")]))
        assert report["kinds"]["tool"]["e2e_ms"]["p50"] == 2061.0
        assert report["kinds"]["tool"]["tool_call_tokens"]["p50"] == 10
        for name in ("e2e_ms", "prefill_ms", "decode_ms", "predicted_n"):
            assert name not in report["missing_fields"]
        lines = render_text(report).splitlines()
        assert SUMMARY_MAPPED in lines
        assert not any(line.startswith("read ") for line in lines)  # JSON lines: no shape line

    def test_roofline_on_the_summary(self, tmp_path: Path) -> None:
        """With the model and the preset, the roofline names each peak's precision and gives
        a ridge for each (151 and 18.8), and says the prefill compute is unknown without the
        prompt tokens."""
        runs = load_runs([write_summary(tmp_path / "s.json")])
        text = render_text(build_report(runs, meta=SEED_META, board=ORIN))
        assert "10.2 TFLOP/s FP16 tensor, 1.28 TFLOP/s FP32 CUDA cores (spec)" in text
        assert "FP16 tensor: 10.2 TFLOP/s / 68 GB/s = 151 FLOP per byte (spec)" in text
        assert "FP32 CUDA cores: 1.28 TFLOP/s / 68 GB/s = 18.8 FLOP per byte (spec)" in text
        assert "1 / 6.0 tok/s = 167 ms per token (measured: the median of the calls' rates)" in text
        assert "compute achieved: unknown" in text

    @pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed (the plot extra)")
    def test_plot(self, tmp_path: Path) -> None:
        """--plot draws the summary's median calls."""
        png = tmp_path / "clock.png"
        out = run_report(
            [write_summary(tmp_path / "s.json")],
            json_out=False,
            kind=None,
            plot=str(png),
            board=None,
            meta=None,
        )
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(png) in out


class TestShapes:
    """What report reads besides the proxy's JSON lines, and what it says when it reads
    nothing."""

    def test_a_list_of_calls(self, tmp_path: Path) -> None:
        """A JSON list of calls is read as calls, each with its own kind."""
        path = tmp_path / "l.json"
        path.write_text(
            json.dumps([{"kind": "tool", "e2e_ms": 5.0}, {"kind": "chat", "e2e_ms": 3.0}])
        )
        (run,) = load_runs([str(path)])
        assert [(str(r.kind), r.e2e_ms) for r in run.records] == [("tool", 5.0), ("chat", 3.0)]
        assert run.read_as == "a JSON document: a list of 2 calls"

    def test_other_keys_named(self, tmp_path: Path) -> None:
        """A per-kind summary's keys that are not kinds are ignored, and named."""
        path = tmp_path / "s.json"
        path.write_text(json.dumps({"model": "qwen3-4b", "tool": [{"total_ms": 2061}]}, indent=1))
        (run,) = load_runs([str(path)])
        assert [r.e2e_ms for r in run.records] == [2061.0]
        assert run.read_as == "a JSON document: calls per kind (tool 1); keys ignored: model"

    def test_seconds_scaled(self, tmp_path: Path) -> None:
        """ttft and ttft_s are seconds, latency_s too: scaled to ms, and the line says (s)."""
        path = tmp_path / "s.jsonl"
        path.write_text('{"kind": "chat", "ttft": 0.162, "latency_s": 2.5, "tokens": 25}\n')
        report = build_report(load_runs([str(path)]))
        (record,) = load_runs([str(path)])[0].records
        assert record.ttft_ms == pytest.approx(162.0) and record.e2e_ms == 2500.0
        assert report["mapped"] == {
            "latency_s (s) -> e2e_ms": 1,
            "ttft (s) -> ttft_ms": 1,
            "tokens -> predicted_n": 1,
        }

    def test_record_names_win(self, tmp_path: Path) -> None:
        """A line that has the record's own field keeps it: the harness's name is not used."""
        path = tmp_path / "s.jsonl"
        path.write_text('{"kind": "tool", "e2e_ms": 100.0, "total_ms": 999.0}\n')
        (run,) = load_runs([str(path)])
        assert run.records[0].e2e_ms == 100.0 and run.mapped == {}

    def test_proxy_log_is_silent(self, tmp_path: Path) -> None:
        """A normal JSON-lines proxy log gives no mapping, no derivation, no shape line and
        no error: every field is the proxy's own."""
        path = seed_run(tmp_path, "a.jsonl", 2061.0)
        report = build_report(load_runs([path]))
        assert (report["mapped"], report["derived"]) == ({}, {})
        assert report["runs"][0]["read_as"] is None
        text = run_report([path], json_out=False, kind=None, plot=None, board=None, meta=None)
        for absent in ("names mapped", "derived:", "read a.jsonl"):
            assert absent not in text
        assert "prefill and decode are llama-server's clock" in text

    def test_proxy_line_with_nulls_not_derived(self, tmp_path: Path) -> None:
        """A proxy line whose prefill is null (a request without timings) stays unknown: the
        derivations are for another harness's calls, not the proxy's records."""
        record = tool_call(0, 2061.0, prefill_ms=None, decode_ms=None, decode_tok_s=None)
        (run,) = load_runs([write_log(tmp_path / "a.jsonl", [record])])
        assert run.records[0].prefill_ms is None and run.derived == {}

    def test_nothing_read_is_an_error(self, tmp_path: Path) -> None:
        """When no file yields a call, report fails naming each file's skipped entries and
        the shapes it reads."""
        junk = tmp_path / "junk.txt"
        junk.write_text('{"note": 1}\nnot json\n')
        empty = tmp_path / "empty.jsonl"
        empty.write_text("")
        with pytest.raises(ReportError) as info:
            run_report(
                [str(junk), str(empty)], json_out=False, kind=None, plot=None, board=None, meta=None
            )
        message = str(info.value)
        assert "no call could be read" in message
        assert (
            "junk.txt: 1 no kind or timing, 1 not json" in message
            and "empty.jsonl: empty" in message
        )
        assert '{"chat": [...], "tool": [...]}' in message and "JSON lines" in message

    def test_nothing_read_exits_non_zero(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The command prints the error in one line and exits 2."""
        from proxy.commands.cli import main

        junk = tmp_path / "junk.txt"
        junk.write_text("not json\n")
        assert main(["report", str(junk)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("timing-proxy: error: no call could be read") and err.count("\n") == 1

    def test_needed_fields_named_first(self, tmp_path: Path) -> None:
        """A log lacking the times the summary needs names them first among the missing."""
        path = tmp_path / "a.jsonl"
        path.write_text('{"kind": "tool", "ttft_ms": 800.0}\n')
        text = render_text(build_report(load_runs([str(path)])))
        assert (
            "fields missing (read as unknown): e2e_ms 1, decode_ms 1, predicted_n 1, id 1," in text
        )

    @pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed (the plot extra)")
    def test_plot_names_what_it_lacks(self, tmp_path: Path) -> None:
        """--plot without an end-to-end time names e2e_ms and the harness names read as it;
        without a completed chat or tool call it says that."""
        from proxy.commands.plot import plot_clock

        no_end = [rec(0, Kind.TOOL, ttft_ms=800.0)]
        with pytest.raises(ReportError, match=r"none of the 1 completed .*\(e2e_ms; .*total_ms"):
            plot_clock(no_end, str(tmp_path / "x.png"))
        other = [rec(0, Kind.OTHER, e2e_ms=5.0)]
        with pytest.raises(ReportError, match="no completed chat or tool call"):
            plot_clock(other, str(tmp_path / "x.png"))

    def test_plot_title_names_both_rates(self) -> None:
        """The plot's title gives the median call's own decode rate and, named as such, the
        median of the calls' rates."""
        from proxy.commands.plot import clock_title

        call = median_call(median_record([tool_call(0, 2061.0, decode_tok_s=7.1)]))
        assert call is not None
        title = clock_title("tool", 5, call, 6.0)
        assert "decode 7.1 tok/s: this call's own rate" in title
        assert "the median of the 5 calls' rates is 6.0" in title


class TestPrefillComputeInTheReport:
    """The roofline's achieved prefill compute on a proxy log with prompt tokens."""

    @staticmethod
    def report(tmp_path: Path, kind: str | None = None) -> dict[str, Any]:
        """The measurement's tool calls (prefill 796 ms for 128 prompt tokens) and chat
        turns (TTFT 162 ms), with the model and the Orin Nano preset."""
        records = [
            *(tool_call(i, t, prompt_n=128) for i, t in enumerate(SEED_TOOL_TOTALS)),
            *(
                rec(10 + i, Kind.CHAT, ttft_ms=162.0, prefill_ms=150.0, prompt_n=25, e2e_ms=2000.0)
                for i in range(3)
            ),
        ]
        runs = load_runs([write_log(tmp_path / "a.jsonl", records)])
        return build_report(runs, kind=kind, meta=SEED_META, board=ORIN)

    def test_line_and_json(self, tmp_path: Path) -> None:
        """The text says the prefill achieved 1.29 TFLOP/s, its share of each peak and that
        the kernels miss the tensor cores; --json has the same numbers."""
        report = self.report(tmp_path)
        text = render_text(report)
        assert "tool: 2 x 4.00 B x 128 tok / 796 ms = 1.29 TFLOP/s achieved" in text
        assert "13 % of FP16 tensor, 100 % of FP32 CUDA cores" in text
        assert "its kernels do not reach the tensor cores" in text
        tool = report["roofline"]["kinds"]["tool"]
        assert tool["prefill_tflops"] == pytest.approx(1.286, abs=0.001)
        assert tool["prefill_reaches"] == "FP32 CUDA cores"

    def test_cross_check_at_the_measured_ms_per_token(self, tmp_path: Path) -> None:
        """With prompt tokens in the log, the cross-check's tokens use the measured ms per
        prompt token (796 / 128 = 6.22): 658 ms is about 106 tokens."""
        text = render_text(self.report(tmp_path))
        assert "tool TTFT - chat TTFT = 658 ms of prefill per call for the tools" in text
        assert "about 106 tokens at the measured 6.22 ms per prompt token" in text

    def test_no_cross_check_for_one_kind(self, tmp_path: Path) -> None:
        """With --kind tool there is no chat TTFT: no cross-check line."""
        report = self.report(tmp_path, kind="tool")
        assert report["tools_prefill"] is None
        assert "cross-check" not in render_text(report)


class TestReportArguments:
    """--model-size and --params on the command line."""

    def test_float_notation(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--model-size 2.45e9 --params 4e9 are read as 2,450,000,000 bytes and 4 B params."""
        from proxy.commands.cli import main

        path = write_summary(tmp_path / "s.json")
        assert main(["report", path, "--model-size", "2.45e9", "--params", "4e9"]) == 0
        assert "4.00 B params x 4.90 bit / 8 = 2.45 GB" in capsys.readouterr().out

    @pytest.mark.parametrize(
        ("given", "lacking"), [("--model-size", "--params N"), ("--params", "--model-size BYTES")]
    )
    def test_one_without_the_other(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, lacking: str
    ) -> None:
        """One of the two without the other is an error that names what is missing."""
        from proxy.commands.cli import main

        assert main(["report", write_summary(tmp_path / "s.json"), given, "4e9"]) == 2
        err = capsys.readouterr().err
        assert f"error: {given} needs {lacking}" in err

    def test_not_a_number(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A value that is not a number is refused with an example of one that is."""
        from proxy.commands.cli import main

        with pytest.raises(SystemExit) as info:
            main(["report", write_summary(tmp_path / "s.json"), "--model-size", "big"])
        assert info.value.code == 2
        assert "not a number: 'big' (write e.g. 2.45e9)" in capsys.readouterr().err


class TestBuildReport:
    def test_seed_median(self, tmp_path: Path) -> None:
        """The seed's five tool totals 3172/1813/2061/1432/4071 ms give the median 2061 ms."""
        runs = load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)])
        tool = build_report(runs)["kinds"]["tool"]
        assert tool["e2e_ms"]["p50"] == 2061.0
        assert tool["tool_call_ms"]["p50"] == 2061.0
        assert tool["median_call"]["id"] == "r-2"

    def test_spread_between_runs(self, three_runs: list[str]) -> None:
        """Three runs with medians 2070/2061/2066 ms have a spread of 9 ms (0.44 %)."""
        report = build_report(load_runs(three_runs))
        per_run = report["per_run"]["tool"]
        assert [row["e2e_ms"] for row in per_run["runs"]] == SEED_RUN_MEDIANS
        assert [row["count"] for row in per_run["runs"]] == [5, 5, 5]
        spread = per_run["spread"]["e2e_ms"]
        assert spread == {"min": 2061.0, "max": 2070.0, "ms": 9.0, "pct": 0.44}
        assert per_run["spread"]["ttft_ms"]["ms"] == 0.0
        assert report["kinds"]["tool"]["count"] == 15

    def test_requests_per_api(self, tmp_path: Path) -> None:
        """The document counts requests per API (``unknown`` for lines without the field)
        and the text names them; a log from before the field says nothing about APIs."""
        records = [rec(1, api="responses"), rec(2, api="chat_completions"), rec(3)]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        assert report["apis"] == {"responses": 1, "chat_completions": 1, "unknown": 1}
        assert "api: chat_completions 1, responses 1, unknown 1" in render_text(report)
        old = build_report(load_runs([write_log(tmp_path / "b.jsonl", [rec(4)])]))
        assert old["apis"] == {"unknown": 1} and "api:" not in render_text(old)

    def test_one_run_no_spread(self, tmp_path: Path) -> None:
        """A single run has its medians but no spread."""
        report = build_report(load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)]))
        assert report["per_run"]["tool"]["spread"]["e2e_ms"] is None

    def test_split(self, tmp_path: Path) -> None:
        """The median call's 796 ms prefill and 1,265 ms decode split 39 / 61 percent."""
        records = [tool_call(i, t, decode_ms=t - 796.0) for i, t in enumerate(SEED_TOOL_TOTALS)]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        assert report["kinds"]["tool"]["split"] == {
            "prefill_ms": 796.0,
            "decode_ms": 1265.0,
            "prefill_pct": 38.6,
            "decode_pct": 61.4,
        }
        assert "prefill 796 ms (39 %) + decode 1,265 ms (61 %)" in render_text(report)

    def test_valid_k_of_n(self, tmp_path: Path) -> None:
        """Valid tool calls are k of the n completed tool requests; no call is not valid."""
        records = [
            tool_call(0, 2000.0),
            tool_call(1, 2000.0),
            tool_call(2, 2000.0, tool_call_valid=False),
            tool_call(3, 2000.0, tool_call_valid=None, tool_calls=0),
            tool_call(4, 2000.0, outcome=Outcome.CLIENT_CLOSED),
        ]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        valid = report["kinds"]["tool"]["tool_calls_valid"]
        assert valid == {"valid": 2, "of": 4, "invalid": 1, "no_call": 1}
        assert "2 of 4 (1 invalid, 1 no call)" in render_text(report)

    def test_unknown_tool_calls_left_out_of_n(self, tmp_path: Path) -> None:
        """A tool request whose calls were not counted (tool_calls and tool_call_valid null)
        is left out of n, not counted as "no call"."""
        records = [
            tool_call(0, 2000.0),
            tool_call(1, 2000.0, tool_call_valid=None, tool_calls=None),
        ]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        valid = report["kinds"]["tool"]["tool_calls_valid"]
        assert valid == {"valid": 1, "of": 1, "invalid": 0, "no_call": 0}

    def test_only_completed_in_percentiles(self, tmp_path: Path) -> None:
        """Requests that did not complete are counted by outcome, not in the percentiles."""
        records = [
            *(tool_call(i, t) for i, t in enumerate(SEED_TOOL_TOTALS)),
            tool_call(9, 99_999.0, outcome=Outcome.UPSTREAM_TIMEOUT),
        ]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        tool = report["kinds"]["tool"]
        assert tool["count"] == 6 and tool["window"] == 5
        assert tool["outcomes"] == {"completed": 5, "upstream_timeout": 1}
        assert tool["e2e_ms"]["p99"] < 99_999.0
        assert "completed requests only" in render_text(report)

    def test_schema_and_cache(self, tmp_path: Path) -> None:
        """Schema tokens, paid/saved ms and the cache hit ratio (sum cache_n / sum prompt)."""
        common = {"schema_tokens": 103, "schema_tokens_source": "server"}
        records = [
            tool_call(
                0,
                2000.0,
                schema_prefill_ms=658.0,
                schema_saved_ms=0.0,
                schema_cached=False,
                cache_n=0,
                prompt_tokens=420,
                **common,
            ),
            tool_call(
                1,
                1400.0,
                schema_prefill_ms=0.0,
                schema_saved_ms=658.0,
                schema_cached=True,
                cache_n=300,
                prompt_tokens=420,
                **common,
            ),
            tool_call(
                2,
                1400.0,
                schema_prefill_ms=0.0,
                schema_saved_ms=658.0,
                schema_cached=True,
                cache_n=300,
                prompt_tokens=420,
                **common,
            ),
        ]
        tool = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))["kinds"]["tool"]
        assert tool["schema"]["tokens"]["p50"] == 103
        assert tool["schema"]["source"] == {"server": 3}
        assert tool["schema"]["paid_ms"] == {"total": 658.0, "p50": 0.0}
        assert tool["schema"]["saved_ms"] == {"total": 1316.0, "p50": 658.0}
        assert (tool["schema"]["cached"], tool["schema"]["priced"]) == (2, 3)
        assert tool["cache"] == {"cache_n": 600, "prompt_tokens": 1260, "hit_ratio": 0.47619}
        assert tool["tool_call_tokens"]["p50"] == 10

    def test_kinds_shape_of_stats(self, tmp_path: Path) -> None:
        """The kinds have /stats's keys and, for the same completed records, its numbers:
        counts equal, each percentile (exact in the report, from histograms in /stats)
        within the relative error /stats states, ALPHA, plus both sides' rounding to 0.001;
        the split percentages within 100·ALPHA points plus their rounding to 0.1. The seed's
        five tool calls repeated 40 times, each within 10 ms of its first, so that /stats'
        buckets hold several values."""
        records = [
            *(
                tool_call(5 * n + i, t + (n * 7919 % 21) - 10.0, ttft_ms=820.0 + n % 9)
                for n in range(40)
                for i, t in enumerate(SEED_TOOL_TOTALS)
            ),
            rec(1000, Kind.CHAT, ttft_ms=186.0, prefill_ms=162.0, decode_ms=2300.0, e2e_ms=2500.0),
            rec(1001, Kind.OTHER, e2e_ms=5.0),
        ]
        stats = Stats(since="s")
        for r in records:
            stats.add(r)
        expected = stats.snapshot()["kinds"]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        assert set(report["kinds"]) == set(expected) == {"chat", "tool"}

        def close(got: Any, exact: Any, where: tuple[str, ...]) -> None:
            if isinstance(exact, dict):
                for key, value in exact.items():
                    close(got[key], value, (*where, key))
            elif where[-1].endswith("_pct") and exact is not None:
                assert abs(got - exact) <= 100 * ALPHA + 0.1, where
            elif isinstance(exact, float):
                assert abs(got - exact) <= ALPHA * abs(exact) + 0.0011, (where, got, exact)
            else:
                assert got == exact, where

        for kind, summary in expected.items():
            got = report["kinds"][kind]
            assert set(summary) <= set(got)
            for key in ("count", "window", "split", *SUMMARY_FIELDS):
                close(summary[key], got[key], (kind, key))
        assert expected["tool"]["window"] == 200

    def test_kind_filter(self, tmp_path: Path) -> None:
        """--kind tool keeps only the tool summary; a bad kind is a ReportError."""
        records = [tool_call(0, 2061.0), rec(1, Kind.CHAT, e2e_ms=100.0)]
        runs = load_runs([write_log(tmp_path / "a.jsonl", records)])
        report = build_report(runs, kind="tool")
        assert list(report["kinds"]) == ["tool"] and list(report["per_run"]) == ["tool"]
        assert report["requests"] == 1
        assert list(build_report(runs, kind="chat")["kinds"]) == ["chat"]
        with pytest.raises(ReportError, match="--kind"):
            build_report(runs, kind="other")

    def test_empty(self) -> None:
        """No records: both kinds with count 0 and no roofline numbers."""
        report = build_report([Run("empty", [])])
        assert report["kinds"]["tool"]["count"] == 0
        assert report["kinds"]["chat"]["median_call"] is None
        assert "no completed requests" in render_text(report)

    def test_roofline_section(self, tmp_path: Path) -> None:
        """With model and board, the roofline has the per-kind GB/s and the labelled lines."""
        records = [tool_call(i, t, decode_tok_s=10.7) for i, t in enumerate(SEED_TOOL_TOTALS)]
        runs = load_runs([write_log(tmp_path / "a.jsonl", records)])
        roof = build_report(runs, meta=SEED_META, board=ORIN)["roofline"]
        assert roof["kinds"]["tool"]["decode_gbs"] == pytest.approx(26.2, abs=0.05)
        assert roof["kinds"]["tool"]["tool_call_bytes"] == pytest.approx(24.5e9)
        assert roof["floor_ms_per_token"] == pytest.approx(36.0, abs=0.05)
        assert any("(est.)" in line for line in roof["lines"])


class TestPerApi:
    """``by_api`` and ``upstream_errors`` in the document, and their lines in the text."""

    @staticmethod
    def mixed() -> list[Record]:
        """Tool calls and chat turns of two APIs (Responses the slower), an upstream error
        of each, and one request whose log line names no API."""
        records = [
            *(tool_call(i, t, api="chat_completions") for i, t in enumerate(SEED_TOOL_TOTALS)),
            *(tool_call(10 + i, t + 500.0, api="responses") for i, t in enumerate([900.0, 1100.0])),
            rec(20, Kind.CHAT, api="responses", ttft_ms=186.0, e2e_ms=2500.0, decode_tok_s=10.7),
            rec(21, Kind.TOOL, Outcome.UPSTREAM_ERROR, api="responses", status=500, e2e_ms=3.0),
            rec(22, Kind.TOOL, Outcome.UPSTREAM_ERROR, api="messages", status=400, e2e_ms=2.0),
            rec(23, Kind.CHAT, e2e_ms=700.0),
        ]
        return records

    def test_by_api_is_the_stats_breakdown(self, tmp_path: Path) -> None:
        """For records that name their API, each API's kinds have /stats's by_api numbers
        (count, window, split, every summary field) plus the kind's outcomes, and its
        requests and upstream errors."""
        records = [r for r in self.mixed() if r.api is not None]
        stats = Stats(since="s")
        for r in records:
            stats.add(r)
        expected = stats.snapshot()["by_api"]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        assert list(report["by_api"]) == list(expected)
        for api, entry in expected.items():
            got = report["by_api"][api]
            assert got["requests"] == entry["requests"]
            assert got["upstream_errors"] == entry["upstream_errors"]
            for kind, summary in entry["kinds"].items():
                for key in ("count", "window", "split", *SUMMARY_FIELDS):
                    assert got["kinds"][kind][key] == summary[key], (api, kind, key)
        tool = report["by_api"]["responses"]["kinds"]["tool"]
        assert tool["outcomes"] == {"completed": 2, "upstream_error": 1}

    def test_each_api_over_its_own_completed_records(self, tmp_path: Path) -> None:
        """An API's tool median is over its own completed tool calls only: the upstream
        error answered in 3 ms is not among them; the kinds stay across APIs."""
        records = self.mixed()
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        for api in ("chat_completions", "responses"):
            mine = sorted(
                r.e2e_ms
                for r in records
                if r.api == api
                and r.kind is Kind.TOOL
                and r.outcome is Outcome.COMPLETED
                and r.e2e_ms is not None
            )
            assert report["by_api"][api]["kinds"]["tool"]["e2e_ms"]["p50"] == percentile(mine, 0.5)
        assert report["kinds"]["tool"]["count"] == sum(1 for r in records if r.kind is Kind.TOOL)

    def test_order_and_unknown(self, tmp_path: Path) -> None:
        """APIs come in the proxy's order (APIS), then ``unknown`` for lines without the
        field; only APIs with requests are listed."""
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", self.mixed())]))
        assert list(report["by_api"]) == ["chat_completions", "responses", "messages", "unknown"]
        assert [a for a in APIS if a in report["by_api"]] == list(report["by_api"])[:3]
        unknown = report["by_api"]["unknown"]
        assert unknown["requests"] == 1 and unknown["kinds"]["chat"]["e2e_ms"]["p50"] == 700.0

    def test_kind_filter_applies(self, tmp_path: Path) -> None:
        """With --kind tool, by_api holds tool summaries only, of the APIs that had tool
        requests."""
        runs = load_runs([write_log(tmp_path / "a.jsonl", self.mixed())])
        by_api = build_report(runs, kind="tool")["by_api"]
        assert list(by_api) == ["chat_completions", "responses", "messages"]
        assert all(list(entry["kinds"]) == ["tool"] for entry in by_api.values())

    def test_upstream_errors_by_status(self, tmp_path: Path) -> None:
        """The document counts upstream errors by status, across APIs and per API; the
        function is the same over any records."""
        records = self.mixed()
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        errors = [r for r in records if r.outcome is Outcome.UPSTREAM_ERROR]
        assert report["upstream_errors"] == {
            str(status): sum(1 for r in errors if r.status == status)
            for status in sorted({r.status for r in errors if r.status is not None})
        }
        assert report["by_api"]["messages"]["upstream_errors"] == {"400": 1}
        assert upstream_errors([rec(0, Kind.TOOL, Outcome.UPSTREAM_ERROR)]) == {"unknown": 1}
        assert upstream_errors([rec(0, status=500)]) == {}

    def test_text_table(self, tmp_path: Path) -> None:
        """The text has a row per API and kind with requests (requests, completed, the
        medians), the upstream errors by status, and no row for a kind an API did not
        serve."""
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", self.mixed())]))
        text = render_text(report)
        lines = text.splitlines()
        assert "upstream errors by status: 400 1, 500 1" in lines
        start = lines.index("per API (medians of completed requests)")
        table = lines[start + 1 : lines.index("", start)]
        rows = [line.split() for line in table[1:]]
        assert [row[:4] for row in rows] == [
            ["chat_completions", "tool", "5", "5"],
            ["responses", "chat", "1", "1"],
            ["responses", "tool", "3", "2"],
            ["messages", "tool", "1", "0"],
            ["unknown", "chat", "1", "1"],
        ]
        e2e = table[0].split().index("e2e") - 1  # "api kind requests completed TTFT ms ..."
        p50 = report["by_api"]["responses"]["kinds"]["tool"]["e2e_ms"]["p50"]
        assert rows[2][e2e] == figure_or_dash(p50)
        assert all(len(line) <= 100 for line in table)

    def test_text_without_apis(self, tmp_path: Path) -> None:
        """A log that names no API (older, or another harness's) and has no upstream error
        prints neither the per-API table nor the errors line."""
        text = render_text(build_report(load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)])))
        assert "per API" not in text and "upstream errors" not in text


class TestMedianRecord:
    def test_odd(self) -> None:
        """With five records the median call is the third by e2e."""
        records = [tool_call(i, t) for i, t in enumerate(SEED_TOOL_TOTALS)]
        assert median_record(records) == records[2]

    def test_even_lower(self) -> None:
        """With an even count the lower of the two middle records is taken."""
        records = [tool_call(i, t) for i, t in enumerate([4.0, 1.0, 3.0, 2.0])]
        assert (median_record(records) or records[0]).e2e_ms == 2.0

    def test_none(self) -> None:
        """No record with the field: None."""
        assert median_record([rec(0)]) is None


class TestRenderText:
    def test_several_runs(self, three_runs: list[str]) -> None:
        """Several runs print a per-run table and the seed's spread line with separators."""
        text = render_text(build_report(load_runs(three_runs)))
        assert "3 runs, 15 requests" in text
        assert "tool per run" in text
        for name in ("run1.jsonl", "run2.jsonl", "run3.jsonl"):
            assert name in text
        assert "2,070 / 2,061 / 2,066 ms" in text
        assert "max - min = 9 ms, 0.4 % of the median run" in text

    def test_one_run_no_per_run_table(self, tmp_path: Path) -> None:
        """One run prints no per-run table."""
        text = render_text(build_report(load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)])))
        assert "per run" not in text
        assert "2,061" in text

    def test_fixed_width_rows(self, tmp_path: Path) -> None:
        """The percentile rows are aligned: each number ends in the same column."""
        text = render_text(build_report(load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)])))
        rows = [
            line
            for line in text.splitlines()
            if line.startswith("  ")
            and " ms " in line
            and line.rstrip()[-1].isdigit()
            and "split" not in line
        ]
        assert len({len(row.rstrip()) for row in rows}) == 1

    def test_roofline_hint(self, tmp_path: Path) -> None:
        """Without model and board the text says how to give them."""
        text = render_text(build_report(load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)])))
        assert "--board PRESET" in text and "--upstream URL" in text
        assert "--model-size BYTES --params N" in text

    def test_roofline_lines(self, tmp_path: Path) -> None:
        """With model and board the seed's roofline lines are printed and no hint."""
        records = [tool_call(i, t, decode_tok_s=10.7) for i, t in enumerate(SEED_TOOL_TOTALS)]
        runs = load_runs([write_log(tmp_path / "a.jsonl", records)])
        text = render_text(build_report(runs, meta=SEED_META, board=ORIN))
        assert "36.0 ms per token = 27.8 tok/s (est.)" in text
        assert "26.2 GB/s moved (est.)" in text
        assert "--board PRESET" not in text

    def test_skipped_lines_reported(self, tmp_path: Path) -> None:
        """The header says how many lines were skipped and why."""
        path = write_log(tmp_path / "a.jsonl", [tool_call(0, 1.0)], [b"junk"])
        assert "1 line skipped (1 not json)" in render_text(build_report(load_runs([path])))


class TestRunReport:
    def test_json_output(self, three_runs: list[str]) -> None:
        """--json prints the report document, parseable, with the /stats kinds keys."""
        out = run_report(three_runs, json_out=True, kind=None, plot=None, board=None, meta=None)
        doc = json.loads(out)
        assert doc["kinds"]["tool"]["e2e_ms"]["p50"] == 2066.0
        assert {"count", "window", "split", *SUMMARY_FIELDS} <= set(doc["kinds"]["tool"])
        assert doc["per_run"]["tool"]["spread"]["e2e_ms"]["ms"] == 9.0

    def test_text_output(self, three_runs: list[str]) -> None:
        """Without --json the text table is returned."""
        out = run_report(
            three_runs, json_out=False, kind="tool", plot=None, board=ORIN, meta=SEED_META
        )
        assert out.startswith("timing-proxy report: 3 runs")
        assert "(kind tool)" in out

    def test_no_paths(self) -> None:
        """No log file is a ReportError."""
        with pytest.raises(ReportError):
            run_report([], json_out=False, kind=None, plot=None, board=None, meta=None)

    @pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed (the plot extra)")
    def test_plot_writes_png(self, three_runs: list[str], tmp_path: Path) -> None:
        """--plot draws the clock of the median calls to a PNG."""
        png = tmp_path / "clock.png"
        out = run_report(
            three_runs, json_out=False, kind=None, plot=str(png), board=None, meta=None
        )
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(png) in out

    @pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed (the plot extra)")
    def test_plot_from_records(self, tmp_path: Path) -> None:
        """plot_clock also takes records, and draws chat and tool calls."""
        from proxy.commands.plot import plot_clock

        records = [
            *(tool_call(i, t, tool_call_ms=t - 30) for i, t in enumerate(SEED_TOOL_TOTALS)),
            rec(
                9,
                Kind.CHAT,
                ttft_ms=186.0,
                prefill_ms=162.0,
                decode_ms=2300.0,
                e2e_ms=2500.0,
                predicted_n=25,
                decode_tok_s=10.4,
            ),
        ]
        png = tmp_path / "clock.png"
        plot_clock(records, str(png))
        assert png.stat().st_size > 10_000

    @pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed (the plot extra)")
    def test_plot_nothing(self, tmp_path: Path) -> None:
        """With no completed call there is nothing to draw: a ReportError."""
        from proxy.commands.plot import plot_clock

        with pytest.raises(ReportError, match="nothing to plot"):
            plot_clock([], str(tmp_path / "x.png"))

    def test_plot_without_matplotlib(
        self, three_runs: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without matplotlib, --plot fails with the pip command for the plot extra."""
        monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
        with pytest.raises(ReportError, match=r"timing-proxy\[plot\]"):
            run_report(
                three_runs,
                json_out=False,
                kind=None,
                plot=str(tmp_path / "x.png"),
                board=None,
                meta=None,
            )


def attributed(
    i: int, conversation: str, turn: int, kind: Kind = Kind.TOOL, **fields: Any
) -> Record:
    """A completed record of ``conversation``'s turn ``turn`` with prefix fields."""
    base: dict[str, Any] = {
        "prefix_kind": "extends",
        "prefill_ms": 100.0 + i,
        "prompt_tokens": 400 + i,
        "predicted_n": 20 + i,
        "e2e_ms": 1000.0,
    }
    base.update(fields)
    return rec(i, kind, conversation=conversation, turn=turn, **base)


def why_records() -> list[Record]:
    """Two conversations: c1 with a clock in the system prompt (twice), a template that
    drops reasoning and an evicted slot; c2 with reordered tools."""
    return [
        attributed(0, "c1", 1, prefix_kind="cold"),
        attributed(
            1,
            "c1",
            2,
            prefix_kind="rewrite",
            diverged_at=12,
            diverged_section="messages[0].content",
            prefill_cause="system_prompt_changed",
            prefill_lost_ms=796.0,
            prefill_lost_tokens=199,
        ),
        attributed(
            2,
            "c1",
            3,
            prefix_kind="rewrite",
            diverged_at=14,
            diverged_section="messages[0].content",
            prefill_cause="system_prompt_changed",
            prefill_lost_ms=801.5,
            prefill_lost_tokens=200,
        ),
        attributed(
            3,
            "c1",
            4,
            prefill_cause="template_drops_history",
            prefill_lost_ms=61.0,
            prefill_lost_tokens=21,
        ),
        attributed(
            4,
            "c1",
            5,
            cache_lost_tokens=180,
            diverged_section="messages[3].content",  # not a section for this cause
            prefill_cause="slot_evicted",
            prefill_lost_ms=290.0,
            prefill_lost_tokens=180,
        ),
        attributed(10, "c2", 1, Kind.CHAT, prefix_kind="cold"),
        attributed(
            11,
            "c2",
            2,
            Kind.CHAT,
            prefix_kind="rewrite",
            diverged_at=40,
            diverged_section="tools[1]:run_shell",
            prefill_cause="tools_changed",
            prefill_lost_ms=1200.0,
            prefill_lost_tokens=300,
        ),
    ]


class TestWhyPrefillWasPaid:
    """The report's ``findings`` and ``conversations``, from the records' prefix fields."""

    @staticmethod
    def report(tmp_path: Path, records: Sequence[Record], **kw: Any) -> dict[str, Any]:
        return build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]), **kw)

    def test_findings_by_cause_and_section_ranked_by_ms(self, tmp_path: Path) -> None:
        """Each (cause, section) sums its requests and prefill_lost_ms, most ms first, with
        the cause's fix; causes without a section (an evicted slot) have none."""
        records = why_records()
        found = self.report(tmp_path, records)["findings"]
        expected: dict[tuple[str, str | None], tuple[int, float]] = {}
        for r in records:
            if r.prefill_cause is None:
                continue
            section = r.diverged_section if r.prefill_cause != "slot_evicted" else None
            n, ms = expected.get((r.prefill_cause, section), (0, 0.0))
            expected[(r.prefill_cause, section)] = (n + 1, ms + (r.prefill_lost_ms or 0.0))
        got = {(f["cause"], f["section"]): (f["requests"], f["lost_ms"]) for f in found}
        assert got == expected
        assert [f["lost_ms"] for f in found] == sorted((f["lost_ms"] for f in found), reverse=True)
        assert all(f["fix"] == FIXES[Cause(f["cause"])] for f in found)

    def test_tokens_lost_per_cause(self, tmp_path: Path) -> None:
        """Each finding's tokens are the sum of its records' own ``prefill_lost_tokens``, as
        the proxy counted them: the report recomputes nothing."""
        records = why_records()
        by_cause = {f["cause"]: f for f in self.report(tmp_path, records)["findings"]}
        for cause, finding in by_cause.items():
            mine = [r for r in records if r.prefill_cause == cause]
            assert finding["lost_tokens"] == sum(r.prefill_lost_tokens or 0 for r in mine)
        assert by_cause["system_prompt_changed"]["lost_tokens"] == 399

    def test_same_shape_as_stats_findings(self, tmp_path: Path) -> None:
        """A finding has the keys of /stats's cache.findings entries."""
        found = self.report(tmp_path, why_records())["findings"]
        shape = Finding(Cause.COMPACTION, None).to_dict()
        assert found and all(set(f) == set(shape) for f in found)

    def test_a_cause_outside_the_closed_set_is_not_a_finding(self, tmp_path: Path) -> None:
        """A prefill_cause the proxy does not name (another harness's) is left out."""
        records = [attributed(0, "c1", 1, prefill_cause="gremlins", prefill_lost_ms=5.0)]
        assert self.report(tmp_path, records)["findings"] == []

    def test_conversations(self, tmp_path: Path) -> None:
        """Per conversation: its last turn, requests, prefill paid and lost to misses."""
        records = why_records()
        talks = self.report(tmp_path, records)["conversations"]
        for name, entry in talks.items():
            mine = [r for r in records if r.conversation == name]
            assert entry == {
                "turns": max(r.turn or 0 for r in mine),
                "requests": len(mine),
                "prefill_ms": pytest.approx(sum(r.prefill_ms or 0.0 for r in mine)),
                "lost_ms": pytest.approx(sum(r.prefill_lost_ms or 0.0 for r in mine)),
            }
        assert set(talks) == {r.conversation for r in records}

    def test_the_ten_conversations_that_lost_most(self, tmp_path: Path) -> None:
        """Of 14 conversations, the 10 that lost the most prefill, most first; the document
        says how many there were."""
        lost = [float((7 * i) % 23) * 10.0 for i in range(14)]
        records = [
            attributed(
                i,
                f"c{i}",
                2,
                prefill_cause="history_rewritten",
                prefill_lost_ms=ms,
                diverged_at=5,
                diverged_section="messages[1].content",
            )
            for i, ms in enumerate(lost)
        ]
        report = self.report(tmp_path, records)
        ranked = sorted(range(14), key=lambda i: -lost[i])[:TOP_CONVERSATIONS]
        assert list(report["conversations"]) == [f"c{i}" for i in ranked]
        assert report["conversations_seen"] == 14

    def test_several_runs_keep_conversations_apart(self, tmp_path: Path) -> None:
        """Two runs' c1 are two conversations (the proxy numbers them per process)."""
        paths = [
            write_log(tmp_path / name, [attributed(0, "c1", 1, prefix_kind="cold")])
            for name in ("a.jsonl", "b.jsonl")
        ]
        report = build_report(load_runs(paths))
        assert set(report["conversations"]) == {"a.jsonl:c1", "b.jsonl:c1"}

    def test_kind_filter(self, tmp_path: Path) -> None:
        """--kind chat keeps the chat requests' findings and conversations only."""
        records = why_records()
        report = self.report(tmp_path, records, kind="chat")
        chat = {r.prefill_cause for r in records if r.kind is Kind.CHAT and r.prefill_cause}
        assert {f["cause"] for f in report["findings"]} == chat
        assert set(report["conversations"]) == {
            r.conversation for r in records if r.kind is Kind.CHAT
        }

    def test_text_section(self, tmp_path: Path) -> None:
        """The text has the findings, most ms first, each with its fix wrapped in lines of
        at most 100 characters, then the conversations table."""
        report = self.report(tmp_path, why_records())
        lines = render_text(report).splitlines()
        start = lines.index(f"why prefill was paid ({report['attributed']} requests attributed)")
        block = lines[start : lines.index("", start)]
        rows = [line.split() for line in block if line.split()[0] in {str(c) for c in Cause}]
        assert [row[0] for row in rows] == [f["cause"] for f in report["findings"]]
        top = report["findings"][0]
        assert rows[0] == [
            top["cause"],
            top["section"],
            f"{top['requests']:,}",
            f"{top['lost_tokens']:,}",
            figure_or_dash(top["lost_ms"]),
        ]
        # the fixes: the lines under the rows, indented past the row's first column
        fixes = " ".join(line.strip().removeprefix("fix: ") for line in block if line[:4] == "    ")
        for f in report["findings"]:
            assert f["fix"] in fixes
        assert all(len(line) <= 100 for line in block)
        conv = lines.index("conversations: the 2 of 2 that lost the most prefill to misses")
        names = [line.split()[0] for line in lines[conv + 2 : conv + 4]]
        assert names == list(report["conversations"])

    def test_nothing_to_say_without_attribution(self, tmp_path: Path) -> None:
        """A log without prefix fields (older, another harness's) has no findings, no
        conversations, and no section in the text; attributed requests without a cause
        say no prefill was lost, and their conversations are not called the ones that lost
        the most."""
        old = build_report(load_runs([seed_run(tmp_path, "a.jsonl", 2061.0)]))
        assert (old["findings"], old["conversations"], old["attributed"]) == ([], {}, 0)
        assert "why prefill" not in render_text(old)
        clean = self.report(tmp_path, [attributed(0, "c1", 1), attributed(1, "c1", 2)])
        text = render_text(clean)
        assert "no prefill was lost to a cache miss" in text
        assert "conversations: the 1 of 1 that paid the most prefill (none lost any)" in text
        assert "lost the most prefill" not in text

    def test_json_document(self, tmp_path: Path) -> None:
        """--json carries findings and conversations."""
        path = write_log(tmp_path / "a.jsonl", why_records())
        doc = json.loads(
            run_report([path], json_out=True, kind=None, plot=None, board=None, meta=None)
        )
        report = build_report(load_runs([path]))
        assert doc["findings"] == report["findings"] and doc["findings"]
        assert doc["conversations"] == report["conversations"]
        assert set(doc["conversations"]) == {"c1", "c2"}


class TestImagesSpeculationBoard:
    """The report's lines for images, drafts and energy: image tokens beside the schema's,
    speculation, energy per call."""

    def test_images_summarised_beside_the_schema(self, tmp_path: Path) -> None:
        """Only calls with images count: tokens per call, images cached, prefill paid."""
        records = [
            tool_call(
                0, 2000.0, images=1, image_tokens=259, images_cached=0, image_prefill_ms=1300.0
            ),
            tool_call(1, 1500.0, images=1, image_tokens=259, images_cached=1, image_prefill_ms=0.0),
            tool_call(2, 1400.0),
        ]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        images = report["kinds"]["tool"]["images"]
        assert (images["requests"], images["images"], images["cached"]) == (2, 2, 1)
        assert images["tokens"]["p50"] == 259
        assert images["paid_ms"] == {"total": 1300.0, "p50": 650.0}
        text = render_text(report)
        assert "image tokens (p50)" in text and "1 from the cache" in text
        assert "image prefill paid" in text

    def test_speculation_line(self, tmp_path: Path) -> None:
        """The text says how many calls drafted and the decode rate with and without."""
        records = [
            tool_call(0, 2000.0, decode_tok_s=24.0, draft_acceptance=0.9),
            tool_call(1, 2000.0, decode_tok_s=16.0),
        ]
        text = render_text(build_report(load_runs([write_log(tmp_path / "a.jsonl", records)])))
        assert "1 drafted; decode p50 24.0 tok/s with, 16.0 without" in text
        assert "draft acceptance" in text and "90 %" in text

    def test_energy_per_call_and_beside_the_roofline(self, tmp_path: Path) -> None:
        """Energy per call from the records' energy_mj; with a model known, the roofline's
        tool-call traffic line is followed by the measured energy per tool call."""
        records = [
            tool_call(i, t, energy_mj=e, energy_mj_per_token=e / 10, power_w_avg=6.5)
            for i, (t, e) in enumerate(
                zip(SEED_TOOL_TOTALS, [9000.0, 8000.0, 7000.0, 6000.0, 5000.0], strict=True)
            )
        ]
        runs = load_runs([write_log(tmp_path / "a.jsonl", records)])
        report = build_report(runs, meta=SEED_META, board=ORIN)
        board = report["kinds"]["tool"]["board"]
        assert board["covered"] == 5 and board["energy_mj"]["p50"] == 7000.0
        text = render_text(report)
        assert "energy per call (p50)" in text and "7,000 mJ, 700.0 mJ per token, 6.5 W" in text
        lines = report["roofline"]["lines"]
        at = next(i for i, line in enumerate(lines) if "DRAM traffic" in line)
        assert any("7 J of board input energy per tool call" in line for line in lines[at:])

    def test_logs_without_the_new_fields_print_no_such_lines(self, tmp_path: Path) -> None:
        """A log without images, drafts or telemetry prints none of the three lines."""
        records = [tool_call(i, t) for i, t in enumerate(SEED_TOOL_TOTALS)]
        text = render_text(build_report(load_runs([write_log(tmp_path / "a.jsonl", records)])))
        for absent in ("image tokens", "speculative decoding", "energy per call"):
            assert absent not in text


class TestSetupFindings:
    """Setup findings come first in the report, from the records' setup fields."""

    def test_tools_that_never_reach_the_model_come_first(self, tmp_path: Path) -> None:
        """Tool records whose tools the template dropped (schema_tokens 0, counted) give a
        setup finding printed before the kinds, with its fix."""
        records = [
            tool_call(i, t, tools_in_prompt=False, max_tokens=48)
            for i, t in enumerate(SEED_TOOL_TOTALS)
        ]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        (found,) = report["setup_findings"]
        assert (found["cause"], found["requests"]) == ("tools_never_reach_model", 5)
        assert found["ms"] == pytest.approx(sum(SEED_TOOL_TOTALS))
        text = render_text(report)
        assert text.index("setup findings") < text.index("tool: 5 requests")
        assert "tools_never_reach_model (qwen3-4b): 5 requests" in text
        assert "--chat-template-file" in text

    def test_no_max_tokens_only_when_the_log_has_the_field(self, tmp_path: Path) -> None:
        """A proxy log with max_tokens null is a finding (with the longest generation); a
        log whose lines lack the field says nothing about limits."""
        records = [tool_call(i, t, max_tokens=None) for i, t in enumerate(SEED_TOOL_TOTALS)]
        report = build_report(load_runs([write_log(tmp_path / "a.jsonl", records)]))
        (found,) = report["setup_findings"]
        assert found["cause"] == "no_max_tokens" and found["detail"]["longest_tokens"] == 10
        assert "longest generation 10 tokens" in render_text(report)
        lines = [
            orjson.dumps({k: v for k, v in orjson.loads(log_line(r)).items() if k != "max_tokens"})
            for r in records
        ]
        (tmp_path / "b.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        assert build_report(load_runs([str(tmp_path / "b.jsonl")]))["setup_findings"] == []
