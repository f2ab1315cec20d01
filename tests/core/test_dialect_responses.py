"""Tests for proxy.core.dialects.responses: the Responses API's events and bodies, read by the
tracker exactly as llama-server sends them (protocol doc section 8.3/8.4)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from proxy.commands.provision import LlamaServer
from proxy.core.assemble import Exchange, build_record
from proxy.core.dialects import Dialect
from proxy.core.dialects.responses import RESPONSES, new_call_reader
from proxy.core.record import Outcome, Record, ServerTimings
from proxy.core.request import analyse_request
from proxy.core.tracker import Observation, StreamTracker, ToolCall
from tests.fakes import sse_json, typed_event

FC = "fc_CkQlX2"
FC2 = "fc_Zr8mQ1"
MSG = "msg_88Lc"
RS = "rs_4fTq"
RESP = {"id": "resp_0VKb", "object": "response", "status": "in_progress"}
TIMINGS = {
    "cache_n": 216,
    "prompt_n": 5,
    "prompt_ms": 120.5,
    "predicted_n": 30,
    "predicted_ms": 900.25,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def start() -> bytes:
    return typed_event({"type": "response.created", "response": RESP}) + typed_event(
        {"type": "response.in_progress", "response": RESP}
    )


def text_item(item_id: str = MSG) -> bytes:
    item = {"content": [], "id": item_id, "role": "assistant", "status": "in_progress"}
    return typed_event(
        {"type": "response.output_item.added", "item": {**item, "type": "message"}}
    ) + typed_event(
        {
            "type": "response.content_part.added",
            "item_id": item_id,
            "part": {"type": "output_text", "text": ""},
        }
    )


def reasoning_item() -> bytes:
    item = {"id": RS, "summary": [], "type": "reasoning", "content": []}
    item |= {"encrypted_content": "", "status": "in_progress"}
    return typed_event({"type": "response.output_item.added", "item": item})


def text(delta: str, item_id: str = MSG) -> bytes:
    return typed_event({"type": "response.output_text.delta", "item_id": item_id, "delta": delta})


def thought(delta: str) -> bytes:
    return typed_event({"type": "response.reasoning_text.delta", "delta": delta, "item_id": RS})


def call_item(
    item_id: str, name: str, arguments: str = "", status: str = "in_progress"
) -> dict[str, Any]:
    call_id = "call_" + item_id[3:]
    return {
        "id": item_id,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "status": status,
    }


def call_added(item_id: str, name: str) -> bytes:
    return typed_event({"type": "response.output_item.added", "item": call_item(item_id, name)})


def args(delta: str, item_id: str = FC) -> bytes:
    return typed_event(
        {"type": "response.function_call_arguments.delta", "delta": delta, "item_id": item_id}
    )


def call_done(item_id: str, name: str, arguments: str) -> bytes:
    item = call_item(item_id, name, arguments, "completed")
    return typed_event({"type": "response.output_item.done", "item": item})


def text_done(full: str) -> bytes:
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": full}
    item = {"type": "message", "status": "completed", "id": MSG, "content": [part]}
    return (
        typed_event({"type": "response.output_text.done", "item_id": MSG, "text": full})
        + typed_event({"type": "response.content_part.done", "item_id": MSG, "part": part})
        + typed_event({"type": "response.output_item.done", "item": {**item, "role": "assistant"}})
    )


def usage(prompt: int = 221, cached: int = 216, output: int = 30) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "output_tokens": output,
        "total_tokens": prompt + output,
        "input_tokens_details": {"cached_tokens": cached},
    }


def completed(output: list[dict[str, Any]], **fields: Any) -> bytes:
    response = {**RESP, "created_at": 1, "status": "completed", "model": "gemma3"}
    response |= {"output": output, "usage": usage()} | fields
    return typed_event({"type": "response.completed", "response": response, "timings": TIMINGS})


def per_stream() -> Dialect:
    """The dialect as a response's tracker gets it (the tracker makes its own call reader)."""
    return RESPONSES


def observe(
    chunks: list[bytes], dialect: Dialect | None = None, *, sse: bool = True
) -> Observation:
    """Feed each HTTP chunk at its own second (1, 2, …) and finish."""
    clock = iter(range(1, len(chunks) + 2))
    tracker = StreamTracker(
        0.0, sse=sse, clock=lambda: float(next(clock)), dialect=dialect or per_stream()
    )
    for chunk in chunks:
        tracker.feed(chunk)
    return tracker.finish()


SERVER_TIMINGS = ServerTimings.from_json(TIMINGS)
CALL = call_item(FC, "get_weather", '{"city": "Paris"}', "completed")


class TestChoice:
    def test_paths(self) -> None:
        """Both generation routes (trailing slash allowed) are Responses; the counting routes
        and Chat Completions are not."""
        assert RESPONSES.name == "responses"
        assert RESPONSES.handles("/v1/responses") and RESPONSES.handles("/responses/")
        for other in (
            "/v1/responses/input_tokens",
            "/responses/input_tokens",
            "/v1/chat/completions",
        ):
            assert not RESPONSES.handles(other)

    def test_tool_request_is_a_post_to_a_generation_route(self) -> None:
        """Only a POST to a generation route is a model turn that can carry tools."""
        assert RESPONSES.tool_request("POST", "/v1/responses")
        assert not RESPONSES.tool_request("GET", "/v1/responses")
        assert not RESPONSES.tool_request("POST", "/v1/responses/input_tokens")

    def test_tool_names_are_flat_function_entries(self) -> None:
        """Names come from flat {"type": "function", "name"} tools; other types (which
        llama-server drops), nested Chat Completions entries and junk are skipped."""
        tools = [
            WEATHER,
            {"type": "web_search"},
            {"type": "function", "function": {"name": "nested"}},
            {"type": "function", "name": 3},
            "x",
        ]
        assert RESPONSES.tool_names(tools) == frozenset({"get_weather"})
        assert RESPONSES.tool_names({"name": "x"}) == frozenset()


LIFECYCLE = [
    start(),
    text_item(),
    reasoning_item(),
    text_done("Hello"),
    call_done(FC, "get_weather", "{}"),
    completed([CALL]),
]


def data_lines(raw: bytes) -> list[bytes]:
    """The data of every event in ``raw``."""
    return [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("raw", LIFECYCLE)
def test_lifecycle_events_are_no_tokens(raw: bytes) -> None:
    """created, in_progress, item/part added and every .done or completed event never match
    the token pattern, even when they repeat the whole text."""
    for data in data_lines(raw):
        assert RESPONSES.token.search(data) is None


def test_deltas_are_tokens() -> None:
    """Text and reasoning deltas match the token pattern; argument deltas are tool-call
    events through the reader instead, and are parsed (they match ``interesting``)."""
    for data in data_lines(text("Hi") + thought("Hm")):
        assert RESPONSES.token.search(data) is not None
    for data in data_lines(args("{") + call_added(FC, "f")):
        assert RESPONSES.interesting.search(data) is not None


class TestStream:
    def test_text_reply(self) -> None:
        """A text reply: the first token is the first output_text delta (not response.created
        in the same chunk), the last is the last delta (not the final batch's .done events),
        no calls, no finish reason (status "completed" says nothing), timings from the final
        event's sibling ``timings``; without [DONE] the stream is not marked done."""
        obs = observe(
            [
                start() + text_item() + text("Hello"),
                text(" there"),
                text("!"),
                text_done("Hello there!") + completed([]),
            ]
        )
        assert (obs.token_events, obs.first_token_s, obs.last_token_s) == (3, 1.0, 3.0)
        assert obs.tool_calls == () and obs.tool_call_s is None
        assert obs.finish_reason is None
        assert obs.timings == SERVER_TIMINGS
        assert obs.upstream_error is None and obs.analysis_error is None
        assert obs.done  # response.completed ends a complete stream

    def test_reasoning_then_text(self) -> None:
        """Reasoning deltas are token events as text deltas are: the first token is the first
        reasoning delta, the last the last text delta; only the reasoning deltas are
        reasoning."""
        obs = observe(
            [
                start() + reasoning_item() + thought("Let"),
                thought(" me see."),
                text_item() + text("Yes"),
                text("."),
                text_done("Yes.") + completed([]),
            ]
        )
        assert (obs.token_events, obs.first_token_s, obs.last_token_s) == (4, 1.0, 4.0)
        assert (obs.reasoning_first_s, obs.reasoning_last_s) == (1.0, 2.0)
        assert obs.reasoning_text == "Let me see."
        assert obs.finish_reason is None and obs.tool_calls == ()

    def test_single_tool_call(self) -> None:
        """A tool call as the doc shows it: the name-bearing output_item.added and every
        arguments delta are tool-call events (hence token events); the call is index 0 with
        the concatenated arguments; the final .done that agrees with them is no event of the
        call (tool_call_s stays at the last delta); finish reason tool_calls."""
        pieces = ['"', "city", '":', ' "', "Paris", '"', "}"]
        obs = observe(
            [start(), call_added(FC, "get_weather") + args("{")]
            + [args(p) for p in pieces]
            + [call_done(FC, "get_weather", '{"city": "Paris"}') + completed([CALL])]
        )
        assert obs.tool_calls == (ToolCall(0, "get_weather", '{"city": "Paris"}'),)
        assert obs.token_events == 2 + len(pieces)
        assert (obs.first_token_s, obs.last_token_s, obs.tool_call_s) == (2.0, 9.0, 9.0)
        assert obs.finish_reason == "tool_calls"
        assert obs.timings == SERVER_TIMINGS

    def test_two_tool_calls_are_numbered_in_order_of_appearance(self) -> None:
        """Two calls get indices 0 and 1 in the order their items were added, each with its
        own argument fragments (keyed by item_id)."""
        second = call_item(FC2, "move_arm", '{"x": 1}', "completed")
        obs = observe(
            [
                start() + call_added(FC, "get_weather") + args("{"),
                args('"city": "Rome"}'),
                call_added(FC2, "move_arm") + args("{", FC2),
                args('"x": 1}', FC2),
                call_done(FC, "get_weather", '{"city": "Rome"}')
                + call_done(FC2, "move_arm", '{"x": 1}')
                + completed([CALL, second]),
            ]
        )
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", '{"city": "Rome"}'),
            ToolCall(1, "move_arm", '{"x": 1}'),
        )
        assert (obs.token_events, obs.tool_call_s, obs.finish_reason) == (6, 4.0, "tool_calls")

    def test_done_completes_arguments_the_deltas_lacked(self) -> None:
        """Arguments only the final re-parse produced appear in the .done item, never as a
        delta: the missing suffix is added, so the call's arguments equal the .done item's,
        and that .done event is a tool-call event (it carried new call text)."""
        obs = observe(
            [
                start() + call_added(FC, "get_weather") + args("{"),
                args('"city": "Par'),
                call_done(FC, "get_weather", '{"city": "Paris"}') + completed([CALL]),
            ]
        )
        assert obs.tool_calls == (ToolCall(0, "get_weather", '{"city": "Paris"}'),)
        assert (obs.token_events, obs.last_token_s, obs.tool_call_s) == (4, 3.0, 3.0)

    def test_a_call_seen_only_in_its_done_item_is_counted(self) -> None:
        """A call the stream never announced (re-parse output only) is taken whole from its
        .done item, after the announced ones."""
        obs = observe(
            [
                start() + call_added(FC, "get_weather") + args("{}"),
                call_done(FC, "get_weather", "{}") + call_done(FC2, "move_arm", '{"x": 1}'),
            ]
        )
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", "{}"),
            ToolCall(1, "move_arm", '{"x": 1}'),
        )

    def test_rewritten_arguments_keep_the_streamed_text(self) -> None:
        """When the .done arguments do not extend the streamed text (a rewrite), fragments
        cannot replace it: the streamed text stays and .done is no tool-call event."""
        reader = new_call_reader()
        assert reader({"type": "response.output_item.added", "item": call_item(FC, "f")})
        assert reader(
            {"type": "response.function_call_arguments.delta", "delta": "{'a'", "item_id": FC}
        )
        done = {"type": "response.output_item.done", "item": call_item(FC, "f", '{"a": 1}')}
        assert reader(done) is None

    def test_token_limit_cut(self) -> None:
        """A text turn cut by max_output_tokens: llama-server still says status "completed",
        so the finish reason stays unknown (None), never an invented "stop"; the counts are
        the final event's."""
        final = completed([], usage=usage(prompt=37, cached=1, output=3))
        obs = observe(
            [start() + text_item() + text("<"), text("|"), text("im") + text_done("<|im") + final]
        )
        assert (obs.token_events, obs.last_token_s, obs.finish_reason) == (3, 3.0, None)
        assert obs.timings == SERVER_TIMINGS

    def test_cut_inside_tool_markup_has_no_calls(self) -> None:
        """A turn cut inside tool-call markup has output [] and no item events: no call and no
        finish reason."""
        obs = observe([start(), completed([])])
        assert (obs.tool_calls, obs.finish_reason, obs.token_events) == ((), None, 0)

    def test_mid_stream_error(self) -> None:
        """A mid-stream error is a bare ``data: {"error": …}`` event with no ``event:`` line
        and no response.completed: the error is recorded, the tokens before it stay, there
        is no finish reason, no counts, and the stream is not done."""
        error = {"error": {"code": 500, "message": "boom", "type": "server_error"}}
        obs = observe([start() + text_item() + text("Hi"), sse_json(error)])
        assert obs.upstream_error == "server_error:500"
        assert (obs.token_events, obs.last_token_s) == (1, 1.0)
        assert (obs.finish_reason, obs.timings, obs.done) == (None, None, False)

    def test_incomplete_status_maps_to_length(self) -> None:
        """Where a server says status "incomplete" for max_output_tokens (OpenAI's does,
        llama-server never), the finish reason is "length"; an unknown reason says nothing."""
        for reason, expected in (("max_output_tokens", ["length"]), ("other", [])):
            response = {"status": "incomplete", "incomplete_details": {"reason": reason}}
            obj = {"type": "response.incomplete", "response": response}
            assert RESPONSES.finish_reasons(obj) == expected


class TestBody:
    def test_tool_call_body(self) -> None:
        """A non-streamed body: function_call items of output[] are the calls in order, the
        finish reason is tool_calls, the counts come from usage (prompt_n uncached) and no
        prefill/decode times exist (the body has no timings)."""
        body = {
            "completed_at": 1,
            "created_at": 1,
            "id": "resp_iWqj",
            "model": "gemma3",
            "object": "response",
            "output": [CALL, call_item(FC2, "move_arm", '{"x": 1}', "completed")],
            "status": "completed",
            "usage": usage(prompt=211, cached=206, output=30),
        }
        obs = observe([orjson.dumps(body)], sse=False)
        assert obs.tool_calls == (
            ToolCall(0, "get_weather", '{"city": "Paris"}'),
            ToolCall(1, "move_arm", '{"x": 1}'),
        )
        assert obs.tool_call_s == 1.0 and obs.finish_reason == "tool_calls"
        assert obs.timings == ServerTimings(prompt_n=5, cache_n=206, predicted_n=30)
        assert obs.model == "gemma3"

    def test_reasoning_and_text_body(self) -> None:
        """A body of a reasoning and a message item has no calls and no finish reason."""
        reasoning = {
            "id": RS,
            "type": "reasoning",
            "content": [{"text": "hm", "type": "reasoning_text"}],
        }
        message = {"type": "message", "id": MSG, "content": [{"type": "output_text", "text": "Hi"}]}
        body = {"object": "response", "output": [reasoning, message], "status": "completed"}
        obs = observe([orjson.dumps(body | {"usage": usage(41, 0, 2)})], sse=False)
        assert (obs.tool_calls, obs.tool_call_s, obs.finish_reason) == ((), None, None)
        assert obs.timings == ServerTimings(prompt_n=41, cache_n=0, predicted_n=2)


class TestUsage:
    def test_fields_the_api_does_not_state_are_none(self) -> None:
        """Without cached_tokens (or with more cached than prompt tokens) the prompt counts
        are unknown but output_tokens still counts; no usage at all is None."""
        read = RESPONSES.usage
        plain = {"object": "response", "usage": {"input_tokens": 9, "output_tokens": 2}}
        assert read(plain) == ServerTimings(predicted_n=2)
        odd = {"object": "response", "usage": usage(prompt=3, cached=4, output=-1)}
        assert read(odd) is None
        assert read({"object": "response"}) is None

    def test_only_final_events_and_bodies_state_usage(self) -> None:
        """A usage-looking key elsewhere (e.g. inside response.created) is not read."""
        created = {"type": "response.created", "response": {"usage": usage()}}
        assert RESPONSES.usage(created) is None


# --- a turn cut by its token limit: the record ---------------------------------------------
# The shapes are llama-server's for a get_weather call with max_output_tokens 22 (seen: the
# arguments stop at `{"city": "Paris`, output_tokens 22, status and item status "completed")
# and 100 (the whole call in 30 tokens).

CUT = '{"city": "Paris'
WHOLE = '{"city": "Paris"}'


def tool_request(limit: int | None) -> dict[str, Any]:
    """A streamed get_weather request, with ``max_output_tokens`` unless ``limit`` is None."""
    body: dict[str, Any] = {"model": "gemma3", "input": "Weather in Paris?", "tools": [WEATHER]}
    body |= {"parallel_tool_calls": False, "temperature": 0, "stream": True}
    return body if limit is None else body | {"max_output_tokens": limit}


def final(output: list[dict[str, Any]], n: int, **fields: Any) -> bytes:
    """``response.completed`` as llama-server sends it after ``n`` generated tokens."""
    response = {**RESP, "created_at": 1, "status": "completed", "model": "gemma3"}
    response |= {"output": output, "usage": usage(prompt=220, cached=215, output=n)} | fields
    timings = TIMINGS | {"cache_n": 215, "predicted_n": n}
    return typed_event({"type": "response.completed", "response": response, "timings": timings})


def call_stream(arguments: str, n: int, status: str = "completed") -> list[bytes]:
    """A get_weather call streamed token by token (its deltas, up to ``Paris`` for the cut
    arguments) whose final batch says ``arguments`` with item ``status`` after ``n`` tokens."""
    pieces = ["{", '"', "city", '":', ' "', "Paris", '"', "}"][: 6 if arguments == CUT else 8]
    assert "".join(pieces) == arguments
    item = call_item(FC, "get_weather", arguments, status)
    ending = typed_event({"type": "response.output_item.done", "item": item}) + final([item], n)
    return (
        [start(), call_added(FC, "get_weather") + args(pieces[0])]
        + [args(p) for p in pieces[1:]]
        + [ending]
    )


def record_of(body: dict[str, Any], chunks: list[bytes], *, sse: bool = True) -> Record:
    """The record of ``chunks`` answering ``body`` on /v1/responses, as the relay builds it."""
    raw = orjson.dumps(body)
    facts = analyse_request("POST", "/v1/responses", raw)
    obs = observe(chunks, facts.dialect, sse=sse)
    exchange = Exchange("r", "t", "POST", "/v1/responses", 200, Outcome.COMPLETED, 9.0, len(raw))
    return build_record(exchange, facts, obs)


class TestTokenLimit:
    @pytest.mark.parametrize("status", ["completed", "incomplete", "in_progress"])
    def test_a_call_cut_inside_its_arguments_is_truncated(self, status: str) -> None:
        """Arguments stopping at `{"city": "Paris` with output_tokens at the request's
        max_output_tokens: finish "length" (as Chat Completions says for the same
        generation), tool_call_truncated, not valid, no tool_call_tokens, whatever status
        the function_call item says."""
        r = record_of(tool_request(22), call_stream(CUT, 22, status))
        cut = ("length", True, False)
        assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == cut
        assert (r.tool_calls, r.predicted_n, r.max_tokens, r.tool_call_tokens) == (1, 22, 22, None)

    def test_a_call_with_tokens_to_spare_is_untouched(self) -> None:
        """The same call with max_output_tokens 100, done in 30 tokens: "tool_calls", not
        truncated, valid, and its 30 tokens are the call's."""
        r = record_of(tool_request(100), call_stream(WHOLE, 30))
        assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == (
            "tool_calls",
            False,
            True,
        )
        assert r.tool_call_tokens == 30

    def test_a_whole_call_at_the_limit_is_length_but_not_truncated(self) -> None:
        """A call whose arguments are whole when the limit is reached (24 tokens, limit 24):
        "length", as Chat Completions says, but no truncated call."""
        r = record_of(tool_request(24), call_stream(WHOLE, 24))
        assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == (
            "length",
            False,
            True,
        )

    def test_without_a_limit_the_response_is_taken_at_its_word(self) -> None:
        """A request without max_output_tokens gives no limit to reach: the dialect's
        "tool_calls" stands (and the cut arguments are only not valid)."""
        r = record_of(tool_request(None), call_stream(CUT, 22))
        assert (r.finish_reason, r.tool_call_truncated, r.tool_call_valid) == (
            "tool_calls",
            False,
            False,
        )

    def test_the_body_of_a_cut_call(self) -> None:
        """Not streamed: llama-server's body (status completed, the call's arguments cut,
        usage output_tokens 22 of 22) is a truncated call finished by "length"."""
        item = call_item(FC, "get_weather", CUT, "completed")
        response = {"completed_at": 1, "created_at": 1, "id": "resp_FLjB", "model": "gemma3"}
        response |= {"object": "response", "output": [item], "status": "completed"}
        response |= {"usage": usage(prompt=220, cached=215, output=22)}
        body = tool_request(22) | {"stream": False}
        r = record_of(body, [orjson.dumps(response)], sse=False)
        assert (r.finish_reason, r.tool_call_truncated, r.predicted_n) == ("length", True, 22)

    def test_a_server_that_says_incomplete(self) -> None:
        """A server that states the cut (OpenAI's: status "incomplete", incomplete_details
        max_output_tokens) needs no request limit: "length", truncated."""
        details = {"reason": "max_output_tokens"}
        item = call_item(FC, "get_weather", CUT, "incomplete")
        ending = final([item], 22, status="incomplete", incomplete_details=details)
        r = record_of(tool_request(None), [*call_stream(CUT, 22)[:-1], ending])
        assert (r.finish_reason, r.tool_call_truncated) == ("length", True)

    def test_a_text_turn_at_the_limit_is_length(self) -> None:
        """A text turn (no tools) whose 3 tokens reached max_output_tokens 3: "length",
        where the response alone says nothing; no truncation field (not a tool turn)."""
        body = {"model": "gemma3", "input": "Hi", "max_output_tokens": 3, "stream": True}
        chunks = [start() + text_item() + text("<"), text("|"), text("im") + final([], 3)]
        r = record_of(body, chunks)
        assert (r.finish_reason, r.tool_call_truncated) == ("length", None)
        spare = record_of(body | {"max_output_tokens": 16}, chunks)
        assert (spare.finish_reason, spare.tool_call_truncated) == (None, None)


JUNK: list[dict[str, Any]] = [
    {},
    {"type": 3},
    {"type": "response.output_item.added", "item": "x"},
    {"type": "response.output_item.added", "item": {"type": "function_call", "id": 5, "name": []}},
    {"type": "response.function_call_arguments.delta", "delta": None},
    {"type": "response.output_item.done", "item": {"type": "function_call", "arguments": 7}},
    {"type": "response.function_call_arguments.done", "item_id": None, "arguments": "{}"},
    {"type": "response.completed", "response": "x"},
    {"type": "response.completed", "response": {"status": "completed", "output": [1, None]}},
    {"object": "response", "output": {"a": 1}, "usage": [], "status": "incomplete"},
    {"object": "response", "status": "incomplete", "incomplete_details": "x"},
]


@pytest.mark.parametrize("obj", JUNK)
def test_odd_input_never_raises(obj: dict[str, Any]) -> None:
    """Every reader takes malformed events and bodies without raising."""
    for read in (
        RESPONSES.finish_reasons,
        RESPONSES.tool_reader(),
        RESPONSES.body_tool_calls,
        RESPONSES.usage,
        new_call_reader(),
    ):
        read(obj)


# --- the real llama-server -------------------------------------------------------------


def post_stream(url: str, body: dict[str, Any]) -> list[bytes]:
    """POST ``body`` and return the response exactly as received, chunk by chunk."""
    request = urllib.request.Request(
        url + "/v1/responses",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(request, timeout=120) as response:
        while chunk := response.read1(65536):
            chunks.append(chunk)
    return chunks


def events(chunks: list[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """A tiny reference parse: (chunk number from 1, data object) per event. llama-server
    never splits an event across chunks, which the reference relies on."""
    for n, chunk in enumerate(chunks, 1):
        for block in chunk.split(b"\n\n"):
            for line in block.split(b"\n"):
                if line.startswith(b"data: "):
                    yield n, json.loads(line[6:])


def reference(chunks: list[bytes]) -> dict[str, Any]:
    """What the bytes say, read independently of the dialect: calls assembled from their
    items and deltas (completed by the .done items), the chunks of the first and last token
    events, the final usage and timings."""
    ids: list[str] = []
    names: dict[str, str] = {}
    text: dict[str, str] = {}
    token_chunks: list[int] = []
    final: dict[str, Any] = {}
    for n, obj in events(chunks):
        kind = obj.get("type")
        item = obj.get("item", {})
        if kind == "response.output_item.added" and item.get("type") == "function_call":
            ids.append(item["id"])
            names[item["id"]] = item["name"]
            token_chunks.append(n)
        elif kind == "response.function_call_arguments.delta":
            text[obj["item_id"]] = text.get(obj["item_id"], "") + obj["delta"]
            token_chunks.append(n)
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            token_chunks.append(n)
        elif kind == "response.output_item.done" and item.get("type") == "function_call":
            assert item["arguments"].startswith(text.get(item["id"], ""))
            text[item["id"]] = item["arguments"]
        elif kind == "response.completed":
            final = obj
    calls = tuple(ToolCall(i, names[c], text.get(c, "")) for i, c in enumerate(ids))
    return {"calls": calls, "ids": ids, "tokens": token_chunks, "final": final}


@pytest.mark.real
def test_real_streams(llama_server: LlamaServer) -> None:
    """A streamed tool request and a streamed text request to the real llama-server: the
    observation from the exact received bytes has the calls, token events, first and last
    token chunks, counts, timings and finish reason that the bytes themselves state."""
    base = {
        "temperature": 0,
        "stream": True,
        "max_output_tokens": 48,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    tool_body = base | {
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "stop": ["</tool_call>"],
        "parallel_tool_calls": False,
    }
    for body in (tool_body, base | {"input": "Say hello in five words."}):
        chunks = post_stream(llama_server.url, body)
        ref = reference(chunks)
        obs = observe(chunks)
        final = ref["final"]
        answer = final["response"]
        assert obs.tool_calls == ref["calls"]
        assert obs.token_events == len(ref["tokens"])
        assert (obs.first_token_s, obs.last_token_s) == (
            float(ref["tokens"][0]),
            float(ref["tokens"][-1]),
        )
        assert obs.timings == ServerTimings.from_json(final["timings"])
        u = answer["usage"]
        assert obs.timings is not None
        assert obs.timings.cache_n == u["input_tokens_details"]["cached_tokens"]
        assert (
            obs.timings.prompt_n == u["input_tokens"] - u["input_tokens_details"]["cached_tokens"]
        )
        assert obs.timings.predicted_n == u["output_tokens"]
        calls_in_output = [i for i in answer["output"] if i["type"] == "function_call"]
        assert [(c.name, c.arguments) for c in obs.tool_calls] == [
            (i["name"], i["arguments"]) for i in calls_in_output
        ]
        assert obs.finish_reason == ("tool_calls" if calls_in_output else None)
        assert (obs.upstream_error, obs.analysis_error) == (None, None)
        if body is tool_body:
            assert len(obs.tool_calls) == 1 and obs.tool_calls[0].name == "get_weather"
            assert obs.tool_call_s is not None
            print("real tool call:", obs.tool_calls, obs.timings, obs.token_events, u)
        else:
            assert obs.tool_calls == () and obs.token_events > 0


def test_each_response_numbers_its_own_calls() -> None:
    """Two responses read at the same time each number their calls from 0: the tracker
    makes the dialect's call reader once per response, and none is shared."""
    first = StreamTracker(0.0, sse=True, clock=lambda: 1.0, dialect=RESPONSES)
    second = StreamTracker(0.0, sse=True, clock=lambda: 1.0, dialect=RESPONSES)
    first.feed(start() + call_added(FC, "get_weather") + args("{}"))
    second.feed(start() + call_added(FC2, "move_arm") + args("{}", FC2))
    assert [(c.index, c.name) for c in first.finish().tool_calls] == [(0, "get_weather")]
    assert [(c.index, c.name) for c in second.finish().tool_calls] == [(0, "move_arm")]


def test_chat_form_of_a_string_input() -> None:
    """A string ``input`` is one user message after ``instructions``, as llama-server's
    converter makes it (the form the proxy renders to attribute the prompt)."""
    assert RESPONSES.chat_form is not None
    form = RESPONSES.chat_form({"model": "m", "instructions": "Be brief.", "input": "Hi"})
    assert form == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
    }
