"""The real clients through the proxy, against the real llama-server: the ``openai`` SDK's
Responses API, the OpenAI Agents SDK, the ``anthropic`` SDK and a plain native
``/completion`` stream.

For each: the client gets the same answer through the proxy as direct (temperature 0, the
prompt warmed in llama-server's cache first so that both runs prefill alike); the record's
counts, times and tool-call fields equal what an independent parse finds in the very bytes
the SDK read (``tests/client_capture.py`` tees them off the SDK's HTTP transport); a
stream's ``ttft_ms`` is within ``CLOCK_TOLERANCE_MS`` of the client's own clock; the schema
tokens equal the API's own counting endpoint with and without the tools.

Run with ``-s`` to see one JSON line per API: the record beside the raw values and the
client's clock.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
from openai import AsyncOpenAI, OpenAI

from proxy.commands.provision import LlamaServer
from tests.client_capture import (
    AsyncTee,
    Exchange,
    Received,
    Tee,
    completion_stream,
    messages_body,
    messages_stream,
    responses_body,
    responses_stream,
)
from tests.conftest import ProxyProcess

if TYPE_CHECKING:  # imported where used: two seconds off every run's collection
    from agents import FunctionToolResult, RunContextWrapper, RunResult, ToolsToFinalOutputResult
    from anthropic import Anthropic

pytestmark = pytest.mark.real

CLOCK_TOLERANCE_MS = 50.0
"""How far the proxy's ttft_ms may be from the client's own first-token clock. The client's
clock holds the SDK's own work and the scheduling of three processes (the client, the proxy,
llama-server at ``-t 1``) on two cores: 32 ms was seen once in a full CI run; a proxy that
timed something else (the upstream's head, the last token) is off by far more."""

PROMPT = "What is the weather in Paris right now?"
DESCRIPTION = "Get the current weather for a city."
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}
NO_THINKING = {"enable_thinking": False}
STOP = ["</tool_call>"]

RESPONSES_ARGS: dict[str, Any] = {
    "model": "gemma",
    "input": PROMPT,
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": DESCRIPTION,
            "parameters": PARAMETERS,
        }
    ],
    "parallel_tool_calls": False,
    "max_output_tokens": 48,
    "temperature": 0,
    "extra_body": {"chat_template_kwargs": NO_THINKING, "stop": STOP},
}
# Messages drops parallel_tool_calls (llama-server-protocol §8.5), so the Qwen3 template's
# default lets the model go on to a second call despite the stop sequence: the token limit
# ends the tool turn after the first call (its turn ends with max_tokens, finish "length").
MESSAGES_TOOL_ARGS: dict[str, Any] = {
    "model": "gemma",
    "max_tokens": 30,
    "messages": [{"role": "user", "content": PROMPT}],
    "tools": [{"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMETERS}],
    "stop_sequences": STOP,
    # the SDK has no temperature parameter any more: it goes in the body as is
    "extra_body": {"temperature": 0, "chat_template_kwargs": NO_THINKING},
}
MESSAGES_TEXT_ARGS: dict[str, Any] = {
    "model": "gemma",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "Say hello in three words."}],
    "extra_body": {"temperature": 0, "chat_template_kwargs": NO_THINKING},
}
COMPLETION_BODY: dict[str, Any] = {
    "prompt": "The three primary colours are",
    "n_predict": 16,
    "stream": True,
    "temperature": 0,
}
PRINTED_FIELDS = (
    *("id", "api", "kind", "stream", "prompt_n", "cache_n", "predicted_n"),
    *("prefill_ms", "decode_ms", "ttfb_ms", "ttft_ms", "e2e_ms"),
    *("tool_calls", "tool_call_valid", "finish_reason", "schema_tokens", "schema_tokens_source"),
)


@dataclass
class Clocked:
    """One SDK call: the bytes it read and the client's own clock, started right before the
    call: to the first event carrying text or a tool call, and to the end."""

    exchange: Exchange
    first_ms: float | None
    total_ms: float
    result: Any = None


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def _post_json(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _openai(base: str, tee: Tee) -> OpenAI:
    return OpenAI(
        base_url=base + "/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx2.Client(transport=tee),
    )


def _anthropic(base: str, tee: Tee) -> Anthropic:
    from anthropic import Anthropic

    # no /v1: the SDK appends /v1/messages itself
    return Anthropic(
        base_url=base, api_key="unused", max_retries=0, http_client=httpx2.Client(transport=tee)
    )


def _prompt_tokens(received: Received) -> int:
    """The whole prompt: the evaluated part and the part reused from the cache."""
    assert received.prompt_n is not None and received.cache_n is not None
    return received.prompt_n + received.cache_n


def _valid(call: tuple[str, str], names: set[str]) -> bool:
    """A call names one of the request's tools and its arguments are a JSON object."""
    try:
        arguments = json.loads(call[1])
    except json.JSONDecodeError:
        return False
    return call[0] in names and isinstance(arguments, dict)


def _assert_record(
    record: dict[str, Any], received: Received, *, api: str, tools: set[str]
) -> None:
    """The record holds what the client received: counts, server times, finish reason,
    and the tool calls counted and checked."""
    assert record["outcome"] == "completed" and record["status"] == 200
    assert record["api"] == api
    assert record["kind"] == ("tool" if tools else "chat" if api != "completions" else "other")
    for name in ("prompt_n", "cache_n", "predicted_n", "prefill_ms", "decode_ms"):
        assert record[name] == getattr(received, name), name
    assert record["finish_reason"] == received.finish_reason
    if tools:
        assert record["tool_calls"] == len(received.calls)
        expected = all(_valid(call, tools) for call in received.calls) if received.calls else None
        assert record["tool_call_valid"] is expected


def _assert_one_valid_call(record: dict[str, Any], received: Received) -> None:
    """The tool turn made exactly one call, and the record counts it as valid."""
    assert len(received.calls) == 1
    assert record["tool_calls"] == 1 and record["tool_call_valid"] is True


def _assert_stream_clock(record: dict[str, Any], clocked: Clocked) -> None:
    """The proxy's ttft_ms is the client's first-token clock to within the tolerance (the
    client's clock starts earlier and stops later, after the relay); e2e_ms ends before the
    client's clock does."""
    assert clocked.first_ms is not None and record["ttft_ms"] is not None
    assert abs(clocked.first_ms - record["ttft_ms"]) <= CLOCK_TOLERANCE_MS
    assert record["ttft_ms"] <= record["e2e_ms"] <= clocked.total_ms + CLOCK_TOLERANCE_MS


def _assert_plain_clock(record: dict[str, Any], clocked: Clocked) -> None:
    """A non-streamed response has no ttft; its e2e_ms ends before the client's clock does."""
    assert record["stream"] is False and record["ttft_ms"] is None
    assert 0 < record["e2e_ms"] <= clocked.total_ms + CLOCK_TOLERANCE_MS


def _assert_schema(
    record: dict[str, Any], count_url: str, body: dict[str, Any], label: str = ""
) -> None:
    """The counting endpoint, given the very body the client sent, counts the prompt the
    record holds; schema_tokens is that count less the count of the same body without
    tools and tool_choice, and the server counted it."""
    with_tools = _post_json(count_url, body)["input_tokens"]
    bare = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    without = _post_json(count_url, bare)["input_tokens"]
    assert record["prompt_tokens"] == with_tools
    assert with_tools - without > 0
    assert record["schema_tokens"] == with_tools - without, (
        f"{label}schema_tokens {record['schema_tokens']} != {with_tools} - {without}"
    )
    assert record["schema_tokens_source"] == "server"


def _print_line(label: str, record: dict[str, Any], received: Received, clocked: Clocked) -> None:
    """One compact JSON line for the closing note: the record beside the raw values."""
    line = {
        "client": label,
        "record": {name: record.get(name) for name in PRINTED_FIELDS},
        "raw": received.raw,
        "client_first_ms": None if clocked.first_ms is None else round(clocked.first_ms, 3),
        "client_total_ms": round(clocked.total_ms, 3),
    }
    print(json.dumps(line, separators=(",", ":")))


# -- the openai SDK, Responses API -----------------------------------------------------


def _responses_streamed(base: str) -> Clocked:
    """responses.create(stream=True); the clock stops at the first function call's item
    (its name: what the proxy times, llama-server-protocol §8.11) or text/argument delta."""
    tee = Tee()
    with _openai(base, tee) as client:
        first, final = None, None
        t0 = time.perf_counter()
        for event in client.responses.create(stream=True, **RESPONSES_ARGS):
            if first is None and _responses_output_event(event):
                first = _ms_since(t0)
            if event.type == "response.completed":
                final = event.response
        total = _ms_since(t0)
    return Clocked(tee.last, first, total, final)


def _responses_output_event(event: Any) -> bool:
    if event.type == "response.output_item.added":
        return bool(event.item.type == "function_call")
    return event.type in (
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
    )


def _responses_plain(base: str) -> Clocked:
    tee = Tee()
    with _openai(base, tee) as client:
        t0 = time.perf_counter()
        response = client.responses.create(**RESPONSES_ARGS)
        total = _ms_since(t0)
    return Clocked(tee.last, None, total, response)


def _sdk_calls(response: Any) -> list[tuple[str, str]]:
    """The function calls as the SDK parsed them."""
    return [(i.name, i.arguments) for i in response.output if i.type == "function_call"]


class TestOpenAIResponses:
    """The openai SDK's ``client.responses.create`` with one function tool."""

    def test_streamed_tool_call(
        self, proxy_process: ProxyProcess, llama_server: LlamaServer
    ) -> None:
        """Streamed: the same call as direct; the record's counts and server times are the
        timings and usage of response.completed in the bytes the SDK read; one valid call;
        ttft_ms matches the client's clock; schema_tokens matches /v1/responses/input_tokens."""
        _responses_streamed(llama_server.url)  # warm the prompt cache (and the SDK)
        direct = _responses_streamed(llama_server.url)
        proxied = _responses_streamed(proxy_process.url)
        received = responses_stream(proxied.exchange.body)
        assert received.calls == responses_stream(direct.exchange.body).calls
        assert received.calls == _sdk_calls(proxied.result)
        usage = received.raw["usage"]
        assert usage["input_tokens"] == _prompt_tokens(received)
        assert usage["input_tokens_details"]["cached_tokens"] == received.cache_n
        assert usage["output_tokens"] == received.predicted_n
        record = proxy_process.record(proxied.exchange.request_id, within=15)
        _print_line("openai responses.create stream", record, received, proxied)
        _assert_record(record, received, api="responses", tools={"get_weather"})
        assert record["stream"] is True
        _assert_one_valid_call(record, received)
        _assert_stream_clock(record, proxied)
        _assert_schema(
            record,
            llama_server.url + "/v1/responses/input_tokens",
            proxied.exchange.request_json(),
        )

    def test_plain_tool_call(self, proxy_process: ProxyProcess, llama_server: LlamaServer) -> None:
        """Not streamed: the same call as direct; the counts are the body's usage (no
        timings on this API's body, so no server times); one valid call; no ttft."""
        _responses_plain(llama_server.url)
        direct = _responses_plain(llama_server.url)
        proxied = _responses_plain(proxy_process.url)
        received = responses_body(proxied.exchange.body)
        assert received.calls == responses_body(direct.exchange.body).calls
        assert received.calls == _sdk_calls(proxied.result)
        record = proxy_process.record(proxied.exchange.request_id, within=15)
        _assert_record(record, received, api="responses", tools={"get_weather"})
        _assert_one_valid_call(record, received)
        _assert_plain_clock(record, proxied)
        _assert_schema(
            record,
            llama_server.url + "/v1/responses/input_tokens",
            proxied.exchange.request_json(),
        )


# -- the OpenAI Agents SDK ---------------------------------------------------------------


def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: City name.
    """
    return f"Sunny, 21 C in {city}."


def _stop_after(calls: int) -> Callable[..., ToolsToFinalOutputResult]:
    """A tool-use behaviour that ends the run after ``calls`` tool results: the model
    calls the tool again on every turn, so the run must be ended by the tools."""
    from agents import ToolsToFinalOutputResult

    seen: list[FunctionToolResult] = []

    def behaviour(
        _: RunContextWrapper[Any], results: list[FunctionToolResult]
    ) -> ToolsToFinalOutputResult:
        seen.extend(results)
        if len(seen) >= calls:
            return ToolsToFinalOutputResult(is_final_output=True, final_output=seen[-1].output)
        return ToolsToFinalOutputResult(is_final_output=False)

    return behaviour


async def _run_agent(base: str) -> tuple[RunResult, list[Exchange]]:
    """One Runner.run of a one-tool agent on the Responses API at ``base``: two model turns
    at most, each answered with a call, then the tool's output is the final output."""
    import agents
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool

    agents.set_tracing_disabled(True)
    tee = AsyncTee()
    client = AsyncOpenAI(
        base_url=base + "/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=tee),
    )
    agent: Agent[Any] = Agent(
        name="weather",
        tools=[function_tool(get_weather)],
        model=OpenAIResponsesModel(model="gemma", openai_client=client),
        model_settings=ModelSettings(
            temperature=0,
            parallel_tool_calls=False,
            max_tokens=48,
            extra_body={"chat_template_kwargs": NO_THINKING, "stop": STOP},
        ),
        tool_use_behavior=_stop_after(2),
    )
    try:
        result = await Runner.run(agent, PROMPT, max_turns=3)
    finally:
        await client.close()
    return result, tee.exchanges


def _agent_calls(result: RunResult) -> list[tuple[str, str]]:
    from agents import ToolCallItem

    calls = []
    for item in result.new_items:
        if isinstance(item, ToolCallItem):
            raw = item.raw_item
            calls.append((getattr(raw, "name", ""), getattr(raw, "arguments", "")))
    return calls


class TestOpenAIAgents:
    """The OpenAI Agents SDK in Responses mode (OpenAIResponsesModel), run by Runner.run."""

    def test_agent_run(self, proxy_process: ProxyProcess, llama_server: LlamaServer) -> None:
        """The run's calls and final output are the same as the same agent run direct; every
        request it made through the proxy has a Responses tool record whose counts are the
        usage in the bytes the SDK read, its calls counted and valid (one on the first
        turn), no ttft (Runner.run does not stream), and schema_tokens matching
        /v1/responses/input_tokens for the exact body the agent sent."""
        asyncio.run(_run_agent(llama_server.url))  # warm the prompt cache
        direct, _ = asyncio.run(_run_agent(llama_server.url))
        before = set(proxy_process.records())
        started = time.perf_counter()
        proxied, exchanges = asyncio.run(_run_agent(proxy_process.url))
        total = _ms_since(started)
        assert proxied.final_output == direct.final_output
        assert _agent_calls(proxied) == _agent_calls(direct)
        assert [e.path for e in exchanges] == ["/v1/responses"] * len(exchanges)
        records = [proxy_process.record(e.request_id, within=15) for e in exchanges]
        written = {
            rid for rid, r in proxy_process.records().items() if r["path"] == "/v1/responses"
        }
        assert written - before == {r["id"] for r in records}
        assert sum(len(responses_body(e.body).calls) for e in exchanges) == len(
            _agent_calls(proxied)
        )
        for turn, (exchange, record) in enumerate(zip(exchanges, records, strict=True)):
            received = responses_body(exchange.body)
            if turn == 0:
                _print_line(
                    "agents Runner.run turn 1", record, received, Clocked(exchange, None, total)
                )
                _assert_one_valid_call(record, received)
            _assert_record(record, received, api="responses", tools={"get_weather"})
            _assert_plain_clock(record, Clocked(exchange, None, total))
        for turn, (exchange, record) in enumerate(zip(exchanges, records, strict=True)):
            _assert_schema(
                record,
                llama_server.url + "/v1/responses/input_tokens",
                exchange.request_json(),
                label=f"turn {turn + 1}: ",
            )


# -- the anthropic SDK -------------------------------------------------------------------


def _messages_created(base: str, kwargs: dict[str, Any]) -> Clocked:
    tee = Tee()
    with _anthropic(base, tee) as client:
        t0 = time.perf_counter()
        message = client.messages.create(**kwargs)
        total = _ms_since(t0)
    return Clocked(tee.last, None, total, message)


def _messages_streamed(base: str, kwargs: dict[str, Any]) -> Clocked:
    """messages.stream; the clock stops at the first tool_use block's start (its name: what
    the proxy times) or text/argument delta."""
    tee = Tee()
    with _anthropic(base, tee) as client:
        first = None
        t0 = time.perf_counter()
        with client.messages.stream(**kwargs) as stream:
            for event in stream:
                if first is None and _messages_output_event(event):
                    first = _ms_since(t0)
            message = stream.get_final_message()
        total = _ms_since(t0)
    return Clocked(tee.last, first, total, message)


def _messages_output_event(event: Any) -> bool:
    if event.type == "content_block_start":
        return bool(event.content_block.type == "tool_use")
    return event.type == "content_block_delta" and event.delta.type in (
        "text_delta",
        "input_json_delta",
        "thinking_delta",
    )


def _sdk_blocks(message: Any) -> list[tuple[str, Any]]:
    """The message's blocks as the SDK parsed them: text, or a call's name and input."""
    return [
        (block.text, None) if block.type == "text" else (block.name, block.input)
        for block in message.content
        if block.type in ("text", "tool_use")
    ]


def _parsed(calls: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    return [(name, json.loads(arguments)) for name, arguments in calls]


@pytest.fixture(params=["stream", "create"])
def messages_call(request: pytest.FixtureRequest) -> Callable[[str, dict[str, Any]], Clocked]:
    """messages.stream or messages.create."""
    return _messages_streamed if request.param == "stream" else _messages_created


class TestAnthropicMessages:
    """The anthropic SDK's ``messages.create`` and ``messages.stream``."""

    def test_tool_call(
        self,
        proxy_process: ProxyProcess,
        llama_server: LlamaServer,
        messages_call: Callable[[str, dict[str, Any]], Clocked],
    ) -> None:
        """A tool turn: the same call as direct; the record's counts are the usage in the
        bytes the SDK read (input_tokens uncached + cache_read_input_tokens, output_tokens);
        no server times on this API; one valid call; a stream's ttft_ms matches the client's
        clock; schema_tokens matches /v1/messages/count_tokens."""
        messages_call(llama_server.url, MESSAGES_TOOL_ARGS)
        direct = messages_call(llama_server.url, MESSAGES_TOOL_ARGS)
        proxied = messages_call(proxy_process.url, MESSAGES_TOOL_ARGS)
        streamed = messages_call is _messages_streamed
        read = messages_stream if streamed else messages_body
        received = read(proxied.exchange.body)
        assert _parsed(received.calls) == _parsed(read(direct.exchange.body).calls)
        assert _sdk_blocks(proxied.result) == _sdk_blocks(direct.result)
        assert [(n, a) for n, a in _sdk_blocks(proxied.result) if a is not None] == _parsed(
            received.calls
        )
        record = proxy_process.record(proxied.exchange.request_id, within=15)
        if streamed:
            _print_line("anthropic messages.stream", record, received, proxied)
        _assert_record(record, received, api="messages", tools={"get_weather"})
        _assert_one_valid_call(record, received)
        if streamed:
            assert record["stream"] is True
            _assert_stream_clock(record, proxied)
        else:
            _assert_plain_clock(record, proxied)
        _assert_schema(
            record,
            llama_server.url + "/v1/messages/count_tokens",
            proxied.exchange.request_json(),
        )

    def test_text(
        self,
        proxy_process: ProxyProcess,
        llama_server: LlamaServer,
        messages_call: Callable[[str, dict[str, Any]], Clocked],
    ) -> None:
        """A text turn: the same text as direct; a chat record whose counts are the usage in
        the bytes the SDK read; a stream's ttft_ms matches the client's clock."""
        messages_call(llama_server.url, MESSAGES_TEXT_ARGS)
        direct = messages_call(llama_server.url, MESSAGES_TEXT_ARGS)
        proxied = messages_call(proxy_process.url, MESSAGES_TEXT_ARGS)
        streamed = messages_call is _messages_streamed
        read = messages_stream if streamed else messages_body
        received = read(proxied.exchange.body)
        assert received.text == read(direct.exchange.body).text != ""
        assert _sdk_blocks(proxied.result) == _sdk_blocks(direct.result)
        record = proxy_process.record(proxied.exchange.request_id, within=15)
        _assert_record(record, received, api="messages", tools=set())
        assert record["tool_calls"] == 0 and record["schema_tokens"] is None
        if streamed:
            _assert_stream_clock(record, proxied)
        else:
            _assert_plain_clock(record, proxied)


# -- native /completion ------------------------------------------------------------------


def _completion_streamed(base: str) -> Clocked:
    """POST /completion streamed with a plain HTTP client; the clock stops at the first
    event with a non-empty ``content`` piece."""
    tee = Tee()
    first = None
    pending = b""
    with httpx2.Client(transport=tee, timeout=60) as client:
        t0 = time.perf_counter()
        with client.stream("POST", base + "/completion", json=COMPLETION_BODY) as resp:
            for chunk in resp.iter_bytes():
                pending += chunk
                *events, pending = pending.split(b"\n\n")
                if first is None and any(_has_content(e) for e in events):
                    first = _ms_since(t0)
        total = _ms_since(t0)
    return Clocked(tee.last, first, total)


def _has_content(event: bytes) -> bool:
    lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    return bool(lines) and bool(json.loads(lines[0]).get("content"))


class TestNativeCompletion:
    """llama-server's own /completion, streamed."""

    def test_streamed(self, proxy_process: ProxyProcess, llama_server: LlamaServer) -> None:
        """The same text as direct; the record's counts and server times are the final
        event's timings (tokens_predicted = predicted_n); ttft_ms matches the client's
        clock."""
        _completion_streamed(llama_server.url)
        direct = _completion_streamed(llama_server.url)
        proxied = _completion_streamed(proxy_process.url)
        received = completion_stream(proxied.exchange.body)
        assert received.text == completion_stream(direct.exchange.body).text != ""
        assert received.raw["tokens_predicted"] == received.predicted_n
        assert received.raw["tokens_evaluated"] == _prompt_tokens(received)
        record = proxy_process.record(proxied.exchange.request_id, within=15)
        _print_line("native /completion stream", record, received, proxied)
        _assert_record(record, received, api="completions", tools=set())
        assert record["stream"] is True and record["tool_calls"] == 0
        _assert_stream_clock(record, proxied)
