"""Tests for proxy.core.tracker: response chunks and an injected clock in, an Observation out."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.assemble import Exchange, build_record
from proxy.core.record import Outcome, ServerTimings, derive
from proxy.core.request import analyse_request
from proxy.core.tracker import MAX_REASONING_BYTES, Observation, StreamTracker, ToolCall
from tests.fakes import (
    DONE,
    PING,
    RECORDINGS_DIR,
    FakeClock,
    chat_event,
    load_recording,
    make_timings,
    sse_json,
)
from tests.profiles import examples

T0 = 0.0  # the request arrival on the fake clock (exact float arithmetic for recorded times)
MODEL = "gemma-3-270m-q4_k_m.gguf"  # the model name chat_event() writes


def role() -> bytes:
    return chat_event({"role": "assistant", "content": None})


def content(text: str) -> bytes:
    return chat_event({"content": text})


def tool_delta(
    index: int, *, name: str | None = None, args: str | None = None, call_id: str | None = None
) -> bytes:
    """A streamed tool-call delta; ``id``/``type`` only when ``call_id`` is given (first delta)."""
    d: dict[str, Any] = {"index": index}
    if call_id is not None:
        d["id"] = call_id
        d["type"] = "function"
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    d["function"] = fn
    return chat_event({"tool_calls": [d]})


def finish(reason: str = "stop", timings: dict[str, Any] | None = None) -> bytes:
    return chat_event({}, finish_reason=reason, timings=timings)


def run_sse(timed_chunks: Sequence[tuple[float, bytes]], **kwargs: Any) -> Observation:
    """Feed ``(seconds after T0, chunk)`` pairs to an SSE tracker and finish it."""
    clock = FakeClock()
    tracker = StreamTracker(T0, sse=True, clock=clock, **kwargs)
    for t, chunk in timed_chunks:
        clock.now = T0 + t
        tracker.feed(chunk)
    return tracker.finish()


def run_body(timed_chunks: Sequence[tuple[float, bytes]], **kwargs: Any) -> Observation:
    """Feed ``(seconds after T0, chunk)`` pairs to a JSON-body tracker and finish it."""
    clock = FakeClock()
    tracker = StreamTracker(T0, sse=False, clock=clock, **kwargs)
    for t, chunk in timed_chunks:
        clock.now = T0 + t
        tracker.feed(chunk)
    return tracker.finish()


def at_one_per_second(chunks: Sequence[bytes]) -> list[tuple[float, bytes]]:
    """Chunk i arrives at i+1 seconds."""
    return [(float(i + 1), c) for i, c in enumerate(chunks)]


TIMINGS = make_timings(prompt_n=40, prompt_ms=194.973, predicted_n=24, predicted_ms=553.696)


# --------------------------------------------------------------------------------------------
# SSE: times


class TestSSETimes:
    def test_ttfb_is_time_of_first_chunk(self) -> None:
        """ttfb is the arrival time of the first chunk, even when that chunk is only a ping."""
        obs = run_sse([(0.25, PING), (0.5, role() + content("Hi")), (0.75, DONE)])
        assert obs.first_byte_s == 0.25
        assert obs.last_byte_s == 0.75

    def test_times_are_relative_to_t0(self) -> None:
        """Observed times are clock readings minus t0, not raw clock readings."""
        clock = FakeClock(1000.0 + 2.0)
        tracker = StreamTracker(1000.0, sse=True, clock=clock)
        tracker.feed(role() + content("Hi"))
        obs = tracker.finish()
        assert obs.first_byte_s == 2.0
        assert obs.first_token_s == 2.0

    def test_role_chunk_is_not_a_token(self) -> None:
        """TTFT is the time of the first event carrying content, not of the role chunk."""
        obs = run_sse([(1.0, role()), (1.5, content("Hello")), (2.0, DONE)])
        assert obs.first_byte_s == 1.0
        assert obs.first_token_s == 1.5
        assert obs.token_events == 1

    def test_empty_content_is_not_a_token(self) -> None:
        """An empty ``"content":""`` delta is not a token."""
        obs = run_sse([(1.0, role()), (2.0, content("")), (3.0, content("x"))])
        assert obs.first_token_s == 3.0
        assert obs.token_events == 1

    @pytest.mark.parametrize(
        "delta",
        [
            {"content": "Hello"},
            {"reasoning_content": "The user"},
            {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]},
        ],
        ids=["content", "reasoning_content", "tool_calls"],
    )
    def test_token_bearing_deltas(self, delta: dict[str, Any]) -> None:
        """content, reasoning_content and a tool_calls delta each count as a token."""
        obs = run_sse([(1.0, role()), (2.0, chat_event(delta)), (3.0, finish())])
        assert obs.first_token_s == 2.0
        assert obs.last_token_s == 2.0
        assert obs.token_events == 1

    def test_completions_text_is_a_token(self) -> None:
        """A /v1/completions ``text`` choice counts as a token; the empty final text does not."""
        first = sse_json({"choices": [{"text": " the", "index": 0, "finish_reason": None}]})
        last = sse_json({"choices": [{"text": "", "index": 0, "finish_reason": "length"}]})
        obs = run_sse([(0.5, first), (0.75, last), (1.0, DONE)])
        assert obs.first_token_s == 0.5
        assert obs.last_token_s == 0.5
        assert obs.finish_reason == "length"

    def test_events_in_one_chunk_share_the_chunk_time(self) -> None:
        """Several events in one chunk are all stamped with that chunk's arrival time."""
        obs = run_sse([(0.2, role() + content("a") + content("b")), (0.9, content("c"))])
        assert obs.first_token_s == 0.2
        assert obs.last_token_s == 0.9
        assert obs.token_events == 3
        assert obs.events == 4

    def test_last_token_is_last_token_event_not_last_byte(self) -> None:
        """last_token_s is the last token event; the finish chunk and [DONE] do not move it."""
        chunks = [role() + content("a"), content("b"), content("c"), finish(timings=TIMINGS), DONE]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.first_token_s == 1.0
        assert obs.last_token_s == 3.0
        assert obs.last_byte_s == 5.0
        # the decode wall the record derives from these
        assert obs.last_token_s - obs.first_token_s == 2.0

    def test_first_event_time(self) -> None:
        """first_event_s is the first complete SSE event (the role chunk); pings do not set it."""
        obs = run_sse([(0.25, PING), (0.5, role()), (0.75, content("x"))])
        assert obs.first_event_s == 0.5
        assert obs.first_token_s == 0.75

    def test_first_event_of_split_event(self) -> None:
        """An event split across chunks is timed by the chunk that completes it."""
        ev = role()
        obs = run_sse([(0.25, ev[:10]), (0.5, ev[10:])])
        assert obs.first_byte_s == 0.25
        assert obs.first_event_s == 0.5

    def test_no_tokens_leaves_token_times_unknown(self) -> None:
        """A stream without token events has no first/last token time (None, not 0)."""
        obs = run_sse([(1.0, role()), (2.0, finish()), (3.0, DONE)])
        assert obs.first_token_s is None
        assert obs.last_token_s is None
        assert obs.token_events == 0

    def test_nothing_fed(self) -> None:
        """A tracker that never saw a chunk reports no times and zero bytes."""
        obs = StreamTracker(T0, sse=True, clock=FakeClock()).finish()
        assert obs == Observation()


# --------------------------------------------------------------------------------------------
# SSE: what is read from the events


class TestSSEContent:
    def test_timings_from_last_event_carrying_them(self) -> None:
        """``timings`` is taken from the LAST JSON event carrying it (live values get replaced)."""
        early = make_timings(prompt_n=40, prompt_ms=100.0, predicted_n=1, predicted_ms=0.001)
        final = make_timings(prompt_n=40, prompt_ms=100.0, predicted_n=3, predicted_ms=50.0)
        chunks = [
            role() + chat_event({"content": "a"}, timings=early),
            chat_event({"content": "b"}, timings=early),
            finish(timings=final),
            DONE,
        ]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.timings == ServerTimings(
            prompt_n=40, prompt_ms=100.0, cache_n=0, predicted_n=3, predicted_ms=50.0
        )

    def test_timings_fields_mapped(self) -> None:
        """Each llama-server timings field lands in the matching ServerTimings field."""
        t = make_timings(
            prompt_n=5, prompt_ms=38.3, predicted_n=24, predicted_ms=589.167, cache_n=35
        )
        obs = run_sse([(1.0, role() + content("x")), (2.0, finish(timings=t) + DONE)])
        assert obs.timings == ServerTimings(
            prompt_n=5, prompt_ms=38.3, cache_n=35, predicted_n=24, predicted_ms=589.167
        )

    def test_model_read_from_first_event(self) -> None:
        """``model`` is the first event's model; a different model later does not replace it."""
        later = sse_json(
            {
                "choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
                "model": "other-model",
            }
        )
        obs = run_sse(at_one_per_second([role(), content("x"), later, DONE]))
        assert obs.model == MODEL

    def test_finish_reason_from_last_non_null(self) -> None:
        """finish_reason is the last non-null one; a later usage chunk with no choices keeps it."""
        usage_chunk = sse_json(
            {
                "choices": [],
                "usage": {
                    "completion_tokens": 3,
                    "prompt_tokens": 14,
                    "total_tokens": 17,
                    "prompt_tokens_details": {"cached_tokens": 0},
                },
            }
        )
        chunks = [role(), content("x"), finish("length"), content("y"), usage_chunk, DONE]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.finish_reason == "length"

    def test_finish_reason_last_one_wins(self) -> None:
        """When two events carry a finish_reason, the later one is kept."""
        obs = run_sse(at_one_per_second([role(), finish("tool_calls"), finish("stop")]))
        assert obs.finish_reason == "stop"

    def test_finish_reason_absent(self) -> None:
        """No event with a non-null finish_reason leaves it None."""
        obs = run_sse(at_one_per_second([role(), content("x")]))
        assert obs.finish_reason is None

    def test_done_sets_done(self) -> None:
        """``data: [DONE]`` sets done and is counted as an event but not as a token."""
        obs = run_sse(at_one_per_second([role() + content("x"), finish(), DONE]))
        assert obs.done is True
        assert obs.events == 4
        assert obs.token_events == 1

    def test_missing_done(self) -> None:
        """A stream cut before ``[DONE]`` leaves done False."""
        obs = run_sse(at_one_per_second([role() + content("x"), finish()]))
        assert obs.done is False

    def test_ping_comments_ignored(self) -> None:
        """``:`` keep-alive pings are neither events nor tokens, but their bytes are counted."""
        chunks = [PING, role() + content("x"), PING, PING, content("y"), PING]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.events == 3
        assert obs.token_events == 2
        assert obs.first_token_s == 2.0
        assert obs.last_token_s == 5.0
        assert obs.response_bytes == sum(len(c) for c in chunks)

    def test_response_bytes_counts_every_byte(self) -> None:
        """response_bytes is the sum of every fed chunk's length."""
        chunks = [role(), content("héllo"), finish(timings=TIMINGS), DONE]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.response_bytes == len(b"".join(chunks))

    def test_incomplete_last_event_is_not_read(self) -> None:
        """An event cut off before its blank line (stream died) is dropped, not half-read."""
        cut = finish(timings=TIMINGS)[:-1]
        obs = run_sse(at_one_per_second([role() + content("x"), cut]))
        assert obs.timings is None
        assert obs.finish_reason is None
        assert obs.events == 2

    def test_oversized_event_counted(self) -> None:
        """An event over max_event_bytes is dropped and counted in oversized_events."""
        big = content("x" * 5000)
        obs = run_sse(at_one_per_second([role(), big, content("y")]), max_event_bytes=1024)
        assert obs.oversized_events == 1
        assert obs.token_events == 1
        assert obs.first_token_s == 3.0


class TestSSEToolCalls:
    def test_fragments_concatenate(self) -> None:
        """Argument fragments of one call concatenate; the name from the first delta stays."""
        chunks = [
            role(),
            tool_delta(0, name="get_weather", args="{", call_id="2crMlh3Zwy"),
            tool_delta(0, args='"city": "'),
            tool_delta(0, args='Paris"}'),
            finish("tool_calls", TIMINGS),
            DONE,
        ]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.tool_calls == (ToolCall(0, "get_weather", '{"city": "Paris"}'),)

    def test_parallel_calls_kept_per_index(self) -> None:
        """Interleaved deltas of calls 0 and 1 are assembled per index, ordered by index."""
        chunks = [
            role(),
            tool_delta(1, name="move_arm", args='{"x":', call_id="b"),
            tool_delta(0, name="get_weather", args="{", call_id="a"),
            tool_delta(1, args="1}"),
            tool_delta(0, args='"city":"Oslo"}'),
        ]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", '{"city":"Oslo"}'),
            ToolCall(1, "move_arm", '{"x":1}'),
        )

    def test_several_calls_in_one_delta(self) -> None:
        """One event whose tool_calls list holds two calls records both."""
        delta = {
            "tool_calls": [
                {"index": 0, "function": {"name": "a", "arguments": "{}"}},
                {"index": 1, "function": {"name": "b", "arguments": "{}"}},
            ]
        }
        obs = run_sse([(1.0, chat_event(delta))])
        assert obs.tool_calls == (ToolCall(0, "a", "{}"), ToolCall(1, "b", "{}"))

    def test_repeated_name_replaces(self) -> None:
        """A repeated name is the full new name: it replaces the old one, never appends to it."""
        chunks = [
            tool_delta(0, name="get", args="{", call_id="a"),
            tool_delta(0, name="get_weather", args="}", call_id="a"),
        ]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.tool_calls == (ToolCall(0, "get_weather", "{}"),)

    def test_empty_name_does_not_erase(self) -> None:
        """An empty name in a later delta leaves the known name in place."""
        chunks = [tool_delta(0, name="get_weather", args="{"), tool_delta(0, name="", args="}")]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.tool_calls == (ToolCall(0, "get_weather", "{}"),)

    def test_missing_index_defaults_to_zero(self) -> None:
        """A delta without ``index`` belongs to call 0."""
        delta = {"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
        obs = run_sse([(1.0, chat_event(delta))])
        assert obs.tool_calls == (ToolCall(0, "f", "{}"),)

    def test_tool_call_time_is_last_tool_delta(self) -> None:
        """tool_call_s is the time of the last event carrying a tool_calls delta."""
        chunks = [
            role(),  # 1
            content("Let me check."),  # 2
            tool_delta(0, name="get_weather", args="{"),  # 3
            tool_delta(0, args="}"),  # 4
            finish("tool_calls", TIMINGS),  # 5
            DONE,  # 6
        ]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.tool_call_s == 4.0
        assert obs.first_token_s == 2.0
        assert obs.last_token_s == 4.0
        assert obs.token_events == 3

    def test_tool_delta_is_first_token(self) -> None:
        """In a pure tool-call turn, TTFT is the first tool_calls delta."""
        chunks = [role(), tool_delta(0, name="f", args="{"), tool_delta(0, args="}")]
        obs = run_sse(at_one_per_second(chunks))
        assert obs.first_token_s == 2.0

    def test_empty_tool_calls_list_is_not_a_call(self) -> None:
        """``"tool_calls":[]`` is neither a call nor a token, and sets no tool time."""
        obs = run_sse([(1.0, chat_event({"tool_calls": []}))])
        assert obs.tool_calls == ()
        assert obs.tool_call_s is None
        assert obs.token_events == 0

    def test_no_calls(self) -> None:
        """A plain chat stream has no tool calls and no tool time."""
        obs = run_sse(at_one_per_second([role() + content("x"), finish(), DONE]))
        assert obs.tool_calls == ()
        assert obs.tool_call_s is None


class TestSSEErrorsAndUsage:
    def test_error_event(self) -> None:
        """An ``{"error":{...}}`` event yields upstream_error ``type:code``."""
        err = sse_json(
            {"error": {"code": 500, "message": "Compute error.", "type": "server_error"}}
        )
        obs = run_sse(at_one_per_second([role() + content("x"), err]))
        assert obs.upstream_error == "server_error:500"
        assert obs.done is False
        assert obs.analysis_error is None

    def test_error_without_code(self) -> None:
        """An error object without a code still names its type."""
        obs = run_sse([(1.0, sse_json({"error": {"type": "server_error", "message": "x"}}))])
        assert obs.upstream_error == "server_error:"

    def test_error_as_string(self) -> None:
        """A bare string error is reported as ``error``."""
        obs = run_sse([(1.0, sse_json({"error": "boom"}))])
        assert obs.upstream_error == "error"

    def test_no_error(self) -> None:
        """A clean stream has no upstream_error."""
        obs = run_sse(at_one_per_second([role() + content("x"), finish(), DONE]))
        assert obs.upstream_error is None

    def test_usage_only_gives_counts(self) -> None:
        """A usage chunk without timings gives ServerTimings with counts only (no ms)."""
        usage_chunk = sse_json(
            {
                "choices": [],
                "usage": {
                    "completion_tokens": 24,
                    "prompt_tokens": 40,
                    "total_tokens": 64,
                    "prompt_tokens_details": {"cached_tokens": 35},
                },
            }
        )
        obs = run_sse(at_one_per_second([role() + content("x"), finish("length"), usage_chunk]))
        assert obs.timings == ServerTimings(
            prompt_n=5, prompt_ms=None, cache_n=35, predicted_n=24, predicted_ms=None
        )

    @pytest.mark.parametrize(
        "completion_tokens", ["24", 2.5, [24], True], ids=["str", "float", "list", "bool"]
    )
    def test_usage_bad_completion_tokens_unknown(self, completion_tokens: Any) -> None:
        """A non-integer usage.completion_tokens is read as unknown, so derive() cannot crash."""
        usage_chunk = sse_json(
            {
                "choices": [],
                "usage": {
                    "completion_tokens": completion_tokens,
                    "prompt_tokens": 40,
                    "prompt_tokens_details": {"cached_tokens": 35},
                },
            }
        )
        obs = run_sse([(1.0, usage_chunk)])
        assert obs.timings == ServerTimings(prompt_n=5, cache_n=35, predicted_n=None)
        assert derive(obs.timings, None)["prompt_tokens"] == 40

    def test_timings_preferred_over_usage(self) -> None:
        """When both usage and timings are present, the timings object wins."""
        both = sse_json(
            {
                "choices": [],
                "usage": {
                    "completion_tokens": 24,
                    "prompt_tokens": 40,
                    "total_tokens": 64,
                    "prompt_tokens_details": {"cached_tokens": 35},
                },
                "timings": make_timings(
                    prompt_n=5, prompt_ms=39.585, predicted_n=24, predicted_ms=491.962, cache_n=35
                ),
            }
        )
        obs = run_sse(at_one_per_second([role() + content("x"), both, DONE]))
        assert obs.timings is not None
        assert obs.timings.prompt_ms == 39.585
        assert obs.timings.predicted_ms == 491.962

    @pytest.mark.parametrize(
        "stream",
        [
            b"data: not json\n\n",
            b'data: {"choices":\n\n',
            b"data: \xff\xfe\xfd\n\n",
            b"data: [1,2,3]\n\n",
            b'data: "finish_reason":"x"\n\n',
            b"data: null\n\n",
            b'data: {"choices":"nope","timings":[],"usage":7,"error":3}\n\n',
            b'data: {"choices":[1,"x",null,{"delta":"x","finish_reason":5}]}\n\n',
            b'data: {"choices":[{"delta":{"tool_calls":"x"}}]}\n\n',
            b'data: {"choices":[{"delta":{"tool_calls":[1,null,{"index":"a","function":7}]}}]}\n\n',
            b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":5,'
            b'"arguments":[1]}}]}}]}\n\n',
            b'data: {"usage":{"prompt_tokens":"x","prompt_tokens_details":[]}}\n\n',
            b'data: {"timings":{"prompt_n":"1","prompt_ms":true,"predicted_ms":null}}\n\n',
            b'data: {"model":7}\n\n',
            b"data: " + b"[" * 5000 + b"]" * 5000 + b"\n\n",
            b"data: " + b'{"a":' * 2000 + b"1" + b"}" * 2000 + b"\n\n",
            b"event: weird\nid: 1\nretry: x\ndata: {}\n\n",
            b"\x00\x01\x02 garbage without newlines",
            b"\r\n\r\n\r\r\n:comment\rdata:{}\r\r",
        ],
    )
    def test_garbage_never_raises(self, stream: bytes) -> None:
        """Malformed or unexpected data is skipped without raising and without an analysis error."""
        obs = run_sse([(1.0, stream), (2.0, content("ok")), (3.0, DONE)])
        assert obs.analysis_error is None
        assert obs.response_bytes == len(stream) + len(content("ok")) + len(DONE)
        assert obs.done is True

    def test_bool_counts_are_not_counts(self) -> None:
        """A JSON ``true`` in a timings count field is read as unknown, not as 1, and named as
        implausible."""
        obs = run_sse([(1.0, sse_json({"timings": {"prompt_n": True, "prompt_ms": 12.5}}))])
        assert obs.timings == ServerTimings(
            prompt_n=None, prompt_ms=12.5, implausible=("prompt_n",)
        )

    def test_exception_in_analysis_is_caught(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An exception in the analysis is kept in analysis_error and bytes are still counted."""

        def boom(self: StreamTracker, data: bytes, now: float) -> bool:
            raise RuntimeError("simulated")

        monkeypatch.setattr(StreamTracker, "_read_event", boom)
        chunks = [role(), content("x"), content("y"), DONE]
        obs = run_sse(at_one_per_second(chunks))  # the first event is always read -> boom
        assert obs.analysis_error == "tracker: RuntimeError"
        assert obs.response_bytes == sum(len(c) for c in chunks)
        assert obs.first_byte_s == 1.0
        assert obs.last_byte_s == 4.0
        assert obs.events == 1  # the analysis stopped at the failing event
        assert obs.done is False

    def test_exception_after_tokens_keeps_what_was_seen(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An analysis failure mid-stream keeps earlier token times and stops the analysis
        (the failing chunk is a ping and a tool-call delta)."""
        clock = FakeClock()
        tracker = StreamTracker(T0, sse=True, clock=clock)
        clock.now = T0 + 1.0
        tracker.feed(role() + content("a"))

        def boom(self: StreamTracker, data: bytes, now: float) -> None:
            raise ValueError("simulated")

        monkeypatch.setattr(StreamTracker, "_on_event", boom)
        clock.now = T0 + 2.0
        tracker.feed(PING + tool_delta(0, name="f", args="{"))
        clock.now = T0 + 3.0
        tracker.feed(content("c"))
        obs = tracker.finish()
        assert obs.analysis_error == "tracker: ValueError"
        assert obs.first_token_s == 1.0
        assert obs.last_token_s == 1.0
        assert obs.last_byte_s == 3.0
        failing = PING + tool_delta(0, name="f", args="{")
        assert obs.response_bytes == len(role() + content("a") + failing + content("c"))


# --------------------------------------------------------------------------------------------
# SSE: chunking does not matter


_TOOL_STREAM = b"".join(
    [
        PING,
        role(),
        chat_event({"reasoning_content": "The user wants weather."}),
        content("Checking "),
        content("héllo ☃ "),
        tool_delta(0, name="get_weather", args="{", call_id="2crMlh3ZwyXOLhWNkbtt5k8yWvHXzgFj"),
        tool_delta(0, args='"city": "'),
        PING,
        tool_delta(1, name="move_arm", args='{"x": 1', call_id="b"),
        tool_delta(0, args='Paris"}'),
        tool_delta(1, args="}"),
        b"data: not json\n\n",
        finish("tool_calls"),
        sse_json(
            {
                "choices": [],
                "usage": {
                    "completion_tokens": 30,
                    "prompt_tokens": 306,
                    "total_tokens": 336,
                    "prompt_tokens_details": {"cached_tokens": 301},
                },
                "timings": make_timings(
                    prompt_n=5, prompt_ms=41.702, predicted_n=30, predicted_ms=739.365, cache_n=301
                ),
            }
        ),
        DONE,
    ]
)

_ERROR_STREAM = b"".join(
    [
        role(),
        content("x"),
        sse_json({"error": {"code": 500, "message": "Compute error.", "type": "server_error"}}),
    ]
)

_CRLF_STREAM = _TOOL_STREAM.replace(b"\n", b"\r\n")


def _whole(stream: bytes) -> Observation:
    return run_sse([(0.0, stream)])


class TestSSEChunking:
    @settings(max_examples=examples(200), deadline=None)
    @given(
        stream=st.sampled_from([_TOOL_STREAM, _ERROR_STREAM, _CRLF_STREAM]),
        data=st.data(),
    )
    def test_any_chunking_gives_same_observation(self, stream: bytes, data: st.DataObject) -> None:
        """Any split of the same bytes into chunks gives the same Observation (constant clock)."""
        cuts = data.draw(
            st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=40), label="cuts"
        )
        bounds = [0, *sorted(cuts), len(stream)]
        chunks = [stream[a:b] for a, b in pairwise(bounds)]
        assert b"".join(chunks) == stream
        split = run_sse([(0.0, c) for c in chunks])
        assert split == _whole(stream)

    def test_reference_observation_of_property_stream(self) -> None:
        """The whole-stream observation used as the property's oracle is itself right."""
        obs = _whole(_TOOL_STREAM)
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", '{"city": "Paris"}'),
            ToolCall(1, "move_arm", '{"x": 1}'),
        )
        assert obs.finish_reason == "tool_calls"
        assert obs.model == MODEL
        assert obs.done is True
        assert obs.token_events == 8  # reasoning, 2 content, 5 tool deltas
        assert obs.events == 13  # every data event incl. the non-JSON one and [DONE]; no pings
        assert obs.timings == ServerTimings(
            prompt_n=5, prompt_ms=41.702, cache_n=301, predicted_n=30, predicted_ms=739.365
        )
        assert _whole(_CRLF_STREAM) == dataclasses.replace(obs, response_bytes=len(_CRLF_STREAM))

    def test_byte_by_byte_with_times(self) -> None:
        """Fed one byte per second, each time is the arrival of the byte completing the event."""
        stream = role() + content("a") + content("b") + DONE
        obs = run_sse([(float(i), stream[i : i + 1]) for i in range(len(stream))])
        end_first = len(role() + content("a")) - 1  # the final LF completes the event
        end_second = len(role() + content("a") + content("b")) - 1
        assert obs.first_byte_s == 0.0
        assert obs.first_token_s == float(end_first)
        assert obs.last_token_s == float(end_second)
        assert obs.last_byte_s == float(len(stream) - 1)


# --------------------------------------------------------------------------------------------
# SSE: real llama-server recordings


def _recording_events(chunks: Sequence[tuple[float, bytes]]) -> list[tuple[float, Any]]:
    """An independent oracle: each ``data:`` event, parsed by the stdlib, with its chunk time.

    Valid for llama-server's own framing (LF only, one ``data:`` line per event, chunks that
    end on event boundaries).
    """
    out: list[tuple[float, Any]] = []
    for t, chunk in chunks:
        for block in chunk.split(b"\n\n"):
            if not block.startswith(b"data: "):
                continue
            payload = block[len(b"data: ") :]
            out.append((t, "[DONE]" if payload == b"[DONE]" else json.loads(payload)))
    return out


def _is_token(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    if obj.get("content"):  # native /completion
        return True
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
        if choice.get("text"):
            return True
    return False


SSE_RECORDINGS = [
    "chat_stream",
    "chat_stream_usage",
    "tool_stream",
    "completions_stream",
    "native_completion_stream",
]


def _needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not (RECORDINGS_DIR / f"{name}.json").exists(), reason=f"no recording {name}"
    )


def _replay(name: str, sse: bool) -> tuple[Observation, list[tuple[float, bytes]]]:
    rec = load_recording(name)
    obs = (run_sse if sse else run_body)(rec.chunks)
    return obs, rec.chunks


class TestSSERecordings:
    @pytest.mark.parametrize("name", [pytest.param(n, marks=_needs(n)) for n in SSE_RECORDINGS])
    def test_recording_matches_oracle(self, name: str) -> None:
        """A recorded stream fed with its arrival times gives the timings, model and times in it."""
        obs, chunks = _replay(name, sse=True)
        events = _recording_events(chunks)
        objs = [o for _, o in events if isinstance(o, dict)]
        last_timings = [o["timings"] for o in objs if "timings" in o][-1]
        assert obs.timings == ServerTimings(
            prompt_n=last_timings["prompt_n"],
            prompt_ms=last_timings["prompt_ms"],
            cache_n=last_timings["cache_n"],
            predicted_n=last_timings["predicted_n"],
            predicted_ms=last_timings["predicted_ms"],
        )
        assert obs.model == next(o["model"] for o in objs if "model" in o)
        reasons = [
            c["finish_reason"] for o in objs for c in o.get("choices", []) if c.get("finish_reason")
        ]
        assert obs.finish_reason == (reasons[-1] if reasons else None)
        token_times = [t for t, o in events if _is_token(o)]
        assert obs.first_byte_s == chunks[0][0]
        assert obs.last_byte_s == chunks[-1][0]
        assert obs.first_event_s == events[0][0]
        assert obs.first_token_s == token_times[0]
        assert obs.last_token_s == token_times[-1]
        assert obs.token_events == len(token_times)
        assert obs.events == len(events)
        assert obs.done == ("[DONE]" in [o for _, o in events])
        assert obs.response_bytes == sum(len(c) for _, c in chunks)
        assert obs.analysis_error is None
        assert obs.upstream_error is None

    @_needs("chat_stream")
    def test_recorded_chat_role_chunk_shares_first_token_time(self) -> None:
        """In the recorded chat, the role chunk and first content share chunk 0: ttft == ttfb."""
        obs, chunks = _replay("chat_stream", sse=True)
        assert obs.first_token_s == obs.first_byte_s == chunks[0][0]
        assert obs.tool_calls == ()
        assert obs.tool_call_s is None
        assert obs.done is True

    @_needs("tool_stream")
    def test_recorded_tool_call(self) -> None:
        """The recorded tool stream yields one valid get_weather call, timed at its last delta."""
        obs, chunks = _replay("tool_stream", sse=True)
        events = _recording_events(chunks)
        tool_times = [
            t
            for t, o in events
            if isinstance(o, dict)
            and any(c.get("delta", {}).get("tool_calls") for c in o.get("choices", []))
        ]
        args = "".join(
            tc["function"].get("arguments", "")
            for _, o in events
            if isinstance(o, dict)
            for c in o.get("choices", [])
            for tc in c.get("delta", {}).get("tool_calls", [])
        )
        assert len(obs.tool_calls) == 1
        call = obs.tool_calls[0]
        assert call.index == 0
        assert call.name == "get_weather"
        assert call.arguments == args
        assert isinstance(json.loads(call.arguments), dict)
        assert obs.tool_call_s == tool_times[-1]
        assert obs.first_token_s == tool_times[0]  # the role chunk came earlier, alone
        assert obs.first_byte_s is not None and obs.first_byte_s < tool_times[0]
        assert obs.finish_reason == "tool_calls"

    @_needs("chat_stream_usage")
    def test_recorded_usage_stream_prefers_timings(self) -> None:
        """With include_usage, the usage chunk's timings (with ms) win over the usage counts."""
        obs, _ = _replay("chat_stream_usage", sse=True)
        assert obs.timings is not None
        assert obs.timings.prompt_ms is not None
        assert obs.timings.predicted_ms is not None

    @_needs("native_completion_stream")
    def test_recorded_native_stream_has_no_done(self) -> None:
        """The native /completion stream sends no [DONE] and no finish_reason."""
        obs, _ = _replay("native_completion_stream", sse=True)
        assert obs.done is False
        assert obs.finish_reason is None
        assert obs.timings is not None


# --------------------------------------------------------------------------------------------
# JSON body (sse=False)


NOSTREAM_TOOL_BODY = orjson.dumps(
    {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "id": "a",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        },
                        {
                            "type": "function",
                            "id": "b",
                            "function": {
                                "name": "move_arm",
                                "arguments": '{"x": 1, "y": 2, "z": 3}',
                            },
                        },
                    ],
                },
            }
        ],
        "created": 1796010014,
        "model": "gemma3",
        "object": "chat.completion",
        "usage": {
            "completion_tokens": 30,
            "prompt_tokens": 306,
            "total_tokens": 336,
            "prompt_tokens_details": {"cached_tokens": 301},
        },
        "id": "chatcmpl-x",
        "timings": make_timings(
            prompt_n=5, prompt_ms=41.702, predicted_n=30, predicted_ms=739.365, cache_n=301
        ),
    }
)


class TestJSONBody:
    def test_fields_read_at_finish(self) -> None:
        """timings, model, finish_reason and message.tool_calls are read from the whole body."""
        body = NOSTREAM_TOOL_BODY
        mid = len(body) // 2
        obs = run_body([(0.5, body[:mid]), (0.75, body[mid:])])
        assert obs.timings == ServerTimings(
            prompt_n=5, prompt_ms=41.702, cache_n=301, predicted_n=30, predicted_ms=739.365
        )
        assert obs.model == "gemma3"
        assert obs.finish_reason == "tool_calls"
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", '{"city": "Paris"}'),
            ToolCall(1, "move_arm", '{"x": 1, "y": 2, "z": 3}'),
        )
        assert obs.first_byte_s == 0.5
        assert obs.last_byte_s == 0.75
        assert obs.response_bytes == len(body)

    def test_tool_call_time_is_last_byte(self) -> None:
        """With calls in the body, tool_call_s is the arrival time of the body's last byte."""
        body = NOSTREAM_TOOL_BODY
        obs = run_body([(0.5, body[:10]), (0.6, body[10:20]), (0.9, body[20:])])
        assert obs.tool_call_s == 0.9

    def test_no_events_or_tokens_in_a_body(self) -> None:
        """A JSON body has no SSE events, so no token times (ttft unknown), and done stays False."""
        obs = run_body([(0.5, NOSTREAM_TOOL_BODY)])
        assert obs.events == 0
        assert obs.first_event_s is None
        assert obs.token_events == 0
        assert obs.first_token_s is None
        assert obs.done is False

    def test_body_without_calls(self) -> None:
        """A body with no tool_calls has no calls and no tool time."""
        body = orjson.dumps(
            {
                "choices": [
                    {
                        "finish_reason": "stop",
                        "index": 0,
                        "message": {"role": "assistant", "content": "Hello!"},
                    }
                ],
                "model": "gemma3",
            }
        )
        obs = run_body([(0.5, body)])
        assert obs.tool_calls == ()
        assert obs.tool_call_s is None
        assert obs.finish_reason == "stop"

    def test_usage_only_body(self) -> None:
        """A body with usage but no timings gives counts only."""
        body = orjson.dumps(
            {
                "choices": [],
                "usage": {
                    "completion_tokens": 24,
                    "prompt_tokens": 40,
                    "prompt_tokens_details": {"cached_tokens": 35},
                },
            }
        )
        obs = run_body([(0.5, body)])
        assert obs.timings == ServerTimings(prompt_n=5, cache_n=35, predicted_n=24)

    def test_body_over_limit(self) -> None:
        """A body over max_body_bytes sets analysis_error and is not read, bytes still counted."""
        body = NOSTREAM_TOOL_BODY
        obs = run_body([(0.5, body[:50]), (0.6, body[50:])], max_body_bytes=100)
        assert obs.analysis_error == "response_body_too_large"
        assert obs.timings is None
        assert obs.tool_calls == ()
        assert obs.response_bytes == len(body)
        assert obs.last_byte_s == 0.6

    def test_body_exactly_at_limit_is_read(self) -> None:
        """A body of exactly max_body_bytes is still read."""
        body = NOSTREAM_TOOL_BODY
        obs = run_body([(0.5, body)], max_body_bytes=len(body))
        assert obs.analysis_error is None
        assert obs.model == "gemma3"

    @pytest.mark.parametrize(
        "body",
        [b"<html>502 Bad Gateway</html>", b'{"choices":', b"\xff\xfe", b"[1, 2]", b"null", b""],
        ids=["html", "truncated", "binary", "array", "null", "empty"],
    )
    def test_non_json_body(self, body: bytes) -> None:
        """A body that is not a JSON object gives no error and nothing read."""
        obs = run_body([(0.5, body)])
        assert obs.analysis_error is None
        assert obs.upstream_error is None
        assert obs.timings is None
        assert obs.model is None
        assert obs.response_bytes == len(body)

    def test_error_body(self) -> None:
        """A JSON error body yields upstream_error ``type:code``."""
        body = (
            b'{"error":{"code":400,"message":"request (4532 tokens) exceeds the available '
            b'context size (4096 tokens), try increasing it","type":"exceed_context_size_error"'
            b',"n_prompt_tokens":4532,"n_ctx":4096}}'
        )
        obs = run_body([(0.01, body)])
        assert obs.upstream_error == "exceed_context_size_error:400"

    def test_exception_at_finish_is_caught(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An exception while reading the body at finish becomes analysis_error, not a raise."""

        def boom(self: StreamTracker) -> None:
            raise KeyError("simulated")

        monkeypatch.setattr(StreamTracker, "_read_body", boom)
        obs = run_body([(0.5, NOSTREAM_TOOL_BODY)])
        assert obs.analysis_error == "tracker: KeyError"
        assert obs.response_bytes == len(NOSTREAM_TOOL_BODY)

    @_needs("chat_nostream")
    def test_recorded_chat_body(self) -> None:
        """The recorded non-stream chat body gives its timings, model and finish_reason."""
        obs, chunks = _replay("chat_nostream", sse=False)
        obj = json.loads(b"".join(c for _, c in chunks))
        t = obj["timings"]
        assert obs.timings == ServerTimings(
            prompt_n=t["prompt_n"],
            prompt_ms=t["prompt_ms"],
            cache_n=t["cache_n"],
            predicted_n=t["predicted_n"],
            predicted_ms=t["predicted_ms"],
        )
        assert obs.model == obj["model"]
        assert obs.finish_reason == obj["choices"][0]["finish_reason"]
        assert obs.tool_calls == ()

    @_needs("tool_nostream")
    def test_recorded_tool_body(self) -> None:
        """The recorded non-stream tool body gives its call (index = position) at the last byte."""
        obs, chunks = _replay("tool_nostream", sse=False)
        obj = json.loads(b"".join(c for _, c in chunks))
        calls = obj["choices"][0]["message"]["tool_calls"]
        assert obs.tool_calls == tuple(
            ToolCall(i, c["function"]["name"], c["function"]["arguments"])
            for i, c in enumerate(calls)
        )
        assert obs.tool_call_s == chunks[-1][0]
        assert obs.finish_reason == "tool_calls"

    @_needs("error_context")
    def test_recorded_error_body(self) -> None:
        """The recorded context-size error gives ``exceed_context_size_error:400``."""
        obs, _ = _replay("error_context", sse=False)
        assert obs.upstream_error == "exceed_context_size_error:400"


# --------------------------------------------------------------------------------------------
# Token texts that look like keys, bytes kept unread

_CHAT_HEAD = b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"'
_MSG_HEAD = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"'
)
_DIALECT_PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
# token texts that are pieces of the dialects' patterns, quotes, escapes, line breaks
_TEXTS = st.one_of(
    st.sampled_from(
        [
            b" the",
            b"usage",
            b"timings",
            b"tool_calls",
            b"error",
            b"finish_reason",
            b"stop_reason",
            b"message_stop",
            b"code",
            b":",
            b": ",
            b'\\"',
            b"\\",
            b'a"b',
            b"a\nb",
            b"a\rb",
            b"",
            b"[DONE]",
        ]
    ),
    st.binary(max_size=8),
)


def _token_event(kind: str, text: bytes, second: int) -> bytes:
    if kind == "messages":
        return _MSG_HEAD + text + b'"}}\n\n'
    tail = b'"}}],"created":%d,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}'
    return _CHAT_HEAD + text + tail % second + b"\n\n"


_OTHER_EVENTS = st.sampled_from(
    [
        PING,
        DONE,
        b"\n",
        b"id: 7\n",
        b"data: x\n",
        b"data: {}\r\n\r\n",
        role(),
        finish("stop", {"prompt_n": 3, "predicted_n": 2}),
        tool_delta(0, name="f", args="{"),
        chat_event({"content": "plain"}),
    ]
)


def _stream_parts(kind: str) -> st.SearchStrategy[list[bytes]]:
    token = st.builds(lambda t, s: _token_event(kind, t, s), _TEXTS, st.sampled_from([1, 2]))
    plain = st.just(_token_event(kind, b" the", 1))
    return st.lists(st.one_of(plain, plain, token, _OTHER_EVENTS), min_size=1, max_size=24)


def _observe_cut(parts: list[bytes], cuts: list[int], path: str) -> Observation:
    """The stream of ``parts`` cut at ``cuts`` (between parts when ``cuts`` is empty), each
    piece at its own time, through a tracker for the dialect of ``path``."""
    stream = b"".join(parts)
    if cuts:
        pieces = [stream[a:b] for a, b in pairwise([0, *sorted(set(cuts)), len(stream)])]
    else:
        pieces = parts
    dialect = analyse_request("POST", path, b"").dialect
    tracker = StreamTracker(T0, sse=True, dialect=dialect)
    for i, piece in enumerate(pieces):
        tracker.feed(piece, T0 + i + 1.0)
    return tracker.finish()


class TestKeyLikeTextsAndDeferredBytes:
    @settings(max_examples=examples(300), deadline=None)
    @given(st.sampled_from(sorted(_DIALECT_PATHS)), st.data())
    def test_bytes_kept_unread_change_no_observation(self, kind: str, data: st.DataObject) -> None:
        """A tracker that keeps up to ``defer_bytes`` unread (the relay's hot path) observes
        exactly what one reading every chunk at once does, cut anywhere, whatever the limit;
        and mid-stream ``done``, ``bytes_seen`` and ``peek()`` already count what it kept."""
        parts = data.draw(_stream_parts(kind))
        stream = b"".join(parts)
        cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1))))))
        pieces = [stream[a:b] for a, b in pairwise([0, *cuts, len(stream)]) if b > a]
        defer = data.draw(st.sampled_from([1, 50, 300, 64 * 1024]))
        dialect = analyse_request("POST", _DIALECT_PATHS[kind], b"").dialect
        now = StreamTracker(T0, sse=True, dialect=dialect)
        later = StreamTracker(T0, sse=True, dialect=dialect, defer_bytes=defer)
        for i, piece in enumerate(pieces):
            now.feed(piece, T0 + i + 1.0)
            later.feed(piece, T0 + i + 1.0)
            if i % 3 == 1:  # what the relay asks mid-stream
                assert (later.bytes_seen, later.done) == (now.bytes_seen, now.done)
                assert later.peek() == now.peek()
        assert later.finish() == now.finish()

    @pytest.mark.parametrize("text", ["usage", "timings", "tool_calls", "error", ":"])
    def test_text_that_names_a_key_is_one_token(self, text: str) -> None:
        """A token whose whole text is a key the dialect looks for (``"usage"`` as content)
        counts as one token and states nothing else: no counts, no call, no error."""
        chunks = [role(), content("a"), content(text), DONE]
        obs = run_sse(at_one_per_second(chunks))
        assert (obs.events, obs.token_events, obs.last_token_s) == (4, 2, 3.0)
        assert (obs.timings, obs.tool_calls, obs.upstream_error) == (None, (), None)
        assert obs.finish_reason is None and obs.done

    @pytest.mark.parametrize(
        ("text", "read"),
        [
            (b"plain", "plain"),
            (b"a\\nb", "a\nb"),
            (b"\\u00e9", "\u00e9"),
            (b"caf\xc3\xa9", "caf\u00e9"),
            (b"\xff", ""),
            (b"\x01", ""),
            (b"a\\", ""),
            (b"\\x", ""),
        ],
        ids=[
            "plain",
            "escape",
            "u-escape",
            "utf8",
            "bad-utf8",
            "control",
            "lone-backslash",
            "bad-escape",
        ],
    )
    def test_reasoning_text_is_the_json_string(self, text: bytes, read: str) -> None:
        """A reasoning delta's text is its JSON string decoded (escapes, non-ASCII); a delta
        that is no JSON (bad UTF-8, a raw control byte, a broken escape) adds no text. The
        same one event per read and cut inside an event."""
        shaped = reasoning("TEXT")
        parts = [role(), reasoning("first"), shaped.replace(b"TEXT", text), reasoning("last")]
        per_event = _observe_cut(parts, [], "/v1/chat/completions")
        cut = _observe_cut(parts, [len(b"".join(parts[:2])) + 3], "/v1/chat/completions")
        assert per_event.reasoning_text == cut.reasoning_text == f"first{read}last"
        assert (per_event.reasoning_first_s, per_event.reasoning_last_s) == (2.0, 4.0)
        assert per_event.token_events == 3

    def test_reasoning_event_that_is_not_json_is_no_reasoning(self) -> None:
        """An event whose bytes match both the token pattern (``content``) and the reasoning
        one, but that is no JSON, is a token and no reasoning; the observation is the same
        whole and cut anywhere."""
        broken = (
            b'data: {"index":0,"content":".","tokens":[1],"stop":false,'
            b'"id_sl"reasoning_content":"x"d":8}\n\n'
        )
        parts = [role(), broken, content("a"), broken, finish("length"), DONE]
        stream = b"".join(parts)

        def observe(*pieces: bytes) -> Observation:
            tracker = StreamTracker(T0, sse=True)
            for piece in pieces:
                tracker.feed(piece, T0 + 1.0)  # one clock for all: only the cut differs
            return tracker.finish()

        whole = observe(stream)
        for cut in range(1, len(stream)):
            assert observe(stream[:cut], stream[cut:]) == whole, cut
        assert whole.reasoning_text is None and whole.reasoning_first_s is None
        assert whole.token_events == 3


def reasoning(text: str) -> bytes:
    """A Chat Completions reasoning delta, as llama-server streams thinking."""
    return chat_event({"reasoning_content": text})


class TestReasoning:
    """Thinking before the answer or the call: its first and last delta and its text."""

    THOUGHTS = ("The user", " wants the", " weather:", ' "Paris"', " caf\u00e9\n", " call it.")

    def _stream(self) -> list[tuple[float, bytes]]:
        chunks = [
            role(),
            *(reasoning(t) for t in self.THOUGHTS),
            tool_delta(0, name="get_weather", args="", call_id="c1"),
            tool_delta(0, args='{"city": "Paris"}'),
            finish("tool_calls", TIMINGS),
            DONE,
        ]
        return at_one_per_second(chunks)

    def test_reasoning_times_and_text_one_event_per_chunk(self) -> None:
        """Six reasoning deltas, one per chunk (a quoted and an accented one among them):
        first at 2 s, last at 7 s, the text joined exactly."""
        obs = run_sse(self._stream())
        assert (obs.reasoning_first_s, obs.reasoning_last_s) == (2.0, 7.0)
        assert obs.reasoning_text == "".join(self.THOUGHTS)
        assert obs.token_events == 8 and obs.tool_calls[0].name == "get_weather"

    def test_the_same_stream_whole_gives_the_same_reasoning(self) -> None:
        """All of it in one chunk: the same text, every delta at the chunk's time."""
        whole = b"".join(c for _, c in self._stream())
        obs = run_sse([(3.0, whole)])
        assert obs.reasoning_text == "".join(self.THOUGHTS)
        assert obs.reasoning_first_s == obs.reasoning_last_s == 3.0

    def test_no_reasoning_gives_none(self) -> None:
        """A plain answer has no reasoning: None for the times and the text, not 0/''."""
        obs = run_sse(at_one_per_second([role(), content("Hi"), finish(), DONE]))
        assert (obs.reasoning_first_s, obs.reasoning_last_s, obs.reasoning_text) == (
            None,
            None,
            None,
        )

    def test_record_has_reasoning_ms_and_its_share_of_the_call(self) -> None:
        """The record: reasoning_ms = last - first delta (5,000 ms), reasoning_share = that
        over tool_call_ms (the call complete at 9 s)."""
        body = {"messages": [], "tools": [{"type": "function", "function": {"name": "x"}}]}
        facts = analyse_request("POST", "/v1/chat/completions", orjson.dumps(body))
        obs = run_sse(self._stream())
        ex = Exchange("i", "t", "POST", "/v1/chat/completions", 200, Outcome.COMPLETED, 11.0, 1)
        record = build_record(ex, facts, obs)
        assert record.reasoning_ms == 5000.0
        assert record.tool_call_ms == 9000.0
        assert record.reasoning_share == pytest.approx(5 / 9, abs=1e-6)

    def test_messages_and_responses_thinking(self) -> None:
        """Messages thinking_delta events and Responses reasoning_text deltas are reasoning
        too, with their text."""
        messages = analyse_request("POST", "/v1/messages", b"{}").dialect
        thinking = [
            sse_json(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": t},
                }
            )
            for t in ("Let me", " think.")
        ]
        obs = run_sse(at_one_per_second(thinking), dialect=messages)
        assert obs.reasoning_text == "Let me think." and obs.reasoning_first_s == 1.0
        responses = analyse_request("POST", "/v1/responses", b"{}").dialect
        deltas = [
            sse_json({"type": "response.reasoning_text.delta", "delta": t, "item_id": "rs_1"})
            for t in ("Hmm", ", Paris.")
        ]
        obs = run_sse(at_one_per_second(deltas), dialect=responses)
        assert obs.reasoning_text == "Hmm, Paris." and obs.reasoning_last_s == 2.0

    def test_a_reasoning_summary_is_reasoning_and_output_text_is_not(self) -> None:
        """Responses ``reasoning_summary_text`` deltas are reasoning; the output text after
        them is a token but no reasoning (it neither extends the reasoning's times nor its
        text)."""
        responses = analyse_request("POST", "/v1/responses", b"{}").dialect
        deltas = [
            sse_json({"type": f"response.{kind}.delta", "delta": t, "item_id": "rs_1"})
            for kind, t in (
                ("reasoning_summary_text", "Short"),
                ("reasoning_summary_text", " plan."),
                ("output_text", "Paris."),
            )
        ]
        obs = run_sse(at_one_per_second(deltas), dialect=responses)
        assert obs.reasoning_text == "Short plan."
        assert (obs.reasoning_first_s, obs.reasoning_last_s) == (1.0, 2.0)
        assert (obs.token_events, obs.last_token_s) == (3, 3.0)

    def test_a_plain_body_states_its_reasoning(self) -> None:
        """A non-streamed answer's message.reasoning_content is the text (no times)."""
        body = orjson.dumps(
            {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": "ok",
                            "reasoning_content": "thought",
                        }
                    }
                ]
            }
        )
        obs = run_body([(1.0, body)])
        assert obs.reasoning_text == "thought" and obs.reasoning_first_s is None

    def test_reasoning_text_is_bounded(self) -> None:
        """Past MAX_REASONING_BYTES the text is dropped (None) but the times are kept."""
        big = "x" * 4096
        n = MAX_REASONING_BYTES // 4096 + 2
        obs = run_sse(at_one_per_second([reasoning(big) for _ in range(n)]))
        assert obs.reasoning_text is None
        assert obs.reasoning_last_s == float(n)
