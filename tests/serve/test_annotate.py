"""In-band annotation: the comment line's place in each API's stream, cut at every byte; the
relay that writes it (and nothing else); Server-Timing on small plain bodies; the header
that asks for it never reaching llama-server."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import time
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.annotate import ANCHORS, COMMENT_PREFIX, FIELDS, Splitter, comment
from proxy.core.headers import REQUEST_DROP, request_drop, request_headers
from proxy.core.record import Outcome, Record
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import (
    FakeUpstream,
    Recording,
    die_after,
    load_recording,
    replay,
    sse,
    typed_event,
)
from tests.profiles import examples

HEADER = "X-Timing-Proxy-Annotate"
NOTE = comment({"id": "0123456789abcdef", "prefill_ms": 1.5})
COMMENT_LINE = re.compile(rb"(?:^|(?<=\n\n)): timing-proxy ([^\n]*)\n\n")
MODEL = "gemma3"
TIMINGS = {
    "cache_n": 216,
    "prompt_n": 5,
    "prompt_ms": 41.2,
    "predicted_n": 30,
    "predicted_ms": 1010.5,
}


def responses_stream() -> list[bytes]:
    """A Responses tool call as llama-server streams it (one chunk per token, the final
    batch in one chunk, ``response.completed`` last, with ``timings``)."""
    fc, call = "fc_CkQl", "call_CkQl"
    head = {"id": "resp_0VKb", "object": "response", "status": "in_progress"}
    pieces = ["{", '"', "city", '":', ' "', "Paris", '"', "}"]
    done_item = {
        "id": fc,
        "type": "function_call",
        "status": "completed",
        "arguments": "".join(pieces),
        "call_id": call,
        "name": "get_weather",
    }
    usage = {
        "input_tokens": 221,
        "output_tokens": 30,
        "total_tokens": 251,
        "input_tokens_details": {"cached_tokens": 216},
    }
    completed = {
        "type": "response.completed",
        "response": {
            **head,
            "status": "completed",
            "model": MODEL,
            "output": [done_item],
            "usage": usage,
        },
        "timings": TIMINGS,
    }
    first = typed_event({"type": "response.created", "response": head}) + typed_event(
        {"type": "response.in_progress", "response": head}
    )
    added = {
        "type": "response.output_item.added",
        "item": {**done_item, "arguments": "", "status": "in_progress"},
    }
    deltas = [
        typed_event({"type": "response.function_call_arguments.delta", "delta": p, "item_id": fc})
        for p in pieces
    ]
    deltas[0] = typed_event(added) + deltas[0]
    final = typed_event({"type": "response.output_item.done", "item": done_item}) + typed_event(
        completed
    )
    return [first, *deltas, final]


def messages_stream() -> list[bytes]:
    """A Messages tool call as llama-server streams it: ``message_delta`` (the usage and
    stop reason) and ``message_stop`` in the final chunk, no ``timings``."""
    start = {
        "type": "message_start",
        "message": {
            "id": "chatcmpl-x",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"cache_read_input_tokens": 216, "input_tokens": 5, "output_tokens": 0},
        },
    }
    block = {"type": "tool_use", "id": "kJca", "name": "get_weather"}
    pieces = ["{", '"', "city", '":', ' "', "Paris", '"', "}"]
    deltas = [
        typed_event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
        )
        for p in pieces
    ]
    deltas[0] = (
        typed_event({"type": "content_block_start", "index": 0, "content_block": block}) + deltas[0]
    )
    final = (
        typed_event({"type": "content_block_stop", "index": 0})
        + typed_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 30},
            }
        )
        + typed_event({"type": "message_stop"})
    )
    return [typed_event(start), *deltas, final]


def recorded(name: str) -> tuple[str, list[bytes]]:
    rec = load_recording(name)
    return rec.request_path, [chunk for _, chunk in rec.chunks]


STREAMS: dict[str, tuple[str, list[bytes]]] = {
    "chat_stream": recorded("chat_stream"),
    "chat_stream_usage": recorded("chat_stream_usage"),
    "tool_stream": recorded("tool_stream"),
    "completions_stream": recorded("completions_stream"),
    "native_completion_stream": recorded("native_completion_stream"),
    "responses": ("/v1/responses", responses_stream()),
    "messages": ("/v1/messages", messages_stream()),
}
"""Every API's stream: the recorded ones of the real llama-server, and the two APIs without
a recording built from the wire protocol's shapes."""

API_OF = {
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
    "/completion": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}


PLACES: dict[str, tuple[str, bytes]] = {
    "chat_completions": ("before", b"data: [DONE]\n\n"),
    "completions": ("before", b"data: [DONE]\n\n"),
    "responses": ("after", b"event: response.completed\n"),
    "messages": ("before", b"event: message_stop\n"),
}
"""The specification, per API: the comment goes before or after the event that starts so;
without such an event, at the end."""


def expected_place(body: bytes, api: str) -> int:
    """Where the comment belongs, read off the whole body event by event."""
    where, first = PLACES[api]
    offset = 0
    for event in body.split(b"\n\n")[:-1]:
        end = offset + len(event) + 2
        if (event + b"\n\n").startswith(first):
            return end if where == "after" else offset
        offset = end
    return len(body)


def annotate(chunks: list[bytes], api: str, note: bytes = NOTE) -> tuple[bytes, list[int]]:
    """What the relay writes for these upstream reads: the splitter's output with ``note``
    at its place, and how many bytes were held back after each read."""
    splitter = Splitter(ANCHORS.get(api))
    out, held, spent = bytearray(), [], False
    for chunk in chunks:
        if spent:
            out += chunk
            continue
        now, rest = splitter.split(chunk)
        out += now
        if rest is not None:
            out += note + rest
            spent = True
        held.append(len(splitter.held))
    if not spent:
        tail, boundary = splitter.end()
        out += tail
        if boundary:
            out += note
    return bytes(out), held


def check(chunks: list[bytes], api: str) -> None:
    body = b"".join(chunks)
    out, held = annotate(chunks, api)
    assert out.count(COMMENT_PREFIX) == 1
    assert out.replace(NOTE, b"", 1) == body
    assert out.index(NOTE) == expected_place(body, api)
    anchor = ANCHORS.get(api)
    assert max(held) <= (len(anchor.start) - 1 if anchor is not None else 0)


class TestSplitter:
    """The comment's place, found in chunks cut anywhere."""

    @pytest.mark.parametrize("name", sorted(STREAMS))
    def test_as_read_from_the_server(self, name: str) -> None:
        """With the reads as the real server's were cut, the annotated stream minus the
        comment equals the stream, and the one comment sits at the API's place."""
        path, chunks = STREAMS[name]
        check(chunks, API_OF[path])

    @pytest.mark.parametrize("name", sorted(STREAMS))
    def test_cut_at_every_byte(self, name: str) -> None:
        """Two reads, cut at every byte position (the anchor straddling them included):
        the same bytes, the comment at the same place."""
        path, chunks = STREAMS[name]
        body = b"".join(chunks)
        for cut in range(len(body) + 1):
            check([body[:cut], body[cut:]], API_OF[path])

    @pytest.mark.parametrize("name", sorted(STREAMS))
    def test_one_byte_at_a_time(self, name: str) -> None:
        """Reads of one byte each: held-back bytes never exceed the anchor's length."""
        path, chunks = STREAMS[name]
        body = b"".join(chunks)
        check([body[i : i + 1] for i in range(len(body))], API_OF[path])

    @settings(max_examples=examples(200), deadline=None)
    @given(data=st.data())
    def test_any_cuts(self, data: st.DataObject) -> None:
        """Any number of reads cut anywhere, on any API's stream."""
        name = data.draw(st.sampled_from(sorted(STREAMS)))
        path, chunks = STREAMS[name]
        body = b"".join(chunks)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=12)))
        edges = [0, *cuts, len(body)]
        check([body[a:b] for a, b in itertools.pairwise(edges)], API_OF[path])

    def test_pings_and_lookalikes_are_not_anchors(self) -> None:
        """``[DONE]`` inside a token's text and keep-alive pings are no anchor: the comment
        goes before the real terminator."""
        events = [
            b":\n\n",
            b'data: {"choices":[{"delta":{"content":"data: [DONE]\\n\\ndata: [DONE]"}}]}\n\n',
            b":\n\n",
            b"data: [DONE]\n\n",
        ]
        check(events, "chat_completions")
        body = b"".join(events)
        assert annotate(events, "chat_completions")[0].endswith(NOTE + b"data: [DONE]\n\n")
        assert expected_place(body, "chat_completions") == body.rindex(b"data: [DONE]")

    def test_a_stream_cut_short_gets_no_comment(self) -> None:
        """A stream that ends mid-event (no anchor, no boundary) gets no comment, and the
        bytes held back are given back."""
        body = b'data: {"choices":[]}\n\ndata: [DO'
        for cut in range(len(body) + 1):
            out, _ = annotate([body[:cut], body[cut:]], "chat_completions")
            assert out == body

    def test_the_end_when_the_anchor_never_comes(self) -> None:
        """A stream that ended at a boundary without its anchor (a mid-stream error event)
        gets the comment at the end."""
        body = b'data: {"choices":[]}\n\ndata: {"error":{"code":500}}\n\n'
        assert annotate([body], "chat_completions")[0] == body + NOTE

    def test_comment_is_one_line(self) -> None:
        """The comment is one SSE comment line and its blank line, however odd the values."""
        line = comment({"id": "a\nb\r\u2028", "x": 1.5, "y": None})
        assert line.startswith(COMMENT_PREFIX) and line.endswith(b"\n\n")
        assert b"\n" not in line[:-2] and b"\r" not in line
        assert orjson.loads(line[len(COMMENT_PREFIX) : -2])["id"] == "a\nb\r\u2028"


class TestHeaderPolicy:
    """The annotate header is the proxy's: it never crosses."""

    def test_request_drop_adds_the_proxys_own(self) -> None:
        """``request_drop`` keeps every dropped header and adds the named one, in lower case;
        the default is unchanged."""
        drop = request_drop(HEADER)
        assert drop > REQUEST_DROP and HEADER.lower() in drop
        out = request_headers([(HEADER.upper(), "1"), ("Authorization", "Bearer t")], drop)
        assert list(out.items()) == [("Authorization", "Bearer t"), ("Accept-Encoding", "identity")]
        assert HEADER in request_headers([(HEADER, "1")])


# ------------------------------------------------------------------------------------------
# Through the relay

CHAT_BODY = orjson.dumps(
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
)


async def started(make_proxy: ProxyFactory, aiohttp_server: Any, **annotate: object) -> Any:
    upstream = FakeUpstream()
    server = await aiohttp_server(upstream.app)
    proxy = await make_proxy(str(server.make_url("")).rstrip("/"), annotate=annotate)
    return upstream, proxy


async def last_record(proxy: ProxyUnderTest, within: float = 5.0) -> Record:
    deadline = time.monotonic() + within
    while not proxy.captured.records:
        assert time.monotonic() < deadline, "the proxy wrote no record"
        await asyncio.sleep(0.005)
    return proxy.captured.last


def split_comment(body: bytes) -> tuple[bytes, dict[str, Any], int]:
    """The body without its one comment line, the comment's JSON, and where it was."""
    found = list(COMMENT_LINE.finditer(body))
    assert len(found) == 1, body
    match = found[0]
    return body[: match.start()] + body[match.end() :], orjson.loads(match[1]), match.start()


def assert_matches_record(note: dict[str, Any], record: Record) -> None:
    """Every field of the comment has the value the record has."""
    full = record.to_dict()
    assert {k: note[k] for k in FIELDS} == {k: full[k] for k in FIELDS}


class TestRelayAnnotates:
    """Annotated streams through the proxy: one comment, every other byte as sent."""

    @pytest.mark.parametrize("name", sorted(STREAMS))
    async def test_stream_with_header(
        self, make_proxy: ProxyFactory, aiohttp_server: Any, name: str
    ) -> None:
        """With the header at 1 (mode off): the stream minus the comment is the upstream's,
        the comment is at its place, its JSON equals the record, and the upstream never
        saw the header."""
        upstream, proxy = await started(make_proxy, aiohttp_server)
        path, chunks = STREAMS[name]
        upstream.script = sse(chunks)
        resp = await proxy.client.post(path, data=CHAT_BODY, headers={HEADER: "1"})
        body = await resp.read()
        original = b"".join(chunks)
        rest, note, at = split_comment(body)
        assert rest == original
        assert at == expected_place(original, API_OF[path])
        record = await last_record(proxy)
        assert record.outcome is Outcome.COMPLETED
        assert_matches_record(note, record)
        assert note["accounting"] == "none"  # accounting is off here
        assert record.response_bytes == len(original)  # the record counts llama-server's bytes
        assert HEADER not in upstream.seen[-1].headers

    @pytest.mark.parametrize("chunking", [1, 3, 7, 64])
    async def test_stream_cut_anywhere(
        self, make_proxy: ProxyFactory, aiohttp_server: Any, chunking: int
    ) -> None:
        """The upstream's writes cut into small pieces (the anchor split across reads):
        the same bytes and one comment, before ``[DONE]``."""
        upstream, proxy = await started(make_proxy, aiohttp_server, mode="sse-comment")
        path, chunks = STREAMS["tool_stream"]
        upstream.script = sse(chunks, chunking=chunking)
        resp = await proxy.client.post(path, data=CHAT_BODY)
        body = await resp.read()
        rest, note, at = split_comment(body)
        assert rest == b"".join(chunks)
        assert body[at:].endswith(b"\n\ndata: [DONE]\n\n")
        assert_matches_record(note, await last_record(proxy))

    async def test_mode_on_and_header_zero(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """Mode on annotates every stream; the header at 0 opts one request out, and is
        stripped all the same."""
        upstream, proxy = await started(make_proxy, aiohttp_server, mode="sse-comment")
        path, chunks = STREAMS["chat_stream"]
        upstream.script = sse(chunks)
        on = await (await proxy.client.post(path, data=CHAT_BODY)).read()
        off = await (await proxy.client.post(path, data=CHAT_BODY, headers={HEADER: "0"})).read()
        assert split_comment(on)[0] == off == b"".join(chunks)
        assert all(HEADER not in seen.headers for seen in upstream.seen)

    async def test_off_is_byte_identical(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """Mode off and no header: every byte as sent, no comment, no Server-Timing."""
        upstream, proxy = await started(make_proxy, aiohttp_server)
        for name in sorted(STREAMS):
            path, chunks = STREAMS[name]
            upstream.script = sse(chunks)
            resp = await proxy.client.post(path, data=CHAT_BODY)
            assert await resp.read() == b"".join(chunks)
            assert "Server-Timing" not in resp.headers
        rec = load_recording("chat_nostream")
        upstream.script = replay(rec)
        resp = await proxy.client.post(rec.request_path, data=rec.request_body)
        assert await resp.read() == rec.body
        assert "Server-Timing" not in resp.headers

    async def test_other_paths_are_never_annotated(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """A path of no model API (``/health``) is relayed as is even with mode on; the
        header is stripped there too."""
        upstream, proxy = await started(make_proxy, aiohttp_server, mode="sse-comment")
        rec = load_recording("health")
        upstream.script = replay(rec)
        resp = await proxy.client.get("/health", headers={HEADER: "1"})
        assert await resp.read() == rec.body
        assert "Server-Timing" not in resp.headers
        assert HEADER not in upstream.seen[-1].headers

    async def test_upstream_dies_mid_stream(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """A stream cut by the upstream gets no comment; the agent gets every byte the
        upstream sent, held-back ones included, and then the cut."""
        upstream, proxy = await started(make_proxy, aiohttp_server, mode="sse-comment")
        _, chunks = STREAMS["chat_stream"]
        body = b"".join(chunks)
        sent = body[: body.index(b"data: [DONE]") + len(b"data: [DO")]
        upstream.script = die_after([sent])
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        got = bytearray()
        with pytest.raises(aiohttp.ClientPayloadError):
            async for piece in resp.content.iter_any():
                got += piece
        assert bytes(got) == sent
        record = await last_record(proxy)
        assert record.outcome is Outcome.UPSTREAM_CLOSED_MID_STREAM


class TestServerTiming:
    """Non-streamed answers: a Server-Timing header when the body is small and sized."""

    @staticmethod
    def parse(value: str) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for metric in value.split(", "):
            name, *params = metric.split(";")
            out[name] = dict(p.split("=", 1) for p in params)
        return out

    @pytest.mark.parametrize("name", ["chat_nostream", "tool_nostream"])
    async def test_small_body(
        self, make_proxy: ProxyFactory, aiohttp_server: Any, name: str
    ) -> None:
        """The body is unchanged and Server-Timing carries the record's prefill, decode and
        (for a call) tool-call times."""
        upstream, proxy = await started(make_proxy, aiohttp_server)
        rec = load_recording(name)
        upstream.script = replay(rec)
        resp = await proxy.client.post(
            rec.request_path, data=rec.request_body, headers={HEADER: "1"}
        )
        assert await resp.read() == rec.body
        timing = self.parse(resp.headers["Server-Timing"])
        record = await last_record(proxy)
        assert record.prefill_ms is not None and record.decode_ms is not None
        assert float(timing["prefill"]["dur"]) == record.prefill_ms
        assert float(timing["decode"]["dur"]) == record.decode_ms
        assert timing["timing-proxy"]["desc"] == record.id
        if record.tool_call_ms is not None:
            assert "tool_call" in timing
        assert HEADER not in upstream.seen[-1].headers

    async def test_above_the_limit(self, make_proxy: ProxyFactory, aiohttp_server: Any) -> None:
        """A body one byte over ``server_timing_max_bytes`` is relayed as usual, without
        the header; 0 never holds a body."""
        rec = load_recording("chat_nostream")
        for limit in (len(rec.body) - 1, 0):
            upstream, proxy = await started(
                make_proxy, aiohttp_server, server_timing_max_bytes=limit
            )
            upstream.script = replay(rec)
            resp = await proxy.client.post(
                rec.request_path, data=rec.request_body, headers={HEADER: "1"}
            )
            assert await resp.read() == rec.body
            assert "Server-Timing" not in resp.headers

    async def test_without_content_length(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """A chunked plain body (size unknown) is relayed as usual, without the header."""
        rec = load_recording("chat_nostream")
        chunked = dataclasses.replace(
            rec, headers=[(k, v) for k, v in rec.headers if k.lower() != "content-length"]
        )
        upstream, proxy = await started(make_proxy, aiohttp_server, mode="sse-comment")
        upstream.script = replay(chunked)
        resp = await proxy.client.post(rec.request_path, data=rec.request_body)
        assert await resp.read() == rec.body
        assert "Content-Length" not in resp.headers
        assert "Server-Timing" not in resp.headers


def test_recordings_are_what_the_tests_assume() -> None:
    """The recorded streams end the way the anchors expect (a guard on the fixtures)."""
    for name in ("chat_stream", "tool_stream", "completions_stream"):
        rec: Recording = load_recording(name)
        assert rec.body.endswith(b"\n\ndata: [DONE]\n\n")
    assert load_recording("native_completion_stream").body.endswith(b"}\n\n")
