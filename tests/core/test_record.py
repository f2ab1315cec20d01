"""Tests for proxy.core.record (Record, ServerTimings, derive, ms, ratio) and assemble."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from proxy.core.assemble import Exchange, build_record, tool_calls_valid
from proxy.core.record import Kind, Outcome, Record, ServerTimings, derive, ms, ratio
from proxy.core.request import RequestFacts
from proxy.core.tracker import Observation, ToolCall

# The timing fields the brief and README name: a rename of any of these must fail a test.
CORE_FIELDS = [
    *("id", "ts", "method", "path", "model", "stream", "kind", "status", "outcome"),
    *("ttfb_ms", "ttft_ms", "e2e_ms", "decode_wall_ms"),
    *("prefill_ms", "decode_ms", "prompt_n", "cache_n", "predicted_n"),
    *("prefill_tok_s", "decode_tok_s"),
    *("prompt_tokens", "cache_hit_ratio", "overhead_ms", "prefill_share"),
    *("tool_calls", "tool_call_valid", "tool_call_ms"),
]

# Every field of a record, in order. A rename, removal or addition must fail a test: the
# README, the log format, /stats and the dashboard all depend on these names.
RECORD_FIELDS = [
    *("id", "ts", "method", "path", "model", "stream", "kind", "api", "status"),
    "outcome",
    *("error", "analysis_error"),
    *("ttfb_ms", "ttft_ms", "e2e_ms", "decode_wall_ms"),
    *("prefill_ms", "decode_ms", "prompt_n", "cache_n", "predicted_n"),
    *("prefill_tok_s", "decode_tok_s"),
    *("prompt_tokens", "cache_hit_ratio", "overhead_ms", "prefill_share"),
    *("tool_calls", "tool_call_valid", "tool_call_ms", "tool_call_tokens", "tool_decode_tok_s"),
    *("tool_args_tokens", "tool_args_chars", "tool_args_tokens_source"),
    *("max_tokens", "tools_in_prompt", "tool_call_truncated", "reasoning_ms"),
    *("reasoning_tokens", "reasoning_share"),
    *("schema_hash", "schema_tools", "schema_tokens", "schema_tokens_source", "schema_cached"),
    *("schema_prefill_ms", "schema_saved_ms", "schema_prefilled_again", "accounting_error"),
    *("prefix_kind", "reusable_tokens", "cache_lost_tokens", "diverged_at", "diverged_section"),
    "diverged_offset",
    *("diverged_cost_ms", "prefill_cause", "prefill_lost_ms", "prefill_lost_tokens"),
    *("cache_lost_cause", "cache_lost_ms"),
    *("conversation", "turn"),
    *("diverged_text", "attribution_error"),
    *("images", "image_tokens", "image_tokens_each", "images_cached", "image_prefill_ms"),
    *("draft_n", "draft_n_accepted", "draft_acceptance"),
    *("energy_mj", "energy_mj_per_token", "power_w_avg", "gpu_busy_pct", "ram_used_mb"),
    *("temp_max_c", "upstream_cpu_ms", "telemetry_error"),
    *("decode_gbs", "roof_ratio"),
    *("finish_reason", "events", "token_events", "request_bytes", "response_bytes"),
]

# llama-server's own numbers for a 400-token decode (protocol doc §1.4).
REAL = ServerTimings(
    prompt_n=40, prompt_ms=194.973, cache_n=0, predicted_n=400, predicted_ms=4559.68
)

DERIVED_KEYS = {
    "prefill_ms",
    "decode_ms",
    "prompt_n",
    "cache_n",
    "predicted_n",
    "prefill_tok_s",
    "decode_tok_s",
    "prompt_tokens",
    "cache_hit_ratio",
    "overhead_ms",
    "prefill_share",
    "draft_n",
    "draft_n_accepted",
    "draft_acceptance",
}
DRAFT_KEYS = {"draft_n", "draft_n_accepted", "draft_acceptance"}


class TestMs:
    @pytest.mark.parametrize(
        ("seconds", "expected"),
        [(None, None), (0.0, 0.0), (1.5, 1500.0), (0.0012345678, 1.235), (2.0004996, 2000.5)],
    )
    def test_ms(self, seconds: float | None, expected: float | None) -> None:
        """Seconds become milliseconds rounded to 3 decimals (the µs); None stays None."""
        assert ms(seconds) == expected


class TestRatio:
    @pytest.mark.parametrize(
        ("num", "den", "scale", "expected"),
        [
            (1.0, 4.0, 1.0, 0.25),
            (40, 194.973, 1000.0, 205.156611),
            (0, 5.0, 1.0, 0.0),
            (None, 5.0, 1.0, None),
            (5.0, None, 1.0, None),
            (5.0, 0.0, 1.0, None),
            (5.0, -1.0, 1.0, None),
            (2.0, 3.0, 1.0, 0.666667),
        ],
    )
    def test_ratio(
        self, num: float | None, den: float | None, scale: float, expected: float | None
    ) -> None:
        """scale*num/den rounded to 6 decimals; None when unknown or the divisor is not > 0."""
        assert ratio(num, den, scale) == expected


class TestServerTimings:
    def test_from_json_reads_fields(self) -> None:
        """The five timings fields are read; ms become floats, counts stay ints."""
        t = ServerTimings.from_json(
            {
                "cache_n": 35,
                "prompt_n": 5,
                "prompt_ms": 38,
                "prompt_per_token_ms": 7.66,
                "predicted_n": 24,
                "predicted_ms": 589.167,
                "predicted_per_second": 39.0,
            }
        )
        assert t == ServerTimings(
            prompt_n=5, prompt_ms=38.0, cache_n=35, predicted_n=24, predicted_ms=589.167
        )
        assert t is not None
        assert isinstance(t.prompt_ms, float)
        assert isinstance(t.prompt_n, int)

    @pytest.mark.parametrize("obj", [None, [], "timings", 3, True])
    def test_from_json_non_object(self, obj: Any) -> None:
        """Anything but a JSON object gives None."""
        assert ServerTimings.from_json(obj) is None

    def test_from_json_bad_values_unknown(self) -> None:
        """Booleans, strings and floats in count fields are unknown (None), not coerced, and
        named as implausible."""
        t = ServerTimings.from_json(
            {
                "prompt_n": True,
                "cache_n": "3",
                "predicted_n": 2.5,
                "prompt_ms": False,
                "predicted_ms": "1",
            }
        )
        assert t == ServerTimings(
            implausible=("prompt_n", "cache_n", "predicted_n", "prompt_ms", "predicted_ms")
        )


class TestDerive:
    def test_real_numbers(self) -> None:
        """decode_tok_s is llama-server's (predicted_n-1)/predicted_ms: 400 in 4559.68 ms → 87.5."""
        d = derive(REAL, 250.0)
        assert d["decode_tok_s"] == pytest.approx(87.506141, abs=1e-6)
        assert round(1000 / d["decode_tok_s"], 2) == 11.43  # ms per token, as the doc says
        assert d["decode_tok_s"] != pytest.approx(400 / 4559.68 * 1000, abs=0.01)

    def test_prefill_tok_s(self) -> None:
        """prefill_tok_s is prompt_n / prompt_ms * 1000."""
        assert derive(REAL, None)["prefill_tok_s"] == pytest.approx(205.156611, abs=1e-6)

    def test_prompt_tokens_and_cache_hit(self) -> None:
        """prompt_tokens is prompt_n + cache_n and cache_hit_ratio is cache_n / prompt_tokens."""
        d = derive(
            ServerTimings(
                prompt_n=5, prompt_ms=41.7, cache_n=301, predicted_n=30, predicted_ms=739.365
            ),
            None,
        )
        assert d["prompt_tokens"] == 306
        assert d["cache_hit_ratio"] == pytest.approx(301 / 306, abs=1e-6)

    def test_overhead(self) -> None:
        """overhead_ms is ttft_ms minus prefill_ms (the time outside the server's prompt timer)."""
        assert derive(REAL, 250.0)["overhead_ms"] == pytest.approx(55.027, abs=1e-9)

    def test_overhead_can_be_negative(self) -> None:
        """overhead_ms is not clamped: a ttft below prefill_ms gives a negative value."""
        assert derive(REAL, 194.0)["overhead_ms"] == pytest.approx(-0.973, abs=1e-9)

    def test_prefill_share(self) -> None:
        """prefill_share is prefill_ms / (prefill_ms + decode_ms)."""
        d = derive(ServerTimings(prompt_ms=796.0, predicted_ms=1265.0), None)
        assert d["prefill_share"] == pytest.approx(796 / 2061, abs=1e-6)

    def test_draft_acceptance(self) -> None:
        """draft_acceptance is draft_n_accepted / draft_n, from llama-server's final timings."""
        t = ServerTimings.from_json({"predicted_n": 61, "draft_n": 60, "draft_n_accepted": 55})
        d = derive(t, None)
        assert (d["draft_n"], d["draft_n_accepted"]) == (60, 55)
        assert d["draft_acceptance"] == pytest.approx(55 / 60, abs=1e-6)

    def test_no_draft_no_acceptance(self) -> None:
        """Without speculation (no draft_n in timings) the draft fields are None; with
        draft_n 0 the acceptance is None too, not a division by zero."""
        assert derive(REAL, None)["draft_acceptance"] is None
        zero = derive(ServerTimings(draft_n=0, draft_n_accepted=0), None)
        assert zero["draft_n"] == 0
        assert zero["draft_acceptance"] is None

    def test_passthrough_fields(self) -> None:
        """prefill_ms/decode_ms are prompt_ms/predicted_ms; counts pass through unchanged."""
        d = derive(REAL, None)
        assert d["prefill_ms"] == 194.973
        assert d["decode_ms"] == 4559.68
        assert (d["prompt_n"], d["cache_n"], d["predicted_n"]) == (40, 0, 400)

    def test_keys(self) -> None:
        """derive returns exactly the server-clock record fields."""
        assert set(derive(REAL, 1.0)) == DERIVED_KEYS
        assert set(RECORD_FIELDS) >= DERIVED_KEYS

    def test_no_timings_all_none(self) -> None:
        """Without timings every derived value is None, never 0."""
        d = derive(None, 300.0)
        assert d == dict.fromkeys(DERIVED_KEYS)

    @pytest.mark.parametrize(
        ("timings", "ttft", "none_keys"),
        [
            (
                dataclasses.replace(REAL, cache_n=None),
                250.0,
                {"cache_n", "prompt_tokens", "cache_hit_ratio"},
            ),
            (
                dataclasses.replace(REAL, prompt_n=None),
                250.0,
                {"prompt_n", "prompt_tokens", "cache_hit_ratio", "prefill_tok_s"},
            ),
            (
                dataclasses.replace(REAL, prompt_ms=None),
                250.0,
                {"prefill_ms", "prefill_tok_s", "overhead_ms", "prefill_share"},
            ),
            (
                dataclasses.replace(REAL, predicted_ms=None),
                250.0,
                {"decode_ms", "decode_tok_s", "prefill_share"},
            ),
            (dataclasses.replace(REAL, predicted_n=None), 250.0, {"predicted_n", "decode_tok_s"}),
            (REAL, None, {"overhead_ms"}),
            (
                ServerTimings(prompt_n=5, cache_n=35, predicted_n=24),
                90.0,
                {
                    "prefill_ms",
                    "decode_ms",
                    "prefill_tok_s",
                    "decode_tok_s",
                    "overhead_ms",
                    "prefill_share",
                },
            ),
        ],
        ids=[
            "no_cache_n",
            "no_prompt_n",
            "no_prompt_ms",
            "no_predicted_ms",
            "no_predicted_n",
            "no_ttft",
            "usage_only",
        ],
    )
    def test_unknown_inputs_give_none(
        self, timings: ServerTimings, ttft: float | None, none_keys: set[str]
    ) -> None:
        """An unknown input makes exactly the values that depend on it None (never 0); the
        draft fields are None in all of these, since none of them drafted."""
        d = derive(timings, ttft)
        assert {k for k, v in d.items() if v is None} == none_keys | DRAFT_KEYS

    def test_usage_only_counts(self) -> None:
        """Usage-only timings still give prompt_tokens and cache_hit_ratio."""
        d = derive(ServerTimings(prompt_n=5, cache_n=35, predicted_n=24), None)
        assert d["prompt_tokens"] == 40
        assert d["cache_hit_ratio"] == 0.875

    def test_single_token_has_no_decode_rate(self) -> None:
        """predicted_n=1 means no decode step: decode_tok_s is None."""
        d = derive(
            ServerTimings(prompt_n=5, prompt_ms=10.0, cache_n=0, predicted_n=1, predicted_ms=0.001),
            12.0,
        )
        assert d["decode_tok_s"] is None

    def test_zero_tokens_has_no_decode_rate(self) -> None:
        """predicted_n=0 has no decode step either: decode_tok_s is None, never negative."""
        d = derive(
            ServerTimings(prompt_n=5, prompt_ms=10.0, cache_n=0, predicted_n=0, predicted_ms=0.001),
            12.0,
        )
        assert d["decode_tok_s"] is None

    def test_zero_prompt_tokens_no_hit_ratio(self) -> None:
        """prompt_tokens 0 gives cache_hit_ratio None (no division by zero)."""
        d = derive(ServerTimings(prompt_n=0, cache_n=0), None)
        assert d["prompt_tokens"] == 0
        assert d["cache_hit_ratio"] is None

    def test_full_cache_hit(self) -> None:
        """A prompt served entirely from cache except one token gives ratio (n-1)/n."""
        d = derive(ServerTimings(prompt_n=1, cache_n=99), None)
        assert d["cache_hit_ratio"] == 0.99


def _full_record() -> Record:
    values: dict[str, Any] = {
        "id": "r-1",
        "ts": "2025-11-30T03:40:00.000Z",
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "gemma3",
        "stream": True,
        "kind": Kind.TOOL,
        "status": 200,
        "outcome": Outcome.CLIENT_CLOSED,
        "error": "server_error:500",
        "analysis_error": None,
        "ttfb_ms": 1140.2,
        "ttft_ms": 1475.7,
        "e2e_ms": 2200.7,
        "decode_wall_ms": 598.9,
        "tool_calls": 1,
        "tool_call_valid": True,
        "tool_call_ms": 2074.5,
        "finish_reason": "tool_calls",
        "events": 11,
        "token_events": 8,
        "request_bytes": 900,
        "response_bytes": 7000,
        **derive(REAL, 1475.7),
    }
    return Record(**values)


class TestRecordDict:
    def test_core_field_names_present(self) -> None:
        """Every documented timing field name is present in to_dict (a rename fails)."""
        missing = [name for name in CORE_FIELDS if name not in _full_record().to_dict()]
        assert missing == []

    def test_field_names_exact(self) -> None:
        """to_dict has exactly the documented field names, in order."""
        assert list(_full_record().to_dict()) == RECORD_FIELDS

    def test_round_trip(self) -> None:
        """from_dict(to_dict(r)) gives back an equal record, also through JSON."""
        r = _full_record()
        assert Record.from_dict(r.to_dict()) == r
        assert Record.from_dict(orjson.loads(orjson.dumps(r.to_dict()))) == r

    def test_enums_as_plain_strings(self) -> None:
        """kind and outcome are written as their plain string values."""
        d = _full_record().to_dict()
        assert d["kind"] == "tool" and type(d["kind"]) is str
        assert d["outcome"] == "client_closed" and type(d["outcome"]) is str

    def test_json_serialisable(self) -> None:
        """to_dict output serialises with orjson (the log line) without options."""
        assert orjson.loads(orjson.dumps(_full_record().to_dict()))["id"] == "r-1"

    def test_from_dict_ignores_unknown_keys(self) -> None:
        """Keys that are not fields (a newer log format) are ignored."""
        d = {**_full_record().to_dict(), "future_field": 1}
        assert Record.from_dict(d) == _full_record()

    def test_from_dict_defaults(self) -> None:
        """Missing kind/outcome default to other/completed, and enums are rebuilt."""
        r = Record.from_dict({"id": "x", "ts": "t", "method": "GET", "path": "/health"})
        assert r.kind is Kind.OTHER
        assert r.outcome is Outcome.COMPLETED
        assert r.ttft_ms is None

    def test_unknown_is_null(self) -> None:
        """A minimal record's unknown values serialise as null, not 0."""
        d = Record(id="x", ts="t", method="GET", path="/").to_dict()
        assert d["ttft_ms"] is None and d["decode_tok_s"] is None and d["tool_calls"] is None


class TestRecordReplace:
    """Record.replace, the record's own faster dataclasses.replace."""

    def test_replace_equals_dataclasses_replace(self) -> None:
        """Any set of fields changed gives the record dataclasses.replace gives, and the
        original is unchanged."""
        full = _full_record()
        names = [f.name for f in dataclasses.fields(Record)]
        for start in range(0, len(names), 7):
            changes: dict[str, Any] = {
                name: None for name in names[start : start + 7] if name not in ("kind", "outcome")
            }
            assert full.replace(**changes) == dataclasses.replace(full, **changes)
        assert full.replace() == full and full == _full_record()
        assert full.replace(kind=Kind.TOOL).kind is Kind.TOOL

    def test_an_unknown_field_raises_type_error(self) -> None:
        """A name that is not a field raises TypeError, as dataclasses.replace does."""
        with pytest.raises(TypeError):
            _full_record().replace(not_a_field=1)


class TestToolCallsValid:
    NAMES = frozenset({"get_weather", "move_arm"})

    @pytest.mark.parametrize(
        ("calls", "expected"),
        [
            ((), None),
            ((ToolCall(0, "get_weather", '{"city": "Paris"}'),), True),
            ((ToolCall(0, "get_weather", "{}"), ToolCall(1, "move_arm", '{"x":1}')), True),
            ((ToolCall(0, "get_time", "{}"),), False),
            ((ToolCall(0, "", "{}"),), False),
            ((ToolCall(0, "get_weather", '{"city": '),), False),
            ((ToolCall(0, "get_weather", ""),), False),
            ((ToolCall(0, "get_weather", "[1]"),), False),
            ((ToolCall(0, "get_weather", '"{}"'),), False),
            ((ToolCall(0, "get_weather", "null"),), False),
            ((ToolCall(0, "get_weather", "{}"), ToolCall(1, "nope", "{}")), False),
            ((ToolCall(0, "get_weather", "{}"), ToolCall(1, "move_arm", "[]")), False),
        ],
        ids=[
            "no_calls",
            "one_valid",
            "two_valid",
            "unknown_name",
            "empty_name",
            "truncated_json",
            "empty_args",
            "array_args",
            "string_args",
            "null_args",
            "second_unknown",
            "second_not_object",
        ],
    )
    def test_validity(self, calls: tuple[ToolCall, ...], expected: bool | None) -> None:
        """None without calls; False for an unknown name or args not a JSON object; else True."""
        assert tool_calls_valid(calls, self.NAMES) is expected

    def test_no_tools_declared(self) -> None:
        """A call when the request declared no tools is invalid."""
        assert tool_calls_valid((ToolCall(0, "get_weather", "{}"),), frozenset()) is False


def _exchange(**kw: Any) -> Exchange:
    base: dict[str, Any] = {
        "id": "r-1",
        "ts": "t",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "outcome": Outcome.COMPLETED,
        "end_s": 2.2,
        "request_bytes": 900,
    }
    return Exchange(**{**base, **kw})


TOOL_FACTS = RequestFacts(
    kind=Kind.TOOL, model="gemma-3-270m", stream=True, tool_names=frozenset({"get_weather"})
)


class TestBuildRecord:
    def test_unrecognised_response_has_unknown_counts(self) -> None:
        """A response in which nothing was the API's own has null token and call counts,
        not zeros (its events are still counted)."""
        r = build_record(_exchange(), TOOL_FACTS, Observation(first_byte_s=0.5, events=3))
        assert (r.tool_calls, r.token_events, r.events) == (None, None, 3)

    def test_stream_with_tool_call(self) -> None:
        """Wall-clock fields come from the observation, server fields from its timings."""
        obs = Observation(
            first_byte_s=1.1402,
            first_token_s=1.4757,
            last_token_s=2.0745,
            last_byte_s=2.2007,
            tool_call_s=2.0745,
            events=11,
            token_events=8,
            response_bytes=7000,
            timings=ServerTimings(
                prompt_n=305, prompt_ms=1125.865, cache_n=1, predicted_n=30, predicted_ms=1063.169
            ),
            model="gemma3.gguf",
            finish_reason="tool_calls",
            tool_calls=(ToolCall(0, "get_weather", '{"city": "Paris"}'),),
            recognised=True,
            done=True,
        )
        r = build_record(_exchange(), TOOL_FACTS, obs)
        assert r.ttfb_ms == 1140.2
        assert r.ttft_ms == 1475.7
        assert r.e2e_ms == 2200.0
        assert r.decode_wall_ms == pytest.approx(598.8, abs=1e-9)
        assert r.tool_calls == 1
        assert r.tool_call_valid is True
        assert r.tool_call_ms == 2074.5
        assert r.model == "gemma3.gguf"  # the server's name wins over the request's
        assert r.kind is Kind.TOOL
        assert r.prompt_tokens == 306
        assert r.overhead_ms == pytest.approx(349.835, abs=1e-9)
        assert r.decode_tok_s == pytest.approx(29 / 1063.169 * 1000, abs=1e-6)
        assert (r.events, r.token_events, r.response_bytes, r.request_bytes) == (11, 8, 7000, 900)
        assert r.finish_reason == "tool_calls"

    def test_no_observation(self) -> None:
        """Without an observation counts are None (not 0) and the model is the request's."""
        r = build_record(
            _exchange(
                status=None, outcome=Outcome.UPSTREAM_UNREACHABLE, error="upstream_unreachable"
            ),
            TOOL_FACTS,
            None,
        )
        assert r.tool_calls is None
        assert r.events is None
        assert r.response_bytes is None
        assert r.ttft_ms is None
        assert r.tool_call_valid is None
        assert r.model == "gemma-3-270m"
        assert r.outcome is Outcome.UPSTREAM_UNREACHABLE
        assert r.error == "upstream_unreachable"

    def test_observation_without_calls(self) -> None:
        """An observed response with a token and no calls records 0 calls and no tool time."""
        obs = Observation(
            first_byte_s=0.5, first_token_s=0.5, last_token_s=0.5, token_events=1, recognised=True
        )
        r = build_record(_exchange(), TOOL_FACTS, obs)
        assert r.tool_calls == 0
        assert r.tool_call_ms is None
        assert r.tool_call_valid is None
        assert r.decode_wall_ms == 0.0

    def test_upstream_error_becomes_error(self) -> None:
        """llama-server's own error event fills ``error`` and wins over the relay's reason
        (the outcome already says how the exchange ended; the event says why)."""
        obs = Observation(upstream_error="server_error:500")
        assert build_record(_exchange(), TOOL_FACTS, obs).error == "server_error:500"
        assert (
            build_record(_exchange(error="ClientPayloadError"), TOOL_FACTS, obs).error
            == "server_error:500"
        )
        assert (
            build_record(_exchange(error="ClientPayloadError"), TOOL_FACTS, Observation()).error
            == "ClientPayloadError"
        )

    def test_analysis_errors(self) -> None:
        """The request's analysis error wins, then the tracker's, then oversized events."""
        facts_err = dataclasses.replace(TOOL_FACTS, error="request_body_not_json")
        both = Observation(analysis_error="tracker: RuntimeError", oversized_events=2)
        assert build_record(_exchange(), facts_err, both).analysis_error == "request_body_not_json"
        assert build_record(_exchange(), TOOL_FACTS, both).analysis_error == "tracker: RuntimeError"
        only_oversized = Observation(oversized_events=2)
        assert (
            build_record(_exchange(), TOOL_FACTS, only_oversized).analysis_error
            == "oversized_events:2"
        )
        assert build_record(_exchange(), TOOL_FACTS, Observation()).analysis_error is None


class TestOutcomeOfAnAnswer:
    @pytest.mark.parametrize(
        ("status", "outcome", "expected"),
        [
            (200, Outcome.COMPLETED, Outcome.COMPLETED),
            (500, Outcome.COMPLETED, Outcome.UPSTREAM_ERROR),
            (400, Outcome.COMPLETED, Outcome.UPSTREAM_ERROR),
            (502, Outcome.UPSTREAM_UNREACHABLE, Outcome.UPSTREAM_UNREACHABLE),
            (500, Outcome.CLIENT_CLOSED, Outcome.CLIENT_CLOSED),
        ],
    )
    def test_an_error_status_is_no_success(
        self, status: int, outcome: Outcome, expected: Outcome
    ) -> None:
        """A whole response with a 4xx/5xx status is ``upstream_error``; the proxy's own
        failures and hang-ups keep their outcome."""
        record = build_record(_exchange(status=status, outcome=outcome), TOOL_FACTS, None)
        assert record.outcome is expected
