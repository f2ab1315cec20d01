"""In-band annotation against the real llama-server: the clients agents use read the same
answers with and without the comment line, and a raw reader finds the proxy's numbers in it.

One proxy (``python -m proxy serve``, annotation off by default, accounting on) in front of
the session's llama-server; each request is sent twice, with ``X-Timing-Proxy-Annotate: 1``
and without (after a first, warming run: with the prompt cached both prefill alike, and at
temperature 0 they decode the same tokens). Ids, timestamps and llama-server's timings
differ between two runs, so streams are compared by structure, without them.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx_sse
import pytest
from openai import AsyncOpenAI, OpenAI
from pydantic import SecretStr

from proxy.commands.provision import LlamaServer
from proxy.core.annotate import FIELDS
from proxy.core.headers import REQUEST_ID_HEADER
from tests.conftest import ProxyProcess, proxy_in_front_of

pytestmark = pytest.mark.real

HEADER = "X-Timing-Proxy-Annotate"
ON = {HEADER: "1"}
COMMENT = re.compile(rb"(?:^|(?<=\n\n)): timing-proxy ([^\n]*)\n\n")
NO_THINKING = {"enable_thinking": False}
STOP = ["</tool_call>"]
PROMPT = "What is the weather in Paris right now?"
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": PARAMETERS,
        },
    }
]
CHAT: dict[str, Any] = {
    "model": "gemma",
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 24,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}
TOOL: dict[str, Any] = {
    **CHAT,
    "messages": [{"role": "user", "content": PROMPT}],
    "max_tokens": 48,
    "tools": CHAT_TOOLS,
    "parallel_tool_calls": False,
    "stop": STOP,
    "chat_template_kwargs": NO_THINKING,
}
RESPONSES: dict[str, Any] = {
    "model": "gemma",
    "input": PROMPT,
    "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}],
    "parallel_tool_calls": False,
    "max_output_tokens": 48,
    "temperature": 0,
    "stop": STOP,
    "chat_template_kwargs": NO_THINKING,
    "stream": True,
}
MESSAGES: dict[str, Any] = {
    "model": "gemma",
    "max_tokens": 48,
    "messages": [{"role": "user", "content": PROMPT}],
    "tools": [{"name": "get_weather", "input_schema": PARAMETERS}],
    "stop_sequences": STOP,
    "temperature": 0,
    "chat_template_kwargs": NO_THINKING,
    "stream": True,
}
NATIVE: dict[str, Any] = {
    "prompt": "The capital of France is",
    "n_predict": 12,
    "temperature": 0,
    "stream": True,
}
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", CHAT),
    "tool": ("/v1/chat/completions", TOOL),
    "responses": ("/v1/responses", RESPONSES),
    "messages": ("/v1/messages", MESSAGES),
    "completion": ("/completion", NATIVE),
}
VOLATILE = frozenset(
    {
        *("id", "created", "created_at", "completed_at", "timings", "system_fingerprint"),
        *("call_id", "item_id", "cached_tokens"),
    }
)
"""Keys whose values differ between two runs of the same request (ids, clocks)."""


@pytest.fixture(scope="module")
def proxy(llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The proxy as a user starts it, annotation off unless a request asks."""
    with proxy_in_front_of(llama_server.url, tmp_path_factory.mktemp("annotate")) as started:
        yield started


def structure(value: Any) -> Any:
    """``value`` without the keys that differ between runs: ids, clocks, and what the
    prompt cache held (Messages' ``input_tokens`` is the uncached part)."""
    if isinstance(value, dict):
        drop = VOLATILE
        if "cache_read_input_tokens" in value:
            drop = drop | {"cache_read_input_tokens", "input_tokens"}
        return {k: structure(v) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [structure(v) for v in value]
    return value


def events(body: bytes) -> list[tuple[str | None, Any]]:
    """The events of a raw stream as (event name, data's structure); comments are skipped,
    as a conforming parser does."""
    out: list[tuple[str | None, Any]] = []
    for block in body.split(b"\n\n"):
        name, data = None, []
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data.append(line[6:])
        if data:
            text = b"\n".join(data)
            out.append((name, text.decode() if text == b"[DONE]" else structure(json.loads(text))))
    return out


def post_raw(base: str, path: str, body: dict[str, Any], annotate: bool) -> tuple[bytes, str]:
    """A raw streamed request (httpx, as docs/annotate.md shows): the bytes and the id."""
    headers = ON if annotate else {}
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", base + path, json=body, headers=headers) as resp,
    ):
        assert resp.status_code == 200
        return b"".join(resp.iter_raw()), resp.headers[REQUEST_ID_HEADER]


def twice(run: Callable[[bool], Any]) -> tuple[Any, Any]:
    """Warm the prompt cache, then the run annotated and the run without."""
    run(False)
    return run(True), run(False)


def comment_of(body: bytes) -> tuple[bytes, dict[str, Any]]:
    found = list(COMMENT.finditer(body))
    assert len(found) == 1, body[-600:]
    match = found[0]
    return body[: match.start()] + body[match.end() :], json.loads(match[1])


class TestRawReader:
    """A raw reader finds the comment; everything else is the unannotated stream."""

    @pytest.mark.parametrize("name", sorted(REQUESTS))
    def test_comment_and_record(self, proxy: ProxyProcess, name: str) -> None:
        """One comment per stream; its fields equal the proxy's record of that request
        (the schema fields too, once the accounting had them); the stream minus the comment
        has the unannotated stream's events."""
        path, body = REQUESTS[name]
        (annotated, request_id), (plain, _) = twice(lambda on: post_raw(proxy.url, path, body, on))
        rest, note = comment_of(annotated)
        assert COMMENT.search(plain) is None
        assert events(rest) == events(plain)
        record = proxy.record(request_id)
        assert note["id"] == request_id
        assert {k: note[k] for k in FIELDS} == {k: record[k] for k in FIELDS}
        assert note["prefill_ms"] is not None or name == "messages"  # no timings there
        assert note["accounting"] in ("done", "pending", "none")
        if note["accounting"] == "done":
            for key in ("schema_tokens", "schema_cached", "schema_prefill_ms"):
                assert note[key] == record[key]
        if name in ("tool", "responses", "messages"):
            assert note["accounting"] != "none" and record["schema_tokens"] is not None
        print(f"\n{name}: ...{rest[-160:]!r}\n  {json.dumps(note)}")


class TestHttpxSse:
    """``httpx-sse`` (a conforming parser) yields the same events with and without."""

    @pytest.mark.parametrize("name", sorted(REQUESTS))
    def test_same_events(self, proxy: ProxyProcess, name: str) -> None:
        """Event names and data (by structure) are equal; the comment is no event."""
        path, body = REQUESTS[name]

        def run(on: bool) -> list[tuple[str, Any]]:
            with (
                httpx.Client(timeout=120) as client,
                httpx_sse.connect_sse(
                    client, "POST", proxy.url + path, json=body, headers=ON if on else {}
                ) as source,
            ):
                return [
                    (e.event, e.data if e.data == "[DONE]" else structure(json.loads(e.data)))
                    for e in source.iter_sse()
                ]

        annotated, plain = twice(run)
        assert annotated == plain and plain


def chat_result(chunks: list[Any]) -> dict[str, Any]:
    """What an agent takes from a streamed chat completion: text, calls, finish, usage."""
    text: list[str] = []
    calls: dict[int, tuple[str, str]] = {}
    finish, usage = None, None
    for chunk in chunks:
        usage = chunk.usage.model_dump() if chunk.usage is not None else usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            text.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                name, args = calls.get(call.index, ("", ""))
                fn = call.function
                calls[call.index] = (
                    name + (fn.name or "") if fn else name,
                    args + (fn.arguments or "") if fn else args,
                )
    return {"text": "".join(text), "calls": calls, "finish": finish, "usage": structure(usage)}


class TestOpenAI:
    """The ``openai`` SDK, sync and async, streamed chat and tool call."""

    @pytest.mark.parametrize("name", ["chat", "tool"])
    def test_sync(self, proxy: ProxyProcess, name: str) -> None:
        """Same text, tool calls, finish reason and usage with and without annotation."""
        _, body = REQUESTS[name]
        kwargs = {k: v for k, v in body.items() if k != "chat_template_kwargs"}
        extra = {"chat_template_kwargs": NO_THINKING} if "tools" in body else {}

        def run(on: bool) -> dict[str, Any]:
            with OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client:
                stream = client.chat.completions.create(
                    **kwargs, extra_body=extra, extra_headers=ON if on else None
                )
                return chat_result(list(stream))

        annotated, plain = twice(run)
        assert annotated == plain
        assert annotated["finish"] is not None and annotated["usage"] is not None
        if name == "tool":
            assert annotated["calls"] and annotated["finish"] == "tool_calls"

    @pytest.mark.parametrize("name", ["chat", "tool"])
    def test_async(self, proxy: ProxyProcess, name: str) -> None:
        """The async client: the same with and without annotation."""
        _, body = REQUESTS[name]
        kwargs = {k: v for k, v in body.items() if k != "chat_template_kwargs"}
        extra = {"chat_template_kwargs": NO_THINKING} if "tools" in body else {}

        async def arun(on: bool) -> dict[str, Any]:
            async with AsyncOpenAI(
                base_url=proxy.url + "/v1", api_key="unused", max_retries=0
            ) as client:
                stream = await client.chat.completions.create(
                    **kwargs, extra_body=extra, extra_headers=ON if on else None
                )
                return chat_result([chunk async for chunk in stream])

        annotated, plain = twice(lambda on: asyncio.run(arun(on)))
        assert annotated == plain
        assert annotated["finish"] is not None and annotated["usage"] is not None

    def test_responses(self, proxy: ProxyProcess) -> None:
        """The Responses API through the SDK: the same events and final response (output
        items, usage) with and without."""
        kwargs = {
            k: v
            for k, v in RESPONSES.items()
            if k not in ("stop", "chat_template_kwargs", "stream")
        }
        extra = {"stop": STOP, "chat_template_kwargs": NO_THINKING}

        def run(on: bool) -> Any:
            with OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client:
                stream = client.responses.create(
                    **kwargs, stream=True, extra_body=extra, extra_headers=ON if on else None
                )
                seen = list(stream)
            final = [e.response for e in seen if e.type == "response.completed"]
            assert len(final) == 1
            return [e.type for e in seen], structure(final[0].model_dump())

        annotated, plain = twice(run)
        assert annotated == plain
        assert annotated[1]["output"] and annotated[1]["usage"]["output_tokens"] > 0


class TestAnthropic:
    """The ``anthropic`` SDK's Messages stream."""

    def test_stream(self, proxy: ProxyProcess) -> None:
        """The same final message (blocks, stop reason, output tokens) with and without."""
        from anthropic import Anthropic

        kwargs = {
            k: v
            for k, v in MESSAGES.items()
            if k not in ("chat_template_kwargs", "stream", "temperature")
        }

        def run(on: bool) -> Any:
            with (
                Anthropic(base_url=proxy.url, api_key="unused", max_retries=0) as client,
                client.messages.stream(
                    **kwargs,
                    # the SDK has no temperature parameter any more: it goes in the body
                    extra_body={"temperature": 0, "chat_template_kwargs": NO_THINKING},
                    extra_headers=ON if on else None,
                ) as stream,
            ):
                kinds = [event.type for event in stream]
                message = stream.get_final_message()
            return kinds, structure(message.model_dump())

        annotated, plain = twice(run)
        assert annotated == plain
        assert annotated[1]["stop_reason"] is not None and annotated[1]["content"]


class TestLangChain:
    """LangChain's ChatOpenAI (a test dependency: ``langchain-openai``)."""

    def test_stream(self, proxy: ProxyProcess) -> None:
        """The same streamed text with and without annotation."""
        import langchain_openai

        def run(on: bool) -> str:
            model = langchain_openai.ChatOpenAI(
                base_url=proxy.url + "/v1",
                api_key=SecretStr("unused"),
                model="gemma",
                temperature=0,
                max_completion_tokens=24,
                default_headers=ON if on else None,
            )
            return "".join(str(chunk.content) for chunk in model.stream("Name three colours."))

        annotated, plain = twice(run)
        assert annotated == plain and annotated


def test_mode_on_by_config(llama_server: LlamaServer, tmp_path: Path) -> None:
    """``[annotate] mode = "sse-comment"`` annotates a stream without the header."""
    config = tmp_path / "config.toml"
    config.write_text('[annotate]\nmode = "sse-comment"\n')
    with proxy_in_front_of(llama_server.url, tmp_path / "proxy", config=config) as started:
        body, request_id = post_raw(started.url, "/v1/chat/completions", CHAT, annotate=False)
        _, note = comment_of(body)
        assert note["id"] == request_id
        assert body.endswith(b"\n\ndata: [DONE]\n\n")
