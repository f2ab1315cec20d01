"""Prompt-cache diagnostics through the proxy, on a loopback fake llama-server that renders
and tokenizes as tests/qwen3_toy.py says and answers Messages and Responses in
llama-server's shapes (ids, usage, the stream's events), its ``cache_n`` the tokens its
previous prompt shares with the new one.

A request naming an earlier response gets the API's own field (parsed by the official SDKs'
types); a request without the option gets the upstream's bytes unchanged.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.core.dialects import MESSAGES, RESPONSES
from proxy.core.record import Record
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.qwen3_toy import BOS, VOCAB, render_qwen3, toy_pieces
from tests.sdk_reference import (
    parse_anthropic_diagnostics,
    parse_message_start,
    parse_openai_diagnostics,
)

SYSTEM = "You are the controller of a robot arm. Be brief and exact. The time is 10:00."


@dataclass
class FakeLlama:
    """llama-server's look-ups and its Messages and Responses answers, on the toy tokenizer."""

    sent: list[bytes] = field(default_factory=list)
    """Every answer's body bytes, in order."""
    last: list[int] = field(default_factory=list)
    """The previous prompt's ids (BOS first): what the fake's cache holds."""
    count: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/apply-template", self._apply_template)
        app.router.add_post("/v1/messages", self._answer)
        app.router.add_post("/v1/responses", self._answer)
        return app

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        pieces = toy_pieces(body["content"])
        ids = [VOCAB.setdefault(p, len(VOCAB)) for p in pieces]
        if body.get("add_special"):
            return web.json_response({"tokens": [0] * BOS + ids})
        tokens = [{"id": i, "piece": p.decode()} for i, p in zip(ids, pieces, strict=True)]
        return web.json_response({"tokens": tokens})

    async def _apply_template(self, request: web.Request) -> web.Response:
        return web.json_response({"prompt": render_qwen3(await request.json())})

    def _evaluate(self, chat: dict[str, Any]) -> tuple[int, int]:
        """(prompt tokens, cached tokens) of ``chat``, its prompt now the cached one."""
        ids = [0] * BOS + [VOCAB.setdefault(p, len(VOCAB)) for p in toy_pieces(render_qwen3(chat))]
        shared = 0
        while shared < min(len(ids), len(self.last)) and ids[shared] == self.last[shared]:
            shared += 1
        self.last = ids
        return len(ids), min(shared, len(ids) - 1)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = request.path == "/v1/messages"
        dialect = MESSAGES if messages else RESPONSES
        assert dialect.chat_form is not None
        total, cached = self._evaluate(dialect.chat_form(body))
        self.count += 1
        if messages:
            events = _messages_events(f"chatcmpl-{self.count:032d}", total, cached)
        else:
            events = _responses_events(f"resp_{self.count:032d}", total, cached)
        if not body.get("stream"):
            if messages:
                whole = _messages_body(f"chatcmpl-{self.count:032d}", total, cached)
            else:
                whole = events[-1][1]["response"]
            data = orjson.dumps(whole)
            self.sent.append(data)
            return web.Response(body=data, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        raw = b"".join(
            b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"
            for name, obj in events
        )
        self.sent.append(raw)
        half = len(raw) // 2  # two writes: the answer's event may be cut between them
        await resp.write(raw[:half])
        await resp.write(raw[half:])
        await resp.write_eof()
        return resp


def _messages_body(rid: str, total: int, cached: int) -> dict[str, Any]:
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Done."}],
        "model": "gemma",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "cache_read_input_tokens": cached,
            "input_tokens": total - cached,
            "output_tokens": 3,
        },
    }


def _messages_events(rid: str, total: int, cached: int) -> list[tuple[str, dict[str, Any]]]:
    usage = {"cache_read_input_tokens": cached, "input_tokens": total - cached, "output_tokens": 0}
    start: dict[str, Any] = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "gemma",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Done."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _responses_events(rid: str, total: int, cached: int) -> list[tuple[str, dict[str, Any]]]:
    head = {"id": rid, "object": "response", "status": "in_progress"}
    message = {
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Done."}],
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }
    done = {
        "completed_at": 1,
        "created_at": 1,
        "id": rid,
        "model": "gemma",
        "object": "response",
        "output": [message],
        "status": "completed",
        "usage": {
            "input_tokens": total,
            "output_tokens": 3,
            "total_tokens": total + 3,
            "input_tokens_details": {"cached_tokens": cached},
        },
    }
    timings = {"cache_n": cached, "prompt_n": total - cached, "prompt_ms": 2.0 * (total - cached)}
    return [
        ("response.created", {"type": "response.created", "response": head}),
        ("response.in_progress", {"type": "response.in_progress", "response": head}),
        (
            "response.output_text.delta",
            {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Done."},
        ),
        ("response.output_item.done", {"type": "response.output_item.done", "item": message}),
        (
            "response.completed",
            {"type": "response.completed", "response": done, "timings": timings},
        ),
    ]


@pytest.fixture
async def fake_llama(aiohttp_server: Any) -> tuple[FakeLlama, TestServer]:
    """A started fake llama-server with the look-ups."""
    llama = FakeLlama()
    return llama, await aiohttp_server(llama.app())


async def started(make_proxy: ProxyFactory, server: TestServer) -> ProxyUnderTest:
    """The proxy with attribution on (the default for a user) in front of ``server``."""
    url = str(server.make_url("")).rstrip("/")
    return await make_proxy(url, accounting={"enabled": True, "attribution": True})


async def wait_record(proxy: ProxyUnderTest, count: int, within: float = 5.0) -> Record:
    """The ``count``-th record, once the proxy has written it."""
    deadline = time.monotonic() + within
    while len(proxy.captured.records) < count:
        assert time.monotonic() < deadline, f"only {len(proxy.captured.records)} records"
        await asyncio.sleep(0.005)
    return proxy.captured.records[count - 1]


def messages_body(clock: str = "10:00", **more: Any) -> dict[str, Any]:
    return {
        "model": "gemma",
        "max_tokens": 16,
        "system": SYSTEM.replace("10:00", clock),
        "messages": [{"role": "user", "content": "Where is the gripper now?"}],
        **more,
    }


def responses_body(clock: str = "10:00", **more: Any) -> dict[str, Any]:
    return {
        "model": "gemma",
        "max_output_tokens": 16,
        "instructions": SYSTEM.replace("10:00", clock),
        "input": [{"role": "user", "content": "Where is the gripper now?"}],
        **more,
    }


async def post(proxy: ProxyUnderTest, path: str, body: dict[str, Any]) -> tuple[bytes, Any]:
    """The answer's bytes and its response (read whole)."""
    resp = await proxy.client.post(path, json=body)
    assert resp.status == 200
    return await resp.read(), resp


def events(raw: bytes) -> dict[str, dict[str, Any]]:
    """The stream's events by name (the last of each name)."""
    out: dict[str, dict[str, Any]] = {}
    for block in raw.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        if b"event" in lines:
            out[lines[b"event"].decode()] = orjson.loads(lines[b"data"])
    return out


async def two_turns(
    proxy: ProxyUnderTest, path: str, make: Any, option: Any, stream: bool
) -> tuple[bytes, Record]:
    """Turn 1, then turn 2 with the clock moved naming turn 1's id: turn 2's bytes and
    record."""
    first, _ = await post(proxy, path, make())
    await wait_record(proxy, 1)
    previous = orjson.loads(first)["id"]
    body = make("10:01", stream=stream, **option(previous))
    raw, resp = await post(proxy, path, body)
    if not stream:
        assert int(resp.headers["Content-Length"]) == len(raw)
    return raw, await wait_record(proxy, 2)


def anthropic_option(previous: str) -> dict[str, Any]:
    return {"diagnostics": {"previous_message_id": previous}}


def openai_option(previous: str) -> dict[str, Any]:
    return {"prompt_cache_options": {"comparison_response_id": previous}}


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_messages_clock_change_is_system_changed(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory, stream: bool
) -> None:
    """A Messages turn naming the previous one after its system clock moved gets
    ``diagnostics.cache_miss_reason`` ``system_changed`` (in the body, or in the stream's
    ``message_start``) with the missed tokens the record's ``prefill_lost_tokens``."""
    llama, server = fake_llama
    proxy = await started(make_proxy, server)
    raw, record = await two_turns(proxy, "/v1/messages", messages_body, anthropic_option, stream)
    if stream:
        event = events(raw)["message_start"]
        answer = event["message"]["diagnostics"]
        diagnostics = parse_message_start(event).message.diagnostics
    else:
        answer = orjson.loads(raw)["diagnostics"]
        diagnostics = parse_anthropic_diagnostics(answer)
    assert diagnostics is not None and diagnostics.cache_miss_reason is not None
    reason = diagnostics.cache_miss_reason
    assert reason.type == "system_changed"
    assert record.prefill_cause == "system_prompt_changed"
    assert record.prefill_lost_tokens is not None and record.prefill_lost_tokens > 0
    assert reason.cache_missed_input_tokens == record.prefill_lost_tokens
    # every other byte is the upstream's: the answer is one member appended
    member = b',"diagnostics":' + orjson.dumps(answer)
    assert member in raw
    assert raw.replace(member, b"") == llama.sent[-1]


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_responses_clock_change_is_input_changed(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory, stream: bool
) -> None:
    """A Responses turn naming the previous one after its instructions' clock moved gets
    ``prompt_cache_diagnostics`` ``cache_miss`` (in the body, or in the ``response`` of
    ``response.completed``) with the missed tokens the record's ``prefill_lost_tokens``."""
    _, server = fake_llama
    proxy = await started(make_proxy, server)
    raw, record = await two_turns(proxy, "/v1/responses", responses_body, openai_option, stream)
    response = events(raw)["response.completed"]["response"] if stream else orjson.loads(raw)
    parsed = parse_openai_diagnostics(response["prompt_cache_diagnostics"])
    assert parsed.type == "cache_miss"
    assert parsed.reason == "input_changed"
    assert record.prefill_lost_tokens is not None and record.prefill_lost_tokens > 0
    assert parsed.cache_missed_tokens == record.prefill_lost_tokens
    ours = response["prompt_cache_diagnostics"]["timing_proxy"]
    assert ours["cause"] == "system_prompt_changed"
    if stream:  # at the fake's 2 ms a prompt token, from the event's own timings
        assert ours["missed_ms"] == pytest.approx(parsed.cache_missed_tokens * 2.0)


async def test_an_annotated_stream_gets_both(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory
) -> None:
    """A stream both annotated and asking for diagnostics gets the comment line and the
    answer in ``message_start``; every other byte is the upstream's."""
    llama, server = fake_llama
    proxy = await started(make_proxy, server)
    await post(proxy, "/v1/messages", messages_body())
    await wait_record(proxy, 1)
    resp = await proxy.client.post(
        "/v1/messages",
        json=messages_body(stream=True, **anthropic_option("chatcmpl-x")),
        headers={"X-Timing-Proxy-Annotate": "1"},
    )
    raw = await resp.read()
    answer = events(raw)["message_start"]["message"]["diagnostics"]
    assert answer == {"cache_miss_reason": {"type": "previous_message_not_found"}}
    comment = next(line for line in raw.split(b"\n") if line.startswith(b": timing-proxy "))
    member = b',"diagnostics":' + orjson.dumps(answer)
    assert raw.replace(member, b"").replace(comment + b"\n\n", b"") == llama.sent[-1]


async def test_an_unknown_id_is_not_found(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory
) -> None:
    """An id the proxy never relayed: Anthropic's ``previous_message_not_found`` and
    OpenAI's ``comparison_response_not_found``."""
    _, server = fake_llama
    proxy = await started(make_proxy, server)
    raw, _ = await post(proxy, "/v1/messages", messages_body(**anthropic_option("chatcmpl-x")))
    parsed = parse_anthropic_diagnostics(orjson.loads(raw)["diagnostics"])
    assert parsed.cache_miss_reason is not None
    assert parsed.cache_miss_reason.type == "previous_message_not_found"
    raw, _ = await post(
        proxy, "/v1/responses", responses_body(stream=True, **openai_option("resp_x"))
    )
    completed = events(raw)["response.completed"]["response"]
    parsed_openai = parse_openai_diagnostics(completed["prompt_cache_diagnostics"])
    assert parsed_openai.type == "comparison_response_not_found"


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_without_the_option_the_bytes_are_the_upstreams(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory, stream: bool
) -> None:
    """Requests that do not ask (with the diagnostics machinery on, and after responses it
    keeps) get exactly the upstream's bytes: no field, nothing reordered."""
    llama, server = fake_llama
    proxy = await started(make_proxy, server)
    for n, (path, make) in enumerate(
        [("/v1/messages", messages_body), ("/v1/responses", responses_body)] * 2
    ):
        raw, _ = await post(proxy, path, make(f"10:0{n}", stream=stream))
        assert raw == llama.sent[-1]
        assert b"diagnostics" not in raw
        await wait_record(proxy, n + 1)


async def test_an_unchanged_next_turn_says_nothing_was_missed(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory
) -> None:
    """A next turn that only appends: Messages' ``diagnostics`` is null, Responses'
    ``prompt_cache_diagnostics`` is ``cache_hit``; a first turn opting in with no id gets
    null."""
    _, server = fake_llama
    proxy = await started(make_proxy, server)
    first, _ = await post(
        proxy, "/v1/messages", messages_body(diagnostics={"previous_message_id": None})
    )
    assert orjson.loads(first)["diagnostics"] is None
    await wait_record(proxy, 1)
    following = messages_body(**anthropic_option(orjson.loads(first)["id"]))
    following["messages"] += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "And the wrist?"},
    ]
    raw, _ = await post(proxy, "/v1/messages", following)
    assert "diagnostics" in orjson.loads(raw)
    assert orjson.loads(raw)["diagnostics"] is None
    first, _ = await post(proxy, "/v1/responses", responses_body())
    await wait_record(proxy, 3)
    following = responses_body(stream=True, **openai_option(orjson.loads(first)["id"]))
    following["input"] += [
        {"type": "message", "role": "assistant", "content": "Done."},
        {"role": "user", "content": "And the wrist?"},
    ]
    raw, _ = await post(proxy, "/v1/responses", following)
    answer = events(raw)["response.completed"]["response"]["prompt_cache_diagnostics"]
    assert parse_openai_diagnostics(answer).type == "cache_hit"


async def test_the_kept_prompts_are_bounded_by_the_history(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory
) -> None:
    """The proxy keeps as many responses' prompts as the attribution's history: with two,
    after three responses the first is not found any more, the last one is."""
    _, server = fake_llama
    url = str(server.make_url("")).rstrip("/")
    proxy = await make_proxy(
        url, accounting={"enabled": True, "attribution": True, "attribution_history": 2}
    )
    ids = []
    for n in range(3):
        raw, _ = await post(proxy, "/v1/messages", messages_body(f"10:0{n}"))
        ids.append(orjson.loads(raw)["id"])
        await wait_record(proxy, n + 1)
    reasons = []
    for n, previous in enumerate((ids[0], ids[2])):
        raw, _ = await post(proxy, "/v1/messages", messages_body(**anthropic_option(previous)))
        reasons.append(orjson.loads(raw)["diagnostics"]["cache_miss_reason"]["type"])
        await wait_record(proxy, 4 + n)
    assert reasons == ["previous_message_not_found", "system_changed"]


async def test_a_turn_sent_at_once_finds_the_previous(
    fake_llama: tuple[FakeLlama, TestServer], make_proxy: ProxyFactory
) -> None:
    """A turn naming the response that just ended, sent before that response's record was
    handed off, still finds it (the records waiting are handed off first)."""
    _, server = fake_llama
    proxy = await started(make_proxy, server)
    raw, _ = await post(proxy, "/v1/messages", messages_body())
    following = messages_body("10:01", **anthropic_option(orjson.loads(raw)["id"]))
    raw, _ = await post(proxy, "/v1/messages", following)
    reason = orjson.loads(raw)["diagnostics"]["cache_miss_reason"]
    assert reason["type"] == "system_changed"
