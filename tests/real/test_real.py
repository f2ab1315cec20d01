"""End to end against the real llama-server and Gemma 3 270M, driven by the OpenAI SDK.

The proxy runs as its own process (``python -m proxy serve --log-file ...``), exactly as a
user starts it; the records are read back from the JSON-lines log file.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from openai import OpenAI

from proxy.commands.provision import LlamaServer
from proxy.core.dialects import MESSAGES, RESPONSES, Dialect
from proxy.core.headers import REQUEST_ID_HEADER
from tests.conftest import ProxyProcess

pytestmark = pytest.mark.real

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
ARM_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "move_arm",
        "description": "Move the robot arm's gripper to a position in metres.",
        "parameters": {
            "type": "object",
            "properties": {
                "x": {"type": "number"},
                "y": {"type": "number"},
                "z": {"type": "number"},
            },
            "required": ["x", "y", "z"],
        },
    },
}
TOOL_ARGS: dict[str, Any] = {
    "tools": [WEATHER_TOOL, ARM_TOOL],
    "temperature": 0,
    "max_tokens": 64,
    "stop": ["</tool_call>"],
    "parallel_tool_calls": False,
    "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
}
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _sdk(base: str, api_key: str = "sk-none") -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0)


@dataclass
class StreamResult:
    """What the client received from one streamed request."""

    request_id: str
    content: str
    tool_calls: dict[int, dict[str, str]]
    timings: dict[str, Any] | None
    ttft_ms: float | None
    finish_reason: str | None = None


def _stream(client: OpenAI, **kwargs: Any) -> StreamResult:
    t0 = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(stream=True, **kwargs)
    ttft = None
    content = ""
    calls: dict[int, dict[str, str]] = {}
    timings = None
    finish_reason = None
    for chunk in raw.parse():
        extra = chunk.model_extra or {}
        if "timings" in extra:
            timings = extra["timings"]
        for choice in chunk.choices:
            finish_reason = choice.finish_reason or finish_reason
            delta = choice.delta
            if (delta.content or delta.tool_calls) and ttft is None:
                ttft = (time.perf_counter() - t0) * 1000
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                if tc.function and tc.function.name:
                    call["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
    request_id = raw.headers.get(REQUEST_ID_HEADER, "")
    return StreamResult(request_id, content, calls, timings, ttft, finish_reason)


def _assert_record_matches_timings(record: dict[str, Any], timings: dict[str, Any]) -> None:
    assert record["prefill_ms"] == timings["prompt_ms"]
    assert record["decode_ms"] == timings["predicted_ms"]
    assert record["cache_n"] == timings["cache_n"]
    assert record["prompt_n"] == timings["prompt_n"]
    assert record["predicted_n"] == timings["predicted_n"]


def _valid_call(call: dict[str, str], names: set[str]) -> bool:
    """A call names one of the request's tools and its arguments are a JSON object."""
    try:
        args = json.loads(call["arguments"])
    except json.JSONDecodeError:
        return False
    return call["name"] in names and isinstance(args, dict)


def _assert_tool_record(
    record: dict[str, Any], received: StreamResult, tools: list[dict[str, Any]]
) -> None:
    """The record's tool-call fields say what the client received, whatever the model chose
    to answer (a call, several, or plain text)."""
    calls = list(received.tool_calls.values())
    assert record["kind"] == "tool"
    assert record["finish_reason"] == received.finish_reason
    assert record["tool_calls"] == len(calls)
    if not calls:
        assert record["tool_call_valid"] is None and record["tool_call_ms"] is None
        assert record["tool_call_tokens"] is None and record["tool_args_chars"] is None
        return
    names = {tool["function"]["name"] for tool in tools}
    assert record["tool_call_valid"] is all(_valid_call(call, names) for call in calls)
    assert record["tool_args_chars"] == sum(len(call["arguments"]) for call in calls)
    assert record["ttft_ms"] <= record["tool_call_ms"] <= record["e2e_ms"]
    ends_with_call = received.finish_reason == "tool_calls"
    assert record["tool_call_tokens"] == (record["predicted_n"] if ends_with_call else None)


def _warm(llama_server: LlamaServer, **kwargs: Any) -> None:
    """Send a request once straight to llama-server, so that the direct and proxied runs
    compared next both find its prompt cached: a cold and a warm prefill can round
    differently and make a small model answer differently at temperature 0."""
    _sdk(llama_server.url).chat.completions.create(**kwargs)


def _occupy_slot(llama_server: LlamaServer) -> None:
    """Fill llama-server's one slot with an unrelated prompt, so the next request's prompt
    shares no cached prefix with whatever an earlier test sent."""
    _sdk(llama_server.url).chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": f"Count to three. {time.time_ns()}"}],
        max_tokens=1,
        temperature=0,
    )


class TestThroughTheProxy:
    """What an agent using the OpenAI SDK gets through the proxy, and what the proxy records."""

    def test_streamed_chat(self, proxy_process: ProxyProcess, llama_server: LlamaServer) -> None:
        """A streamed chat is the same through the proxy as direct, and its record is exact."""
        kwargs: dict[str, Any] = {
            "model": "gemma",
            "messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": 16,
            "temperature": 0,
        }
        _warm(llama_server, **kwargs)
        direct = _stream(_sdk(llama_server.url), **kwargs)
        proxied = _stream(_sdk(proxy_process.url), **kwargs)
        assert proxied.content == direct.content and proxied.content
        assert proxied.timings is not None
        record = proxy_process.record(proxied.request_id)
        _assert_record_matches_timings(record, proxied.timings)
        assert record["kind"] == "chat" and record["outcome"] == "completed"
        assert record["stream"] is True and record["status"] == 200
        assert proxied.ttft_ms is not None and record["ttft_ms"] is not None
        # the test's clock starts before the SDK sends and stops after the proxy relayed the
        # token; the proxy's clock spans llama-server's prefill (bench/ measures the overhead)
        assert proxied.ttft_ms >= record["ttft_ms"] >= record["prefill_ms"]
        assert record["overhead_ms"] == pytest.approx(
            record["ttft_ms"] - record["prefill_ms"], abs=1e-3
        )

    def test_streamed_tool_call(
        self, proxy_process: ProxyProcess, llama_server: LlamaServer
    ) -> None:
        """A streamed tool request answers the same through the proxy as direct; the record
        counts, checks and times the calls the client received, whatever the model chose."""
        kwargs: dict[str, Any] = {"model": "gemma", "messages": WEATHER_Q, **TOOL_ARGS}
        _warm(llama_server, **kwargs)
        direct = _stream(_sdk(llama_server.url), **kwargs)
        proxied = _stream(_sdk(proxy_process.url), **kwargs)
        assert proxied.tool_calls == direct.tool_calls
        assert proxied.content == direct.content
        assert proxied.finish_reason == direct.finish_reason is not None
        assert proxied.timings is not None
        record = proxy_process.record(proxied.request_id)
        _assert_record_matches_timings(record, proxied.timings)
        _assert_tool_record(record, proxied, TOOL_ARGS["tools"])

    def test_non_streamed_chat(
        self, proxy_process: ProxyProcess, llama_server: LlamaServer
    ) -> None:
        """A non-streamed chat matches direct; its record takes the body's top-level timings."""
        kwargs: dict[str, Any] = {
            "model": "gemma",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 12,
            "temperature": 0,
        }
        _warm(llama_server, **kwargs)
        direct = _sdk(llama_server.url).chat.completions.create(**kwargs)
        raw = _sdk(proxy_process.url).chat.completions.with_raw_response.create(**kwargs)
        proxied = raw.parse()
        assert proxied.choices[0].message.content == direct.choices[0].message.content
        timings = (proxied.model_extra or {})["timings"]
        record = proxy_process.record(raw.headers[REQUEST_ID_HEADER])
        _assert_record_matches_timings(record, timings)
        assert record["stream"] is False and record["ttft_ms"] is None
        assert proxied.usage is not None
        assert record["prompt_tokens"] == proxied.usage.prompt_tokens

    def test_repeated_prompt_hits_the_cache(self, proxy_process: ProxyProcess) -> None:
        """The same prompt twice: the second record shows the prompt cache's reuse."""
        kwargs: dict[str, Any] = {
            "model": "gemma",
            "max_tokens": 4,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": "You are a terse robot. " * 20},
                {"role": "user", "content": "Status?"},
            ],
        }
        client = _sdk(proxy_process.url)
        first = _stream(client, **kwargs)
        second = _stream(client, **kwargs)
        r1 = proxy_process.record(first.request_id)
        r2 = proxy_process.record(second.request_id)
        assert second.timings is not None
        _assert_record_matches_timings(r2, second.timings)
        assert r2["cache_n"] > 0
        assert r2["cache_hit_ratio"] > 0.5
        assert r2["prompt_tokens"] == r1["prompt_tokens"]
        assert r2["prefill_ms"] < r1["prefill_ms"] or r1["cache_n"] > 0

    def test_log_never_holds_prompt_or_completion_text(self, proxy_process: ProxyProcess) -> None:
        """After a chat and a tool request, the log file, /stats and /metrics have their
        records but none of the prompts, completions, tool arguments or the API key."""
        nonce = str(time.time_ns())
        api_key = f"sk-secret-{nonce}"
        client = _sdk(proxy_process.url, api_key=api_key)
        chat_prompt = f"Name three colours. ({nonce})"
        tool_prompt = f"What is the weather in Paris right now? ({nonce})"
        chat = _stream(
            client,
            model="gemma",
            messages=[{"role": "user", "content": chat_prompt}],
            max_tokens=16,
            temperature=0,
        )
        tool = _stream(
            client, model="gemma", messages=[{"role": "user", "content": tool_prompt}], **TOOL_ARGS
        )
        for result in (chat, tool):
            proxy_process.record(result.request_id, within=15)
        pages = [proxy_process.log_file.read_text()]
        for path in ("/stats", "/metrics"):
            with urllib.request.urlopen(proxy_process.admin_url + path, timeout=10) as resp:
                pages.append(resp.read().decode())
        assert chat.request_id in pages[0] and tool.request_id in pages[0]
        assert '"kinds"' in pages[1] and "gen_ai_server_time_to_first_token" in pages[2]
        secrets = {chat_prompt, tool_prompt, "Paris right now", api_key, '"city"'}
        # completions short enough to be any text ("Red") would match by chance
        secrets |= {text for text in (chat.content, tool.content) if len(text.strip()) >= 8}
        secrets |= {call["arguments"] for call in tool.tool_calls.values() if call["arguments"]}
        escaped = {json.dumps(secret)[1:-1] for secret in secrets}  # as inside a JSON string
        for page in pages:
            for secret in secrets | escaped:
                assert secret not in page


def _post_json(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _tokens_before(llama_server: LlamaServer, body: dict[str, Any], marker: str) -> int:
    """How many tokens of the prompt llama-server renders for ``body`` come before ``marker``
    (its own /apply-template and /tokenize)."""
    prompt = _post_json(llama_server.url + "/apply-template", body)["prompt"]
    head = prompt[: prompt.index(marker)]
    return len(_post_json(llama_server.url + "/tokenize", {"content": head})["tokens"])


def _nonce_tools(nonce: str) -> list[dict[str, Any]]:
    weather = json.loads(json.dumps(WEATHER_TOOL))
    weather["function"]["description"] += f" (catalogue {nonce})"
    return [weather, ARM_TOOL]


class TestSchemaAccounting:
    """Schema and tool-call accounting against the served model's own template and tokenizer."""

    def test_schema_tokens_cold_then_cached(
        self, proxy_process: ProxyProcess, llama_server: LlamaServer
    ) -> None:
        """A new schema is charged on the cold request and free on an identical repeat."""
        _occupy_slot(llama_server)
        nonce = str(time.time_ns())
        tools = _nonce_tools(nonce)
        kwargs: dict[str, Any] = {
            "model": "gemma",
            "messages": WEATHER_Q,
            **TOOL_ARGS,
            "tools": tools,
            "max_tokens": 8,
        }
        client = _sdk(proxy_process.url)
        cold = proxy_process.record(_stream(client, **kwargs).request_id, within=15)
        warm = proxy_process.record(_stream(client, **kwargs).request_id, within=15)
        # the independent count: llama-server's input_tokens with and without the tools
        body = {
            "messages": WEATHER_Q,
            "tools": tools,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        url = llama_server.url + "/v1/chat/completions/input_tokens"
        with_tools = _post_json(url, body)["input_tokens"]
        without = _post_json(url, {k: v for k, v in body.items() if k != "tools"})["input_tokens"]
        for r in (cold, warm):
            assert r["schema_tokens"] == with_tools - without > 0
            assert r["schema_tokens_source"] == "server"
            assert r["schema_tools"] == 2 and r["accounting_error"] is None
        # llama-server may restore a saved prompt (--cache-ram) sharing the tools block's
        # opening; the cold request can reuse at most the tokens before the nonce
        assert cold["cache_n"] <= _tokens_before(llama_server, body, nonce)
        assert cold["schema_cached"] is False and cold["prompt_n"] > cold["schema_tokens"]
        rate = cold["prefill_ms"] / cold["prompt_n"]
        # the schema's tokens past cache_n were paid at this request's rate: all of them,
        # less those of the tools block's opening a restored prompt may have covered
        paid_ms, tokens = cold["schema_prefill_ms"], cold["schema_tokens"]
        assert max(0, tokens - cold["cache_n"]) * rate * 0.98 <= paid_ms <= tokens * rate * 1.02
        if cold["cache_n"] == 0:
            assert paid_ms == pytest.approx(tokens * rate, rel=0.02)
        assert warm["cache_n"] > cold["schema_tokens"]
        assert warm["schema_cached"] is True and warm["schema_prefill_ms"] == 0
        assert warm["schema_saved_ms"] is not None and warm["schema_saved_ms"] > 0
        assert warm["schema_hash"] == cold["schema_hash"]

    def test_second_turn_reusing_the_system_turn_has_the_schema_cached(
        self, proxy_process: ProxyProcess, llama_server: LlamaServer
    ) -> None:
        """A two-turn tool conversation (call, then its result): llama-server reuses the
        first turn's prompt only up to its context checkpoint at the user message, just short
        of the system turn's end. The tools block ends before that (its position is on token
        boundaries, and the system turn's closing marker is not the tools' own), so the second
        turn has the schema cached, 0 ms, and no prefilled-again alarm. The call in the
        history is written here, so the test does not depend on what the model answers."""
        _occupy_slot(llama_server)
        tools = _nonce_tools(str(time.time_ns()))
        kwargs: dict[str, Any] = {**TOOL_ARGS, "model": "gemma", "tools": tools, "max_tokens": 8}
        client = _sdk(proxy_process.url)
        first = _stream(client, messages=WEATHER_Q, **kwargs)
        call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        history = [
            *WEATHER_Q,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": dict(call)},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
        ]
        second = _stream(client, messages=history, **kwargs)
        cold = proxy_process.record(first.request_id, within=15)
        warm = proxy_process.record(second.request_id, within=15)
        assert cold["schema_cached"] is False and cold["schema_prefilled_again"] is False
        assert 0 < warm["cache_n"] < cold["prompt_tokens"]  # the cache stopped early
        assert warm["schema_cached"] is True, warm
        assert warm["schema_prefill_ms"] == 0
        assert warm["schema_prefilled_again"] is False
        assert warm["accounting_error"] is None

    @pytest.mark.parametrize(
        ("dialect", "body"),
        [
            pytest.param(
                RESPONSES,
                {
                    "instructions": "You are a robot arm.",
                    "input": [
                        {
                            "role": "developer",
                            "content": [{"type": "input_text", "text": "Be brief."}],
                        },
                        {"role": "user", "content": "What is the weather in Paris?"},
                    ],
                    "tools": [
                        {"type": "function", **WEATHER_TOOL["function"]},
                        {"type": "function", **ARM_TOOL["function"], "strict": False},
                        {"type": "web_search"},
                    ],
                    "tool_choice": "auto",
                    "parallel_tool_calls": False,
                },
                id="responses",
            ),
            pytest.param(
                MESSAGES,
                {
                    "max_tokens": 16,
                    "system": [
                        {"type": "text", "text": "You are "},
                        {"type": "text", "text": "a robot."},
                    ],
                    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                    "tools": [
                        {
                            "name": "get_weather",
                            "input_schema": WEATHER_TOOL["function"]["parameters"],
                        },
                        {"name": "move_arm", "description": "Move the arm."},
                    ],
                    "tool_choice": {"type": "any"},
                },
                id="messages",
            ),
        ],
    )
    def test_chat_form_counts_as_the_apis_own_converter(
        self, llama_server: LlamaServer, dialect: Dialect, body: dict[str, Any]
    ) -> None:
        """The Chat Completions form the proxy renders to place the tools block counts, with
        and without the tools, exactly as llama-server's own converter of that API does:
        system text in blocks, developer messages, strict flags, dropped tool types and a
        tool_choice object included. (The proxy checks this per schema and trusts no
        position otherwise; this pins that the check passes on the real server.)"""
        assert dialect.system_turn and dialect.chat_form and dialect.count_path
        body = {"model": "gemma", "chat_template_kwargs": {"enable_thinking": False}, **body}
        turn = dialect.system_turn(body)
        chat = dialect.chat_form(turn)
        chat_url = llama_server.url + "/v1/chat/completions/input_tokens"
        api_url = llama_server.url + dialect.count_path

        def without(b: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in b.items() if k not in ("tools", "tool_choice")}

        assert (
            _post_json(chat_url, chat)["input_tokens"] == _post_json(api_url, turn)["input_tokens"]
        )
        assert (
            _post_json(chat_url, without(chat))["input_tokens"]
            == _post_json(api_url, without(turn))["input_tokens"]
        )

    @pytest.mark.parametrize(
        ("dialect", "body"),
        [
            pytest.param(
                RESPONSES,
                {
                    "instructions": "You are a robot.",
                    "tools": [{"type": "function", **WEATHER_TOOL["function"]}],
                    "input": [
                        {"role": "user", "content": "What is the weather in Paris?"},
                        {
                            "type": "function_call",
                            "call_id": "call_1",
                            "name": "get_weather",
                            "arguments": '{"city": "Paris"}',
                        },
                        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "It is 18 C."}],
                        },
                        {"role": "user", "content": [{"type": "input_text", "text": "Berlin?"}]},
                    ],
                },
                id="responses",
            ),
            pytest.param(
                MESSAGES,
                {
                    "max_tokens": 8,
                    "system": "You are a robot.",
                    "tools": [
                        {
                            "name": "get_weather",
                            "description": "Get the weather.",
                            "input_schema": WEATHER_TOOL["function"]["parameters"],
                        }
                    ],
                    "messages": [
                        {"role": "user", "content": "What is the weather in Paris?"},
                        {
                            "role": "assistant",
                            "content": [
                                {"type": "text", "text": "Let me check."},
                                {
                                    "type": "tool_use",
                                    "id": "tu_1",
                                    "name": "get_weather",
                                    "input": {"city": "Paris"},
                                },
                            ],
                        },
                        {
                            "role": "user",
                            "content": [
                                {"type": "tool_result", "tool_use_id": "tu_1", "content": "18 C"},
                                {"type": "text", "text": "And Berlin?"},
                            ],
                        },
                    ],
                },
                id="messages",
            ),
        ],
    )
    def test_a_conversation_counts_as_the_apis_own_converter(
        self, llama_server: LlamaServer, dialect: Dialect, body: dict[str, Any]
    ) -> None:
        """A whole multi-turn conversation (tool calls and their results, assistant text) in
        the Chat Completions form the proxy renders to attribute its prefill counts exactly as
        llama-server's own converter of that API counts it: the form the attribution trusts
        is the prompt llama-server evaluates."""
        assert dialect.chat_form and dialect.count_path
        body = {"model": "gemma", "chat_template_kwargs": {"enable_thinking": False}, **body}
        chat_url = llama_server.url + "/v1/chat/completions/input_tokens"
        own = _post_json(llama_server.url + dialect.count_path, body)["input_tokens"]
        assert _post_json(chat_url, dialect.chat_form(body))["input_tokens"] == own

    def test_another_agents_first_call_with_the_same_tools_is_not_prefilled_again(
        self, proxy_process: ProxyProcess, llama_server: LlamaServer
    ) -> None:
        """Two agents with their own system prompts and the same tools: the second agent's
        first call pays for the schema after a system prompt no earlier prompt had before it,
        so no cache could have served it: paid, not "prefilled again". The first agent's next
        question, sent with ``cache_prompt: false``, pays for a schema its first call held in
        the same place: prefilled again."""
        _occupy_slot(llama_server)
        kwargs: dict[str, Any] = {
            **TOOL_ARGS,
            "model": "gemma",
            "tools": _nonce_tools(str(time.time_ns())),
            "max_tokens": 4,
        }
        client = _sdk(proxy_process.url)
        ids = []
        for system, city, cache in (
            ("Kitchen robot.", "Paris", True),
            ("Warehouse drone.", "Rome", True),
            ("Kitchen robot.", "Oslo", False),
        ):
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"What is the weather in {city} right now?"},
            ]
            extra = {**kwargs["extra_body"], "cache_prompt": cache}
            ids.append(_stream(client, messages=messages, **{**kwargs, "extra_body": extra}))
        first, other, uncached = (proxy_process.record(r.request_id, within=15) for r in ids)
        assert first["schema_prefilled_again"] is False
        assert other["schema_cached"] is False and other["schema_prefill_ms"] > 0
        assert other["schema_prefilled_again"] is False, other
        assert uncached["prefix_kind"] == "branch" and uncached["cache_n"] == 0
        assert uncached["schema_prefilled_again"] is True
        flagged = {
            e["id"] for e in proxy_process.events() if e.get("event") == "schema_prefilled_again"
        }
        assert uncached["id"] in flagged and other["id"] not in flagged

    def test_busted_cache_is_reported(self, proxy_process: ProxyProcess) -> None:
        """The same schema prefilled again (cache_prompt false) is flagged and counted."""
        tools = _nonce_tools(str(time.time_ns()))
        kwargs: dict[str, Any] = {
            "model": "gemma",
            "messages": WEATHER_Q,
            **TOOL_ARGS,
            "tools": tools,
            "max_tokens": 4,
        }
        client = _sdk(proxy_process.url)
        first = proxy_process.record(_stream(client, **kwargs).request_id, within=15)
        busted = {**kwargs, "extra_body": {**kwargs["extra_body"], "cache_prompt": False}}
        again = proxy_process.record(_stream(client, **busted).request_id, within=15)
        assert first["schema_prefilled_again"] is False
        assert again["cache_n"] == 0 and again["schema_prefilled_again"] is True
        assert again["schema_prefill_ms"] > 0
        with urllib.request.urlopen(proxy_process.admin_url + "/stats", timeout=5) as resp:
            stats = json.loads(resp.read())
        schema = stats["schemas"]["by_hash"][again["schema_hash"]]
        assert schema["prefilled_again"] >= 1 and schema["calls"] >= 2
        flagged = [e for e in proxy_process.events() if e.get("event") == "schema_prefilled_again"]
        assert any(e["id"] == again["id"] for e in flagged)

    def test_tool_call_tokens(self, proxy_process: ProxyProcess, llama_server: LlamaServer) -> None:
        """tool_args_tokens is /tokenize of the arguments the client received (null without a
        call); the call's tokens are predicted_n when the turn ends with a call."""
        kwargs: dict[str, Any] = {"model": "gemma", "messages": WEATHER_Q, **TOOL_ARGS}
        result = _stream(_sdk(proxy_process.url), **kwargs)
        record = proxy_process.record(result.request_id, within=15)
        _assert_tool_record(record, result, TOOL_ARGS["tools"])
        assert record["accounting_error"] is None
        calls = list(result.tool_calls.values())
        if not calls:  # the model answered in text: nothing to count
            assert record["tool_args_tokens"] is None
            return
        tokens = sum(
            len(
                _post_json(
                    llama_server.url + "/tokenize",
                    {"content": call["arguments"], "add_special": False},
                )["tokens"]
            )
            for call in calls
        )
        assert record["tool_args_tokens"] == tokens
        assert record["tool_args_tokens_source"] == "server"
        if record["tool_call_tokens"] is not None and record["tool_call_tokens"] > 1:
            assert record["tool_decode_tok_s"] is not None and record["tool_decode_tok_s"] > 0


class TestMetricsReal:
    """A Prometheus scrape after real requests."""

    def test_metrics_after_real_requests(self, proxy_process: ProxyProcess) -> None:
        """After a streamed request, the TTFT histogram counts every streamed request in the
        log; llama-server's metrics are there."""
        from prometheus_client.parser import text_string_to_metric_families

        result = _stream(
            _sdk(proxy_process.url),
            model="gemma",
            messages=[{"role": "user", "content": "Say yes."}],
            max_tokens=4,
            temperature=0,
        )
        assert proxy_process.record(result.request_id)["ttft_ms"] is not None
        deadline = time.monotonic() + 10  # a record and its histogram sample land together
        while True:
            with urllib.request.urlopen(proxy_process.admin_url + "/metrics", timeout=10) as resp:
                text = resp.read().decode()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            counted = sum(
                s.value
                for s in families["gen_ai_server_time_to_first_token_seconds"].samples
                if s.name.endswith("_count")
            )
            records = proxy_process.records().values()
            with_ttft = [r for r in records if r["ttft_ms"] is not None]
            if counted == len(with_ttft) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert counted == len(with_ttft) > 0
        assert "llamacpp:prompt_tokens" in families
        assert families["timing_proxy_upstream_metrics_up"].samples[0].value == 1


class TestConnectionReuse:
    """llama-server closes the socket after every stream without saying so."""

    def test_alternating_streamed_and_plain_requests_never_fail(
        self, proxy_process: ProxyProcess
    ) -> None:
        """Thirty back-to-back requests, streamed and not in turn, all succeed (no 502 from a
        pooled socket that llama-server had closed)."""
        statuses = []
        for i in range(30):
            body = {
                "messages": [{"role": "user", "content": f"hi {i}"}],
                "max_tokens": 2,
                "stream": i % 2 == 0,
            }
            req = urllib.request.Request(
                proxy_process.url + "/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    resp.read()
                    statuses.append(resp.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
        assert statuses == [200] * 30
