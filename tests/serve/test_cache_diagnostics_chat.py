"""Prompt-cache diagnostics on Chat Completions through the proxy, on the loopback fake
llama-server of tests/serve/test_cache_diagnostics_serve.py with llama-server's Chat
Completions answers added (its ids, ``usage``, ``timings``, the stream's chunks).

A request with ``prompt_cache_options.comparison_response_id`` (langchain4j's OpenAI client
sends it; the ``openai`` SDK through ``extra_body``) gets ``prompt_cache_diagnostics`` in the
body, or in the stream's chunk with the ``finish_reason`` (the usage chunk when the request
asked for one); a request without it gets the upstream's bytes unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.sdk_reference import parse_openai_diagnostics, sdks
from tests.serve.test_cache_diagnostics_serve import (
    SYSTEM,
    FakeLlama,
    openai_option,
    started,
    wait_record,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionStreamOptionsParam

STREAMS: dict[str, dict[str, Any]] = {
    "body": {},
    "stream": {"stream": True},
    "stream_usage": {"stream": True, "stream_options": {"include_usage": True}},
}


class FakeChatLlama(FakeLlama):
    """The fake llama-server answering Chat Completions too, on both paths."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        return app

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        total, cached = self._evaluate(body)
        self.count += 1
        rid = f"chatcmpl-{self.count:032d}"
        timings = {
            "cache_n": cached,
            "prompt_n": total - cached,
            "prompt_ms": 2.0 * (total - cached),
        }
        usage = {
            "completion_tokens": 3,
            "prompt_tokens": total,
            "total_tokens": total + 3,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if not body.get("stream"):
            data = orjson.dumps(_chat_body(rid, usage, timings))
            self.sent.append(data)
            return web.Response(body=data, content_type="application/json")
        options = body.get("stream_options") or {}
        chunks = _chat_chunks(rid, usage, timings, bool(options.get("include_usage")))
        raw = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
        raw += b"data: [DONE]\n\n"
        self.sent.append(raw)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cut = raw.index(b'"finish_reason":"') + 4  # the answer's chunk cut between two writes
        await resp.write(raw[:cut])
        await resp.write(raw[cut:])
        await resp.write_eof()
        return resp


def _chat_body(rid: str, usage: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
    return {
        "choices": [
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {"role": "assistant", "content": "Done."},
            }
        ],
        "created": 1,
        "model": "gemma",
        "system_fingerprint": "b0-unknown",
        "object": "chat.completion",
        "usage": usage,
        "id": rid,
        "timings": timings,
    }


def _chat_chunks(
    rid: str, usage: dict[str, Any], timings: dict[str, Any], include_usage: bool
) -> list[dict[str, Any]]:
    """llama-server's chunks: the timings ride on the ``finish_reason`` chunk, or on the
    usage chunk (empty ``choices``) when the request asked for one."""
    head = {"created": 1, "id": rid, "model": "gemma", "object": "chat.completion.chunk"}
    chunks = [
        {"choices": [{"finish_reason": None, "index": 0, "delta": d}], **head}
        for d in ({"role": "assistant", "content": None}, {"content": "Done."})
    ]
    finish: dict[str, Any] = {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}]}
    if include_usage:
        return [*chunks, finish | head, {"choices": [], **head, "usage": usage, "timings": timings}]
    return [*chunks, finish | head | {"timings": timings}]


@pytest.fixture
async def chat_llama(aiohttp_server: Any) -> tuple[FakeChatLlama, TestServer]:
    """A started fake llama-server with the look-ups and Chat Completions."""
    llama = FakeChatLlama()
    return llama, await aiohttp_server(llama.app())


def chat_body(clock: str = "10:00", **more: Any) -> dict[str, Any]:
    return {
        "model": "gemma",
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": SYSTEM.replace("10:00", clock)},
            {"role": "user", "content": "Where is the gripper now?"},
        ],
        **more,
    }


async def post(proxy: ProxyUnderTest, path: str, body: dict[str, Any]) -> bytes:
    """The answer's bytes, its ``Content-Length`` (when it has one) checked against them."""
    resp = await proxy.client.post(path, json=body)
    assert resp.status == 200
    raw = await resp.read()
    if "Content-Length" in resp.headers:
        assert int(resp.headers["Content-Length"]) == len(raw)
    return raw


def answered(raw: bytes) -> list[dict[str, Any]]:
    """The chunks of a stream (or the body) that carry ``prompt_cache_diagnostics``."""
    if not raw.startswith(b"data:"):
        return [orjson.loads(raw)] if b"prompt_cache_diagnostics" in raw else []
    datas = [block[5:] for block in raw.split(b"\n\n") if block.startswith(b"data:")]
    assert datas[-1].strip() == b"[DONE]"
    return [c for d in datas[:-1] if "prompt_cache_diagnostics" in (c := orjson.loads(d))]


@pytest.mark.parametrize("mode", list(STREAMS))
async def test_chat_clock_change_is_input_changed(
    chat_llama: tuple[FakeChatLlama, TestServer], make_proxy: ProxyFactory, mode: str
) -> None:
    """A Chat Completions turn naming the previous one (the ``openai`` SDK's ``extra_body``)
    after its system clock moved gets ``prompt_cache_diagnostics`` ``cache_miss``
    ``input_changed`` with the record's ``prefill_lost_tokens``: in the body, or on the
    stream's ``finish_reason`` chunk, or on its usage chunk when it asked for one."""
    _, server = chat_llama
    proxy = await started(make_proxy, server)
    sdks()  # loaded (and frozen) as the readers load it: tests/sdk_reference.py
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="-", max_retries=0) as client:
        first = await client.chat.completions.create(**chat_body())
        assert "prompt_cache_diagnostics" not in (first.model_extra or {})
        await wait_record(proxy, 1)
        extra = openai_option(first.id)
        if mode == "body":
            completion = await client.chat.completions.create(
                **chat_body("10:01"), extra_body=extra
            )
            carriers = [completion.model_extra or {}]
        else:
            usage: ChatCompletionStreamOptionsParam = {"include_usage": mode == "stream_usage"}
            stream = await client.chat.completions.create(
                **chat_body("10:01"), stream=True, stream_options=usage, extra_body=extra
            )
            chunks = [chunk async for chunk in stream]
            marked = [c for c in chunks if "prompt_cache_diagnostics" in (c.model_extra or {})]
            carriers = [c.model_extra or {} for c in marked]
            carrier = marked[0]
            if mode == "stream_usage":
                assert carrier.usage is not None and carrier.choices == []
            else:
                assert carrier.choices[0].finish_reason == "stop"
    record = await wait_record(proxy, 2)
    assert len(carriers) == 1
    parsed = parse_openai_diagnostics(carriers[0]["prompt_cache_diagnostics"])
    assert parsed.type == "cache_miss" and parsed.reason == "input_changed"
    assert record.prefill_cause == "system_prompt_changed"
    assert record.prefill_lost_tokens is not None and record.prefill_lost_tokens > 0
    assert parsed.cache_missed_tokens == record.prefill_lost_tokens
    ours = carriers[0]["prompt_cache_diagnostics"]["timing_proxy"]
    assert ours["missed_ms"] == pytest.approx(parsed.cache_missed_tokens * 2.0)


@pytest.mark.parametrize("mode", list(STREAMS))
async def test_chat_unknown_id_is_not_found_and_only_appended(
    chat_llama: tuple[FakeChatLlama, TestServer], make_proxy: ProxyFactory, mode: str
) -> None:
    """An id the proxy never relayed, on ``/chat/completions`` (no ``/v1``): one chunk (or
    the body) gets ``comparison_response_not_found`` appended as its last member; every
    other byte, ``[DONE]`` included, is the upstream's."""
    llama, server = chat_llama
    proxy = await started(make_proxy, server)
    body = chat_body(**STREAMS[mode], **openai_option("chatcmpl-x"))
    raw = await post(proxy, "/chat/completions", body)
    carriers = answered(raw)
    assert len(carriers) == 1
    answer = carriers[0]["prompt_cache_diagnostics"]
    assert parse_openai_diagnostics(answer).type == "comparison_response_not_found"
    member = b',"prompt_cache_diagnostics":' + orjson.dumps(answer)
    assert raw.count(member) == 1
    assert raw.replace(member, b"") == llama.sent[-1]
    assert raw.endswith(b"}\n\ndata: [DONE]\n\n") or mode == "body"


@pytest.mark.parametrize("mode", list(STREAMS))
async def test_chat_without_the_option_the_bytes_are_the_upstreams(
    chat_llama: tuple[FakeChatLlama, TestServer], make_proxy: ProxyFactory, mode: str
) -> None:
    """Chat Completions requests that do not ask (the machinery on, after responses it
    keeps, with another API's option, with ``prompt_cache_options`` naming no response)
    get exactly the upstream's bytes."""
    llama, server = chat_llama
    proxy = await started(make_proxy, server)
    anthropic = {"diagnostics": {"previous_message_id": "chatcmpl-x"}}
    modes = {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}
    for n, more in enumerate([{}, {}, anthropic, modes]):
        raw = await post(
            proxy, "/v1/chat/completions", chat_body(f"10:0{n}", **STREAMS[mode], **more)
        )
        assert raw == llama.sent[-1]
        assert b"prompt_cache_diagnostics" not in raw
        await wait_record(proxy, n + 1)


async def test_chat_first_turn_opting_in_gets_null_and_next_turn_a_hit(
    chat_llama: tuple[FakeChatLlama, TestServer], make_proxy: ProxyFactory
) -> None:
    """A first turn with ``comparison_response_id`` null gets ``prompt_cache_diagnostics``
    null; a next turn that only appends gets ``cache_hit`` (a Chat Completions id is kept
    like the other APIs' ids)."""
    _, server = chat_llama
    proxy = await started(make_proxy, server)
    raw = await post(proxy, "/v1/chat/completions", chat_body(**openai_option(None)))  # type: ignore[arg-type]
    first = orjson.loads(raw)
    assert "prompt_cache_diagnostics" in first and first["prompt_cache_diagnostics"] is None
    await wait_record(proxy, 1)
    following = chat_body(stream=True, **openai_option(first["id"]))
    following["messages"] += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "And the wrist?"},
    ]
    carriers = answered(await post(proxy, "/v1/chat/completions", following))
    assert [parse_openai_diagnostics(c["prompt_cache_diagnostics"]).type for c in carriers] == [
        "cache_hit"
    ]
