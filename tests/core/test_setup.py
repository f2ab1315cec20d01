"""Setup findings (proxy/core/setup.py and the record fields they read): tools that never
reach the model, a tool call cut off by the token limit, no max_tokens, thinking before the
call, and tool calls decoding slower than chat."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.core.assemble import Exchange, build_record
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import analyse_request
from proxy.core.setup import (
    DECODE_MIN_SAMPLES,
    SETUP_FIXES,
    SetupCause,
    SetupFindings,
    TemplateCaps,
    decode_gap,
    request_limit,
    tools_in_prompt,
)
from proxy.core.tracker import Observation, ToolCall

TOOLS = [{"type": "function", "function": {"name": "grip", "parameters": {"type": "object"}}}]


def rec(i: int = 0, kind: Kind = Kind.TOOL, **fields: Any) -> Record:
    """A completed record of model ``m``."""
    base: dict[str, Any] = {"ts": "t", "method": "POST", "path": "/v1/chat/completions"}
    return Record(id=f"r{i}", model=fields.pop("model", "m"), kind=kind, **base, **fields)


def _exchange() -> Exchange:
    return Exchange("x", "t", "POST", "/v1/chat/completions", 200, Outcome.COMPLETED, 1.0, 10)


def _record_of(body: dict[str, Any], obs: Observation) -> Record:
    facts = analyse_request("POST", "/v1/chat/completions", orjson.dumps(body))
    return build_record(_exchange(), facts, obs)


class TestTemplateCaps:
    def test_props_without_tool_support(self) -> None:
        """/props chat_template_caps with supports_tools false: the template drops tools."""
        caps = TemplateCaps.from_props(
            {
                "chat_template_caps": {"supports_tools": False, "supports_tool_calls": False},
                "model_path": "/m/gemma.gguf",
            }
        )
        assert caps.drops_tools and caps.model == "/m/gemma.gguf"

    def test_props_with_tool_support_and_unknowns(self) -> None:
        """A tool-capable template does not drop tools; an answer without caps is unknown,
        not a finding."""
        ok = TemplateCaps.from_props(
            {"chat_template_caps": {"supports_tools": True, "supports_tool_calls": True}}
        )
        assert not ok.drops_tools
        unknown = TemplateCaps.from_props({"model_path": 3})
        assert unknown == TemplateCaps() and not unknown.drops_tools
        assert TemplateCaps.from_props([]) == TemplateCaps()


class TestRecordFields:
    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            ({"max_tokens": 48}, 48),
            ({"max_completion_tokens": 64}, 64),
            ({"max_output_tokens": 32}, 32),
            ({"n_predict": 16}, 16),
            ({"n_predict": -1}, None),
            ({}, None),
            ({"max_tokens": "48"}, None),
        ],
    )
    def test_request_limit_under_each_apis_name(
        self, body: dict[str, Any], expected: int | None
    ) -> None:
        """The token limit is read under every API's name; -1 and junk are no limit."""
        assert request_limit(body) == expected

    def test_max_tokens_is_in_the_record(self) -> None:
        """A request's max_tokens reaches the record; none gives null."""
        obs = Observation(recognised=True, finish_reason="stop")
        with_limit = _record_of({"messages": [], "max_tokens": 48}, obs)
        assert with_limit.max_tokens == 48
        assert _record_of({"messages": []}, obs).max_tokens is None

    def test_a_call_cut_off_by_the_limit_is_truncated(self) -> None:
        """finish_reason length with a call whose arguments do not parse: truncated."""
        obs = Observation(
            recognised=True,
            finish_reason="length",
            tool_calls=(ToolCall(0, "grip", '{"force": 1'),),
        )
        record = _record_of({"messages": [], "tools": TOOLS, "max_tokens": 8}, obs)
        assert record.tool_call_truncated is True

    @pytest.mark.parametrize(
        ("finish", "arguments"),
        [("tool_calls", '{"force": 1}'), ("length", '{"force": 1}'), ("stop", None)],
    )
    def test_a_complete_call_or_no_limit_is_not_truncated(
        self, finish: str, arguments: str | None
    ) -> None:
        """A valid call (even at the limit), or a turn not ended by the limit: not truncated."""
        calls = (ToolCall(0, "grip", arguments),) if arguments is not None else ()
        obs = Observation(recognised=True, finish_reason=finish, tool_calls=calls)
        record = _record_of({"messages": [], "tools": TOOLS, "max_tokens": 8}, obs)
        assert record.tool_call_truncated is False

    def test_truncation_is_unknown_for_chat_and_unread_streams(self) -> None:
        """Not a tool request, or a response not read: null, not false."""
        obs = Observation(recognised=True, finish_reason="length")
        assert _record_of({"messages": []}, obs).tool_call_truncated is None
        unread = Observation(recognised=False, finish_reason="length")
        assert _record_of({"messages": [], "tools": TOOLS}, unread).tool_call_truncated is None

    @pytest.mark.parametrize(
        ("fields", "expected"),
        [
            ({"schema_tokens": 0, "schema_tokens_source": "server"}, False),
            ({"schema_tokens": 120, "schema_tokens_source": "server"}, True),
            ({"schema_tokens": 0, "schema_tokens_source": "estimate"}, None),
            ({}, None),
        ],
    )
    def test_tools_in_prompt_needs_an_exact_count(
        self, fields: dict[str, Any], expected: bool | None
    ) -> None:
        """Only a server-counted schema of 0 tokens says the tools never reached the prompt;
        an estimate never does."""
        assert tools_in_prompt(rec(**fields)) is expected
        assert tools_in_prompt(rec(kind=Kind.CHAT, **fields)) is None


class TestFindings:
    def test_each_cause_counted_once_per_model_and_new_ones_returned(self) -> None:
        """Records with tools dropped, a truncated call and no max_tokens each count under
        their cause and model; add() returns a (cause, model) only the first time."""
        findings = SetupFindings()
        dropped = rec(0, tools_in_prompt=False, max_tokens=48, e2e_ms=900.0, predicted_n=48)
        assert findings.add(dropped) == [(SetupCause.TOOLS_NEVER_REACH_MODEL, "m")]
        assert findings.add(rec(1, tools_in_prompt=False, max_tokens=48, e2e_ms=100.0)) == []
        cut = rec(2, tool_call_truncated=True, predicted_n=8, e2e_ms=300.0)
        assert set(findings.add(cut)) == {
            (SetupCause.TOOL_CALL_TRUNCATED, "m"),
            (SetupCause.NO_MAX_TOKENS, "m"),
        }
        by = {(f["cause"], f["model"]): f for f in findings.findings()}
        tools = by[("tools_never_reach_model", "m")]
        assert (tools["requests"], tools["ms"], tools["category"]) == (2, 1000.0, "setup")
        assert tools["fix"] == SETUP_FIXES[SetupCause.TOOLS_NEVER_REACH_MODEL]
        assert by[("no_max_tokens", "m")]["detail"]["longest_tokens"] == 8

    def test_thinking_before_a_call(self) -> None:
        """A tool call preceded by reasoning counts its reasoning ms and tokens."""
        findings = SetupFindings()
        findings.add(rec(0, max_tokens=64, tool_calls=1, reasoning_ms=420.0, reasoning_tokens=35))
        (found,) = findings.findings()
        assert (found["cause"], found["ms"], found["tokens"]) == ("thinking_before_call", 420.0, 35)

    def test_only_completed_chat_and_tool_records_count(self) -> None:
        """Errors and other requests add nothing."""
        findings = SetupFindings()
        findings.add(rec(0, outcome=Outcome.UPSTREAM_ERROR, tools_in_prompt=False))
        findings.add(rec(1, kind=Kind.OTHER))
        assert findings.findings() == []

    def test_tool_decode_slower_than_chat_beyond_the_spread(self) -> None:
        """Tool calls at ~6 tok/s against chat at ~10.7 (the Jetson measurement's medians) with
        a small spread: a finding with both medians; close rates: none."""
        findings = SetupFindings()
        for i in range(DECODE_MIN_SAMPLES + 2):
            findings.add(rec(i, max_tokens=64, decode_tok_s=6.0 + 0.1 * (i % 3)))
            findings.add(rec(100 + i, kind=Kind.CHAT, decode_tok_s=10.7 + 0.1 * (i % 3)))
        (slower,) = [f for f in findings.findings() if f["cause"] == "tool_decode_slower"]
        assert slower["detail"]["tool_decode_tok_s"] == pytest.approx(6.1)
        assert slower["detail"]["chat_decode_tok_s"] == pytest.approx(10.8)
        assert "explain" in slower["fix"]
        close = decode_gap([10.0, 10.5, 9.0, 11.0, 10.2], [10.1, 10.6, 9.1, 11.2, 10.3])
        assert close is not None and close["gap_tok_s"] <= close["spread_tok_s"]

    def test_too_few_rates_no_comparison(self) -> None:
        """Fewer than DECODE_MIN_SAMPLES of either kind: no comparison at all."""
        assert decode_gap([6.0] * (DECODE_MIN_SAMPLES - 1), [10.0] * 10) is None

    def test_models_are_bounded(self) -> None:
        """Beyond the tracked models, findings fold into 'other'."""
        findings = SetupFindings(models=2)
        for i, model in enumerate(("a", "b", "c", "d")):
            findings.add(rec(i, model=model, tools_in_prompt=False, max_tokens=8))
        assert {f["model"] for f in findings.findings()} == {"a", "b", "other"}
