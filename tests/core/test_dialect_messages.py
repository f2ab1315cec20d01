"""Tests for the Anthropic Messages dialect (proxy.core.dialects.messages).

The streams are shaped as llama-server sends them (protocol doc §8.6-8.7): ``event:`` +
``data:`` pairs of compact JSON, the first-token batch and the final batch each in one HTTP
chunk, pings as ``:`` comments, no ``[DONE]``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.commands.provision import LlamaServer
from proxy.core.assemble import Exchange, build_record
from proxy.core.dialects.messages import MESSAGES
from proxy.core.record import Outcome, Record, ServerTimings
from proxy.core.request import analyse_request
from proxy.core.tracker import Observation, StreamTracker, ToolCall
from tests.fakes import sse_json

MODEL = "gemma3"


def ev(name: str, data: dict[str, Any]) -> bytes:
    """One event as llama-server writes it on /v1/messages."""
    return sse_json(data, name)


def message_start(uncached: int = 5, cached: int = 216) -> bytes:
    return ev(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "chatcmpl-Qm3",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": MODEL,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "cache_read_input_tokens": cached,
                    "input_tokens": uncached,
                    "output_tokens": 0,
                },
            },
        },
    )


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return ev(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def delta(index: int, kind: str, key: str, value: str) -> bytes:
    return ev(
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": {"type": kind, key: value}},
    )


def text(index: int, value: str) -> bytes:
    return delta(index, "text_delta", "text", value)


def thinking(index: int, value: str) -> bytes:
    return delta(index, "thinking_delta", "thinking", value)


def args(index: int, value: str) -> bytes:
    return delta(index, "input_json_delta", "partial_json", value)


def tool_use(index: int, name: str = "get_weather") -> bytes:
    return block_start(index, {"type": "tool_use", "id": "kJca" + "x" * 28, "name": name})


def block_stop(index: int) -> bytes:
    return ev("content_block_stop", {"type": "content_block_stop", "index": index})


def ending(reason: str, output: int, stop_sequence: str | None = None) -> bytes:
    return ev(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": output},
        },
    ) + ev("message_stop", {"type": "message_stop"})


PING = b":\n\n"
PARIS = ['{"', "city", '":', ' "', "Paris", '"}']
"""A call's argument fragments, one chunk per token."""


def track(chunks: list[bytes], *, sse: bool = True) -> Observation:
    """Feed ``chunks`` to a Messages tracker; chunk ``k`` arrives at ``k + 1`` seconds."""
    clock: Iterator[float] = iter(float(k) for k in range(1, len(chunks) + 1))
    tracker = StreamTracker(0.0, sse=sse, clock=lambda: next(clock), dialect=MESSAGES)
    for chunk in chunks:
        tracker.feed(chunk)
    return tracker.finish()


def call_chunks(index: int, fragments: list[str]) -> list[bytes]:
    """A call's ``content_block_start`` with its first fragment, then one chunk per fragment
    (how llama-server sends them: the name and ``{`` come from one token)."""
    first = tool_use(index) + args(index, fragments[0])
    return [first, *(args(index, f) for f in fragments[1:])]


def counts(uncached: int, cached: int, output: int | None) -> ServerTimings:
    return ServerTimings(prompt_n=uncached, cache_n=cached, predicted_n=output)


class TestStream:
    def test_text_reply(self) -> None:
        """Every text_delta is a token event (the first arrives with message_start), the ping
        and the lifecycle events are not; end_turn is "stop"; the counts come from
        message_start and message_delta, and there are no server times; no [DONE]."""
        obs = track(
            [
                message_start() + block_start(0, {"type": "text", "text": ""}) + text(0, "Hi"),
                PING,
                text(0, " there"),
                text(0, "!"),
                block_stop(0) + ending("end_turn", 4),
            ]
        )
        assert obs.token_events == 3
        assert (obs.first_token_s, obs.last_token_s) == (1.0, 4.0)
        assert obs.events == 8
        assert obs.finish_reason == "stop"
        assert obs.timings == counts(5, 216, 4)  # prompt_ms and predicted_ms: None
        assert obs.tool_calls == () and obs.tool_call_s is None
        assert obs.done  # message_stop ends a complete stream
        assert obs.upstream_error is None and obs.analysis_error is None

    def test_reasoning_then_text(self) -> None:
        """thinking_delta and text_delta events are both token events; the final batch's
        signature_delta and block stops are not. Only the thinking deltas are reasoning."""
        obs = track(
            [
                message_start(41, 0)
                + block_start(0, {"type": "thinking", "thinking": ""})
                + thinking(0, "The user"),
                thinking(0, " greets."),
                block_start(1, {"type": "text", "text": ""}) + text(1, "Hello"),
                delta(0, "signature_delta", "signature", "")
                + block_stop(0)
                + block_stop(1)
                + ending("end_turn", 6),
            ]
        )
        assert obs.token_events == 3
        assert (obs.first_token_s, obs.last_token_s) == (1.0, 3.0)
        assert (obs.reasoning_first_s, obs.reasoning_last_s) == (1.0, 2.0)
        assert obs.reasoning_text == "The user greets."
        assert obs.finish_reason == "stop"
        assert obs.timings == counts(41, 0, 6)
        assert obs.tool_calls == ()

    def test_single_tool_call(self) -> None:
        """A tool_use block start (the name) and each input_json_delta are tool-call events:
        the first token is the name's chunk, not message_start (whose first token gave no
        delta); the fragments join to the arguments; tool_use is "tool_calls"."""
        obs = track(
            [
                message_start(5, 216),
                *call_chunks(0, ["{", '"', "city", '":', ' "', "Paris", '"', "}"]),
                block_stop(0) + ending("tool_use", 30),
            ]
        )
        assert obs.tool_calls == (ToolCall(0, "get_weather", '{"city": "Paris"}'),)
        assert obs.token_events == 9  # the block start and eight fragments
        assert (obs.first_token_s, obs.last_token_s) == (2.0, 9.0)
        assert obs.tool_call_s == 9.0
        assert obs.finish_reason == "tool_calls"
        assert obs.timings == counts(5, 216, 30)
        assert obs.done

    def test_two_tool_calls(self) -> None:
        """Two tool_use blocks (indexes 0 and 1) give two calls in order, each with its own
        fragments."""
        obs = track(
            [
                message_start(),
                *call_chunks(0, PARIS),
                *call_chunks(1, ['{"', "city", '":', ' "', "Rome", '"}']),
                block_stop(0) + block_stop(1) + ending("tool_use", 40),
            ]
        )
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", '{"city": "Paris"}'),
            ToolCall(1, "get_weather", '{"city": "Rome"}'),
        )
        assert obs.token_events == 14
        assert obs.tool_call_s == 13.0 == obs.last_token_s
        assert obs.finish_reason == "tool_calls"

    def test_text_then_a_call(self) -> None:
        """A call after a text block is assembled from its own block's events only: the
        text deltas stay tokens, not arguments."""
        obs = track(
            [
                message_start() + block_start(0, {"type": "text", "text": ""}) + text(0, "Ok."),
                *call_chunks(1, PARIS),
                block_stop(0) + block_stop(1) + ending("tool_use", 12),
            ]
        )
        assert [(c.name, c.arguments) for c in obs.tool_calls] == [
            ("get_weather", '{"city": "Paris"}')
        ]
        assert obs.token_events == 8
        assert obs.first_token_s == 1.0 and obs.tool_call_s == 7.0
        assert obs.finish_reason == "tool_calls"

    def test_cut_off_by_the_token_limit(self) -> None:
        """max_tokens is "length", even when calls were parsed (the doc's real three-call
        stream ending at max_tokens 64)."""
        obs = track(
            [
                message_start(),
                *call_chunks(0, PARIS),
                *call_chunks(1, PARIS),
                *call_chunks(2, PARIS),
                block_stop(0) + block_stop(1) + block_stop(2) + ending("max_tokens", 64),
            ]
        )
        assert len(obs.tool_calls) == 3
        assert {c.arguments for c in obs.tool_calls} == {'{"city": "Paris"}'}
        assert obs.finish_reason == "length"
        assert obs.timings == counts(5, 216, 64)

    def test_cut_off_inside_call_markup(self) -> None:
        """A turn cut off inside tool-call markup has no blocks: no token events, no calls,
        "length", and the counts."""
        obs = track([message_start(), ending("max_tokens", 64)])
        assert obs.token_events == 0 and obs.first_token_s is None
        assert obs.tool_calls == () and obs.tool_call_s is None
        assert obs.finish_reason == "length"
        assert obs.timings == counts(5, 216, 64)

    def test_stop_word(self) -> None:
        """A stop word ends the turn with end_turn and the stop_sequence: "stop"."""
        obs = track(
            [
                message_start() + block_start(0, {"type": "text", "text": ""}) + text(0, "Tell"),
                block_stop(0) + ending("end_turn", 2, stop_sequence=" me"),
            ]
        )
        assert obs.finish_reason == "stop"

    def test_mid_stream_error(self) -> None:
        """An ``event: error`` after some text ends the stream without message_delta: the
        tokens before it count, the finish reason and output count stay unknown (not the
        placeholder 0 of message_start), and the analysis goes on without failing."""
        error = {"code": 500, "message": "Compute error.", "type": "server_error"}
        obs = track(
            [
                message_start() + block_start(0, {"type": "text", "text": ""}) + text(0, "Hi"),
                text(0, " the"),
                sse_json(error, "error"),
            ]
        )
        assert obs.token_events == 2 and obs.last_token_s == 2.0
        assert obs.finish_reason is None
        assert obs.timings == counts(5, 216, None)
        assert not obs.done and obs.analysis_error is None

    def test_mid_stream_error_is_recorded(self) -> None:
        """The unwrapped mid-stream error is the upstream error of the response."""
        error = {"code": 500, "message": "Compute error.", "type": "server_error"}
        obs = track([message_start(), sse_json(error, "error")])
        assert obs.upstream_error == "server_error:500"


def body(content: list[dict[str, Any]], reason: str, output: int) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-Qm3",
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": MODEL,
            "stop_reason": reason,
            "stop_sequence": None,
            "usage": {"cache_read_input_tokens": 216, "input_tokens": 5, "output_tokens": output},
        }
    )


class TestBody:
    def test_text_body(self) -> None:
        """A non-streamed text reply: counts from usage, end_turn is "stop", no calls, no
        token events, the model from the body."""
        data = body([{"type": "text", "text": "Hello!"}], "end_turn", 3)
        obs = track([data[:40], data[40:]], sse=False)
        assert obs.timings == counts(5, 216, 3)
        assert obs.finish_reason == "stop"
        assert obs.tool_calls == () and obs.tool_call_s is None
        assert obs.token_events == 0 and obs.model == MODEL

    def test_tool_body(self) -> None:
        """A body's tool_use blocks (after thinking and text) are calls 0 and 1, their
        arguments the compact JSON of ``input``; the call time is the body's last byte."""
        data = body(
            [
                {"type": "thinking", "thinking": "Weather.", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "a" * 32, "name": "get_weather", "input": {"city": "P"}},
                {"type": "tool_use", "id": "b" * 32, "name": "get_time", "input": {}},
            ],
            "tool_use",
            40,
        )
        obs = track([data[:100], data[100:]], sse=False)
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", '{"city":"P"}'),
            ToolCall(1, "get_time", "{}"),
        )
        assert obs.tool_call_s == 2.0
        assert obs.finish_reason == "tool_calls"
        assert obs.timings == counts(5, 216, 40)

    def test_limit_body(self) -> None:
        """A body cut off at max_tokens is "length"."""
        obs = track([body([{"type": "text", "text": "a b"}], "max_tokens", 2)], sse=False)
        assert obs.finish_reason == "length"

    def test_error_body(self) -> None:
        """llama-server's error body on /v1/messages is the wrapped ``{"error": …}`` that the
        tracker reads itself."""
        data = b'{"error":{"code":500,"message":"x","type":"server_error"}}'
        obs = track([data], sse=False)
        assert obs.upstream_error == "server_error:500"
        assert obs.tool_calls == () and obs.timings is None and obs.finish_reason is None


# --- a turn cut by its token limit: the record ---------------------------------------------
# llama-server's shapes for a get_weather call with max_tokens 22 (seen: the fragments stop at
# `{"city": "Paris`, stop_reason max_tokens, output_tokens 22; the body's input is {}).

CUT = ["{", '"', "city", '":', ' "', "Paris"]
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def tool_request(limit: int, *, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": limit,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "stop_sequences": ["</tool_call>"],
        "stream": stream,
    }


def record_of(body: dict[str, Any], chunks: list[bytes], *, sse: bool = True) -> Record:
    """The record of ``chunks`` answering ``body`` on /v1/messages, as the relay builds it."""
    raw = orjson.dumps(body)
    facts = analyse_request("POST", "/v1/messages", raw)
    obs = track(chunks, sse=sse)
    exchange = Exchange("r", "t", "POST", "/v1/messages", 200, Outcome.COMPLETED, 9.0, len(raw))
    return build_record(exchange, facts, obs)


def use(input_: dict[str, Any], name: str = "get_weather") -> dict[str, Any]:
    return {"type": "tool_use", "id": "cYjv" + "x" * 28, "name": name, "input": input_}


class TestTokenLimit:
    def test_a_streamed_call_cut_inside_its_arguments_is_truncated(self) -> None:
        """Fragments stopping at `{"city": "Paris`, then max_tokens at 22 of 22: "length",
        truncated, not valid."""
        chunks = [message_start(), *call_chunks(0, CUT), block_stop(0) + ending("max_tokens", 22)]
        r = record_of(tool_request(22), chunks)
        cut = ("length", True, False)
        assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == cut
        assert (r.tool_calls, r.predicted_n, r.tool_call_tokens) == (1, 22, None)

    def test_a_body_cut_inside_the_call_is_truncated(self) -> None:
        """Not streamed, llama-server writes ``input: {}`` for the cut arguments: the call
        is the ``{}`` the agent got (valid JSON), and the turn, ended by max_tokens with that
        last call, is truncated inside it."""
        data = body([use({})], "max_tokens", 22)
        r = record_of(tool_request(22, stream=False), [data], sse=False)
        assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == ("length", True, True)
        assert track([data], sse=False).tool_calls == (ToolCall(0, "get_weather", "{}"),)

    def test_a_whole_call_is_untouched(self) -> None:
        """The same call with tokens to spare (stream and body, tool_use): "tool_calls", not
        truncated, valid."""
        whole = ['{"', "city", '":', ' "', "Paris", '"}']
        chunks = [message_start(), *call_chunks(0, whole), block_stop(0) + ending("tool_use", 30)]
        streamed = record_of(tool_request(100), chunks)
        data = body([use({"city": "Paris"})], "tool_use", 30)
        whole_body = record_of(tool_request(100, stream=False), [data], sse=False)
        for r in (streamed, whole_body):
            assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == (
                "tool_calls",
                False,
                True,
            )
            assert r.tool_call_tokens == 30

    def test_whole_calls_then_the_limit_are_not_truncated(self) -> None:
        """Calls whose inputs are whole when max_tokens ends the turn (the model was
        writing markup after them) stay valid and not truncated; an empty input before the
        last call is no cut (only the last call can have been cut)."""
        data = body([use({}, "get_time"), use({"city": "Paris"})], "max_tokens", 64)
        request = tool_request(64, stream=False)
        request["tools"] = [*request["tools"], {"name": "get_time", "input_schema": {}}]
        r = record_of(request, [data], sse=False)
        assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == (
            "length",
            False,
            True,
        )
        obs = track([data], sse=False)
        assert obs.tool_calls == (
            ToolCall(0, "get_time", "{}"),
            ToolCall(1, "get_weather", '{"city":"Paris"}'),
        )
        assert not obs.call_cut

    def test_an_empty_input_the_model_meant_is_no_cut(self) -> None:
        """A last call with ``input: {}`` in a turn that ended by tool_use (a tool without
        arguments) is no cut call."""
        data = body([use({"city": "Paris"}), use({}, "get_time")], "tool_use", 40)
        assert not track([data], sse=False).call_cut
        assert not MESSAGES.body_call_cut(orjson.loads(body([use({})], "end_turn", 9)))
        assert MESSAGES.body_call_cut(orjson.loads(body([use({})], "max_tokens", 9)))


class TestReaders:
    def test_paths(self) -> None:
        """Only /v1/messages (a trailing slash allowed) is Messages: not the counting
        endpoint, not /messages, not chat; only POST is a turn that carries tools."""
        assert MESSAGES.name == "messages"
        assert MESSAGES.handles("/v1/messages") and MESSAGES.handles("/v1/messages/")
        for path in ("/v1/messages/count_tokens", "/messages", "/v1/chat/completions"):
            assert not MESSAGES.handles(path)
        assert MESSAGES.tool_request("POST", "/v1/messages")
        assert not MESSAGES.tool_request("GET", "/v1/messages")
        assert not MESSAGES.tool_request("POST", "/v1/messages/count_tokens")

    def test_tool_names(self) -> None:
        """Tool names are tools[].name, server tools included; malformed entries are skipped."""
        tools = [
            {"name": "get_weather", "description": "d", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
            {"function": {"name": "chat_shape"}},
            {"name": 3},
            "x",
        ]
        assert MESSAGES.tool_names(tools) == frozenset({"get_weather", "web_search"})
        assert MESSAGES.tool_names({"name": "x"}) == frozenset()

    def test_token_pattern(self) -> None:
        """The token pattern matches non-empty text and thinking deltas and no lifecycle,
        signature, argument or error event."""
        tokens = [text(0, "a"), thinking(0, "b"), text(1, '"')]
        others = [
            message_start(),
            block_start(0, {"type": "text", "text": ""}),
            block_start(0, {"type": "thinking", "thinking": ""}),
            tool_use(0),
            args(0, "{"),
            delta(0, "signature_delta", "signature", ""),
            text(0, ""),
            args(0, 'x "text_delta","text":"y'),
            block_stop(0),
            ending("end_turn", 3),
            b'{"code":500,"message":"text_delta","type":"server_error"}',
        ]
        assert all(MESSAGES.token.search(e) for e in tokens)
        assert not any(MESSAGES.token.search(e) for e in others)

    def test_interesting_pattern(self) -> None:
        """The events with counts, calls, a stop reason or an error are parsed; text deltas
        and block stops are not."""
        read = [message_start(), tool_use(2), args(0, "{"), ending("end_turn", 1)]
        read += [b'{"code":500,"message":"m","type":"server_error"}']
        skipped = [text(0, "usage"), thinking(0, "x"), block_stop(0)]
        assert all(MESSAGES.interesting.search(e) for e in read)
        assert not any(MESSAGES.interesting.search(e) for e in skipped)

    def test_stop_reasons(self) -> None:
        """end_turn and stop_sequence are "stop", max_tokens "length", tool_use "tool_calls";
        another or a missing reason is none (never invented)."""
        read = MESSAGES.finish_reasons
        for reason, expected in [
            ("end_turn", ["stop"]),
            ("stop_sequence", ["stop"]),
            ("max_tokens", ["length"]),
            ("tool_use", ["tool_calls"]),
            ("pause_turn", []),
        ]:
            assert read({"type": "message_delta", "delta": {"stop_reason": reason}}) == expected
            assert read({"stop_reason": reason}) == expected
        assert read({"type": "message_start", "message": {"stop_reason": None}}) == []
        assert read({"type": "message_delta", "delta": None}) == []

    def test_stream_fragments_are_keyed_by_block_index(self) -> None:
        """A tool_use block start gives (block index, name, None), an input_json_delta
        (block index, None, fragment); text blocks and other events give None."""
        read = MESSAGES.tool_reader()
        call = {"type": "tool_use", "id": "i", "name": "go"}
        start = {"type": "content_block_start", "index": 2, "content_block": call}
        assert read(start) == [(2, "go", None)]
        part = {"type": "input_json_delta", "partial_json": "{"}
        assert read({"type": "content_block_delta", "index": 2, "delta": part}) == [(2, None, "{")]
        text_start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
        assert read(text_start) is None
        word = {"type": "text_delta", "text": "a"}
        assert read({"type": "content_block_delta", "index": 0, "delta": word}) is None
        assert read({"type": "message_stop"}) is None

    def test_odd_input_is_read_without_raising(self) -> None:
        """Wrong types give no fragment fields, no counts, no calls, never an exception."""
        read = MESSAGES.tool_reader()
        block = {"type": "tool_use", "name": ""}
        odd = {"type": "content_block_start", "index": True, "content_block": block}
        assert read(odd) == [(0, None, None)]
        assert read({"type": "content_block_start", "content_block": [1]}) is None
        assert read({"type": "content_block_delta", "delta": "x"}) is None
        bad_part = {"type": "input_json_delta", "partial_json": 3}
        assert read({"type": "content_block_delta", "delta": bad_part}) == [(0, None, None)]
        assert MESSAGES.usage({"usage": [1]}) is None
        assert MESSAGES.usage({"type": "message_start", "message": 3}) is None
        bad = {"input_tokens": -1, "cache_read_input_tokens": "2", "output_tokens": True}
        assert MESSAGES.usage({"usage": bad}) == ServerTimings()
        assert MESSAGES.body_tool_calls({"content": {"type": "tool_use"}}) is None
        assert MESSAGES.body_tool_calls({"content": [1, {"type": "text"}]}) is None
        deep: Any = {}
        for _ in range(300):  # deeper than orjson will serialise
            deep = {"a": deep}
        calls = [{"type": "tool_use", "name": "n", "input": deep}, {"type": "tool_use"}]
        assert MESSAGES.body_tool_calls({"content": calls}) == [(0, "n", None), (1, None, None)]

    def test_usage(self) -> None:
        """message_start gives the prompt counts only (its output_tokens 0 is a
        placeholder); message_delta the output count; a body all three;
        cache_creation_input_tokens, where an upstream sends it, is uncached prompt."""
        start = {
            "type": "message_start",
            "message": {
                "usage": {"cache_read_input_tokens": 9, "input_tokens": 4, "output_tokens": 0}
            },
        }
        assert MESSAGES.usage(start) == ServerTimings(prompt_n=4, cache_n=9)
        end = {"type": "message_delta", "usage": {"output_tokens": 7}}
        assert MESSAGES.usage(end) == ServerTimings(predicted_n=7)
        full = {"cache_read_input_tokens": 9, "input_tokens": 4, "output_tokens": 7}
        assert MESSAGES.usage({"usage": full}) == counts(4, 9, 7)
        created = {"input_tokens": 4, "cache_creation_input_tokens": 3}
        assert MESSAGES.usage({"usage": created}) == ServerTimings(prompt_n=7)


# ---------------------------------------------------------------------------------------
# The real llama-server

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
    },
}
COMMON: dict[str, Any] = {
    "temperature": 0,
    "stream": True,
    "chat_template_kwargs": {"enable_thinking": False},
}
TOOL_REQUEST: dict[str, Any] = {
    **COMMON,
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [WEATHER],
    "max_tokens": 64,
    "stop_sequences": ["</tool_call>"],  # Messages drops parallel_tool_calls (§8.5)
}
TEXT_REQUEST: dict[str, Any] = {
    **COMMON,
    "messages": [{"role": "user", "content": "Say hello in three words."}],
    "max_tokens": 16,
}


@dataclass
class Reference:
    """What a tiny independent parse finds in the received bytes."""

    usage: ServerTimings
    finish: str | None
    calls: list[tuple[str, str]]
    token_times: list[float]
    call_times: list[float]


def reference(chunks: list[tuple[float, bytes]]) -> Reference:
    """Split the joined bytes on blank lines, time each event by the chunk holding its end,
    and read the Messages events by hand."""
    ends, total = [], 0
    for at, chunk in chunks:
        total += len(chunk)
        ends.append((total, at))
    raw = b"".join(c for _, c in chunks)
    prompt: dict[str, Any] = {}
    output, finish = None, None
    calls: dict[int, list[str]] = {}
    token_times: list[float] = []
    call_times: list[float] = []
    pos = 0
    while (cut := raw.find(b"\n\n", pos)) >= 0:
        block, pos = raw[pos:cut], cut + 2
        at = next(t for end, t in ends if end >= cut + 2)
        data = [line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")]
        if not data:
            continue
        obj = orjson.loads(data[0])
        kind = obj.get("type")
        if kind == "message_start":
            prompt = obj["message"]["usage"]
        elif kind == "message_delta":
            output, finish = obj["usage"]["output_tokens"], obj["delta"]["stop_reason"]
        elif kind == "content_block_start" and obj["content_block"]["type"] == "tool_use":
            calls[obj["index"]] = [obj["content_block"]["name"]]
            call_times.append(at)
        elif kind == "content_block_delta":
            d = obj["delta"]
            if d["type"] == "input_json_delta":
                calls[obj["index"]].append(d["partial_json"])
                call_times.append(at)
            elif d["type"] in ("text_delta", "thinking_delta"):
                token_times.append(at)
    mapped = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls"}
    return Reference(
        usage=ServerTimings(
            prompt_n=prompt.get("input_tokens"),
            cache_n=prompt.get("cache_read_input_tokens"),
            predicted_n=output,
        ),
        finish=mapped.get(finish) if finish else None,
        calls=[(parts[0], "".join(parts[1:])) for _, parts in sorted(calls.items())],
        token_times=token_times,
        call_times=call_times,
    )


async def receive(url: str, request: dict[str, Any]) -> tuple[float, list[tuple[float, bytes]]]:
    """POST ``request`` and keep every received chunk with its arrival time."""
    chunks: list[tuple[float, bytes]] = []
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        async with session.post(url + "/v1/messages", json=request) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            async for chunk in resp.content.iter_any():
                chunks.append((time.perf_counter(), chunk))
    return t0, chunks


def replay(t0: float, chunks: list[tuple[float, bytes]]) -> Observation:
    """The tracker's observation of the received chunks, at their arrival times."""
    times = iter(at for at, _ in chunks)
    tracker = StreamTracker(t0, sse=True, clock=lambda: next(times), dialect=MESSAGES)
    for _, chunk in chunks:
        tracker.feed(chunk)
    return tracker.finish()


@pytest.mark.real
async def test_real_streams_match_their_own_bytes(llama_server: LlamaServer) -> None:
    """Against the real llama-server, a streamed tool turn and a streamed text turn on
    /v1/messages: the tracker's counts, calls, finish reason, token and call times equal
    what an independent parse finds in the very bytes received, and no server times."""
    for request, with_calls in ((TOOL_REQUEST, True), (TEXT_REQUEST, False)):
        t0, chunks = await receive(llama_server.url, request)
        obs = replay(t0, chunks)
        ref = reference(chunks)
        assert obs.analysis_error is None and obs.upstream_error is None
        assert obs.timings == ref.usage
        assert ref.usage.prompt_n is not None and ref.usage.predicted_n is not None
        assert obs.finish_reason == ref.finish is not None
        assert [(c.name, c.arguments) for c in obs.tool_calls] == ref.calls
        assert [c.index for c in obs.tool_calls] == list(range(len(ref.calls)))
        assert bool(ref.calls) is with_calls
        for name, arguments in ref.calls:
            assert name == "get_weather" and isinstance(orjson.loads(arguments), dict)
        token_times = sorted(ref.token_times + ref.call_times)
        assert obs.token_events == len(token_times) > 0
        assert obs.first_token_s == token_times[0] - t0
        assert obs.last_token_s == token_times[-1] - t0
        assert obs.tool_call_s == (ref.call_times[-1] - t0 if ref.call_times else None)
        assert obs.done == any(b'"message_stop"' in chunk for _, chunk in chunks)
