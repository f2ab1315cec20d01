"""The fake upstream and the recorded llama-server bytes behave as the relay tests assume."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.core.tracker import StreamTracker
from tests.fakes import (
    CHAT_PATH,
    DONE,
    LLAMA_ROLE_EVENT,
    RECORDINGS_DIR,
    FakeUpstream,
    Recording,
    all_recordings,
    chat_event,
    die_after,
    echo,
    firehose,
    hang_before_headers,
    llama_chat,
    llama_event_count,
    llama_plain_body,
    llama_stream,
    load_recording,
    replay,
    slow_steady,
    sse,
)

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]

EXPECTED_RECORDINGS = {
    "chat_nostream",
    "chat_stream",
    "chat_stream_usage",
    "completions_stream",
    "error_badjson",
    "error_context",
    "health",
    "models",
    "native_completion_stream",
    "tool_nostream",
    "tool_stream",
}


@pytest.fixture
async def fake_server(aiohttp_server: Any) -> AsyncIterator[tuple[FakeUpstream, TestServer]]:
    fake = FakeUpstream()
    server: TestServer = await aiohttp_server(fake.app)
    yield fake, server


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        yield s


def sse_events(body: bytes) -> list[bytes]:
    """Payloads of the ``data:`` events in an SSE body (comments skipped)."""
    out: list[bytes] = []
    for block in body.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[len(b"data: ") :])
    return out


def json_events(body: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e) for e in sse_events(body) if e != b"[DONE]"]


# --------------------------------------------------------------------------------------------
# The fake itself


@pytest.mark.parametrize("name", all_recordings())
async def test_replay_gives_recorded_status_and_bytes(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession, name: str
) -> None:
    """Replaying a recording yields its status, reason and exactly the concatenated chunks."""
    fake, server = fake_server
    rec = load_recording(name)
    fake.script = rec
    async with session.request(
        rec.request_method, server.make_url(rec.request_path), data=rec.request_body
    ) as resp:
        body = await resp.read()
        assert resp.status == rec.status
        assert resp.reason == rec.reason
        assert resp.headers.get("Content-Type") == rec.header("Content-Type")
        assert "Keep-Alive" not in resp.headers
    assert body == rec.body
    assert fake.seen[0].body == rec.request_body
    assert fake.seen[0].outcome == "completed"


async def test_replay_speed_one_keeps_recorded_timing(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """With speed=1 the last chunk arrives no earlier than its recorded offset."""
    fake, server = fake_server
    rec = load_recording("chat_stream")
    fake.script = replay(rec, speed=1.0)
    t0 = time.monotonic()
    async with session.post(server.make_url("/v1/chat/completions")) as resp:
        body = await resp.read()
    assert body == rec.body
    assert time.monotonic() - t0 >= rec.chunks[-1][0] * 0.95


async def test_replay_hop_by_hop_is_opt_in(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """replay(hop_by_hop=True) re-sends the recorded Keep-Alive header; framing stays aiohttp's."""
    fake, server = fake_server
    rec = load_recording("chat_stream")
    assert rec.header("Keep-Alive") is not None
    fake.script = replay(rec, hop_by_hop=True)
    async with session.post(server.make_url("/v1/chat/completions")) as resp:
        assert resp.headers.get("Keep-Alive") == rec.header("Keep-Alive")
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        assert await resp.read() == rec.body


async def test_sse_chunking_recuts_the_bytes(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """sse(chunking=n) delivers the same bytes in n-byte writes."""
    fake, server = fake_server
    events = [chat_event({"content": "héllo"}), DONE]
    fake.script = sse(events, chunking=7)
    async with session.post(server.make_url("/v1/chat/completions")) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        body = await resp.read()
    assert body == b"".join(events)
    assert fake.seen[0].writes == -(-len(body) // 7)


async def test_die_after_raises_payload_error(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """die_after drops the connection mid-body, so the client gets ClientPayloadError."""
    fake, server = fake_server
    first = chat_event({"role": "assistant", "content": None})
    fake.script = die_after([first])
    async with session.post(server.make_url("/v1/chat/completions")) as resp:
        assert resp.status == 200
        got = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in resp.content.iter_any():
                got += chunk
    assert got == first
    assert fake.seen[0].outcome == "died"


async def test_echo_returns_exact_request(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """echo reports method, path with query, raw headers and the body byte for byte."""
    fake, server = fake_server
    fake.script = echo()
    payload = b'{"messages": [ {"content":"caf\xc3\xa9"} ],\n "x":1}\xff'
    async with session.post(
        server.make_url("/v1/chat/completions?a=1&b=%20"),
        data=payload,
        headers={"X-Custom": "Yes", "Authorization": "Bearer k"},
    ) as resp:
        got = orjson.loads(await resp.read())
    assert base64.b64decode(got["body_b64"]) == payload
    assert got["method"] == "POST"
    assert got["path_qs"] == "/v1/chat/completions?a=1&b=%20"
    assert ["X-Custom", "Yes"] in got["headers"]
    assert fake.seen[0].headers["Authorization"] == "Bearer k"


async def test_client_closing_early_sets_closed(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """Closing the client mid-stream sets seen.closed promptly, with closed_at recorded."""
    fake, server = fake_server
    fake.script = slow_steady(200, 0.02)
    resp = await session.post(server.make_url("/v1/chat/completions"))
    await resp.content.readuntil(b"\n\n")
    seen = fake.seen[0]
    assert not seen.closed.is_set()
    t_close = time.monotonic()
    resp.close()
    await asyncio.wait_for(seen.closed.wait(), 2.0)
    assert seen.closed_at is not None
    assert seen.closed_at - t_close < 1.0
    assert seen.outcome in ("cancelled", "reset")
    assert seen.writes < 200


async def test_hang_before_headers_records_the_client_giving_up(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """A client timeout while the fake withholds headers sets closed (the handler is cancelled)."""
    fake, server = fake_server
    fake.script = hang_before_headers(30.0)
    with pytest.raises(asyncio.TimeoutError):
        await session.post(
            server.make_url("/v1/chat/completions"),
            timeout=aiohttp.ClientTimeout(total=0.2),
        )
    seen = await fake.wait_seen()
    await asyncio.wait_for(seen.closed.wait(), 2.0)
    assert seen.outcome == "cancelled"
    assert seen.writes == 0


async def test_firehose_is_held_back_by_a_reader_that_does_not_read(
    fake_server: tuple[FakeUpstream, TestServer], session: aiohttp.ClientSession
) -> None:
    """firehose stops making progress while nobody reads, and finishes once the client drains."""
    fake, server = fake_server
    count = 512  # 32 MiB: more than socket buffers plus aiohttp's read buffer can absorb
    fake.script = firehose(count=count)
    async with session.get(server.make_url("/v1/chat/completions")) as resp:
        await asyncio.sleep(0.3)
        seen = fake.seen[0]
        assert seen.writes < count
        assert seen.writing_paused()
        total = 0
        async for chunk in resp.content.iter_any():
            total += len(chunk)
    assert total == count * 65536 + len(DONE)
    assert seen.writes == count + 1
    assert not seen.writing_paused()


async def test_completed_request_connection_close_is_observable(
    fake_server: tuple[FakeUpstream, TestServer],
) -> None:
    """wait_connection_closed notices a keep-alive connection closing after the response ended."""
    fake, server = fake_server
    fake.script = sse([DONE])
    async with aiohttp.ClientSession() as s:
        async with s.post(server.make_url("/v1/chat/completions")) as resp:
            await resp.read()
        seen = fake.seen[0]
        assert seen.outcome == "completed"
        assert not seen.connection_is_closed()
    assert await seen.wait_connection_closed(within=2.0)
    assert seen.closed.is_set()


# --------------------------------------------------------------------------------------------
# llama_chat: the fast chat endpoint (also the relay benchmark's upstream)


def chat_request(tokens: int, stream: bool, **extra: Any) -> bytes:
    return orjson.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": stream}
        | extra
    )


async def llama_server(aiohttp_server: Any, **kwargs: Any) -> tuple[FakeUpstream, TestServer]:
    fake = FakeUpstream(llama_chat(**kwargs))
    return fake, await aiohttp_server(fake.app)


async def test_llama_chat_stream_is_llama_shaped(
    aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    """A streamed answer is the role event, max_tokens token events, the finish event with
    timings, [DONE] (llama_stream's bytes), and the connection closes after it."""
    _fake, server = await llama_server(aiohttp_server)
    async with session.post(server.make_url(CHAT_PATH), data=chat_request(5, True)) as resp:
        body = await resp.read()
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers.get("Connection") == "close"
    assert body == b"".join(llama_stream(5))
    assert body.startswith(LLAMA_ROLE_EVENT)
    assert body.endswith(DONE)
    events = json_events(body)
    assert len(events) + 1 == llama_event_count(5)
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-1]] == [
        " The",
        " quick",
        " brown",
        " fox",
        ",",
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["timings"]["predicted_n"] == 5


async def test_llama_chat_keep_streams_alive_keeps_the_connection(
    aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    """keep_streams_alive=True leaves out Connection: close after a stream."""
    _fake, server = await llama_server(aiohttp_server, keep_streams_alive=True)
    async with session.post(server.make_url(CHAT_PATH), data=chat_request(2, True)) as resp:
        await resp.read()
        assert "Connection" not in resp.headers


async def test_llama_chat_plain_answer_has_usage_and_timings(
    aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    """stream:false gets llama_plain_body: one JSON object, 645 bytes for 20 tokens."""
    _fake, server = await llama_server(aiohttp_server)
    async with session.post(server.make_url(CHAT_PATH), data=chat_request(20, False)) as resp:
        body = await resp.read()
        assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
    assert body == llama_plain_body(20)
    assert len(body) == 645
    obj = orjson.loads(body)
    assert obj["usage"]["completion_tokens"] == obj["timings"]["predicted_n"] == 20


async def test_llama_chat_paced_stream_stamps_token_events(
    aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    """With bench_interval_ms and bench_stamp every token event (and only those) carries the
    upstream's time.monotonic_ns() as t_ns, taken while the request ran."""
    _fake, server = await llama_server(aiohttp_server)
    before = time.monotonic_ns()
    body_in = chat_request(3, True, bench_interval_ms=1, bench_stamp=True)
    async with session.post(server.make_url(CHAT_PATH), data=body_in) as resp:
        body = await resp.read()
    after = time.monotonic_ns()
    events = json_events(body)
    stamps = [e["t_ns"] for e in events[1:-1]]
    assert len(stamps) == 3
    assert all(before <= t <= after for t in stamps)
    assert stamps == sorted(stamps)
    assert "t_ns" not in events[0]
    assert "t_ns" not in events[-1]


async def test_llama_chat_answers_404_elsewhere(
    aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    """Any other path or method gets llama-server's 404 JSON error."""
    _fake, server = await llama_server(aiohttp_server)
    async with session.get(server.make_url("/v1/models")) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == 404
    async with session.get(server.make_url(CHAT_PATH)) as resp:
        assert resp.status == 404


async def test_keep_seen_false_logs_nothing(
    aiohttp_server: Any, session: aiohttp.ClientSession
) -> None:
    """FakeUpstream(keep_seen=False) answers as usual but keeps ``seen`` empty."""
    fake = FakeUpstream(llama_chat(), keep_seen=False)
    server = await aiohttp_server(fake.app)
    async with session.post(server.make_url(CHAT_PATH), data=chat_request(2, False)) as resp:
        assert await resp.read() == llama_plain_body(2)
    assert fake.seen == []


@pytest.mark.parametrize("per_chunk", [1, 4])
def test_llama_stream_is_what_the_tracker_counts(per_chunk: int) -> None:
    """The tracker sees llama_stream(n) whole: every event, n token events, [DONE], timings
    (the benchmark's in-process step relies on it)."""
    events = llama_stream(50)
    chunks = [b"".join(events[i : i + per_chunk]) for i in range(0, len(events), per_chunk)]
    tracker = StreamTracker(time.perf_counter(), sse=True)
    for chunk in chunks:
        tracker.feed(chunk)
    obs = tracker.finish()
    assert obs.events == llama_event_count(50)
    assert obs.token_events == 50
    assert obs.done
    assert obs.timings is not None
    assert obs.analysis_error is None


# --------------------------------------------------------------------------------------------
# The recorded bytes


def test_all_expected_recordings_exist() -> None:
    """Every request in tests/record_llama.py has a recording, and the directory stays small."""
    assert set(all_recordings()) == EXPECTED_RECORDINGS
    assert sum(p.stat().st_size for p in RECORDINGS_DIR.iterdir()) < 1_000_000


def test_chat_stream_recording_shape() -> None:
    """chat_stream ends with [DONE] and its last JSON event carries the timings fields."""
    rec = load_recording("chat_stream")
    assert rec.status == 200
    assert rec.header("Content-Type") == "text/event-stream"
    assert rec.header("Transfer-Encoding") == "chunked"
    assert rec.body.endswith(b"data: [DONE]\n\n")
    events = json_events(rec.body)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert any("content" in e["choices"][0]["delta"] for e in events[1:])
    timings = events[-1]["timings"]
    for key in ("prompt_ms", "predicted_ms", "cache_n", "prompt_n", "predicted_n"):
        assert key in timings
    assert all("timings" not in e for e in events[:-1])


def test_chat_stream_usage_recording_shape() -> None:
    """With include_usage the last event has empty choices, usage, then timings."""
    events = json_events(load_recording("chat_stream_usage").body)
    last = events[-1]
    assert last["choices"] == []
    assert list(last)[-2:] == ["usage", "timings"]
    assert last["usage"]["completion_tokens"] == last["timings"]["predicted_n"]


def test_tool_stream_recording_shape() -> None:
    """tool_stream's tool_calls argument fragments concatenate to JSON with a city key."""
    rec = load_recording("tool_stream")
    assert rec.body.endswith(b"data: [DONE]\n\n")
    events = json_events(rec.body)
    calls = [
        tc for e in events if e["choices"] for tc in e["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert calls
    assert calls[0]["function"]["name"] == "get_weather"
    args = "".join(tc["function"].get("arguments", "") for tc in calls)
    assert "city" in orjson.loads(args)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "timings" in events[-1]


def test_nostream_recordings_are_single_json_objects() -> None:
    """chat_nostream and tool_nostream are one JSON object with timings and a Content-Length."""
    for name in ("chat_nostream", "tool_nostream"):
        rec = load_recording(name)
        assert rec.status == 200
        assert rec.header("Content-Length") == str(len(rec.body))
        obj = orjson.loads(rec.body)
        assert obj["object"] == "chat.completion"
        assert "timings" in obj
    msg = orjson.loads(load_recording("tool_nostream").body)["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"


def test_completion_recordings_done_marker() -> None:
    """/v1/completions ends with [DONE]; native /completion has no [DONE] but ends in timings."""
    assert load_recording("completions_stream").body.endswith(DONE)
    native = load_recording("native_completion_stream").body
    assert b"[DONE]" not in native
    assert "timings" in json_events(native)[-1]


@pytest.mark.parametrize(
    ("name", "err_type"),
    [("error_context", "exceed_context_size_error"), ("error_badjson", "invalid_request_error")],
)
def test_error_recordings_are_plain_json(name: str, err_type: str) -> None:
    """Errors come back as a 400 JSON body (not SSE) with the matching error type."""
    rec: Recording = load_recording(name)
    assert rec.status == 400
    assert (rec.header("Content-Type") or "").startswith("application/json")
    err = orjson.loads(rec.body)["error"]
    assert err["type"] == err_type
    assert err["code"] == 400
