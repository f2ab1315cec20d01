"""The relay against a fake llama-server on loopback: bytes, statuses, headers, outcomes."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.core.headers import REQUEST_ID_HEADER
from proxy.core.record import Kind, Outcome, Record
from proxy.core.stats import ALPHA
from proxy.serve.app import STATS
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import (
    DONE,
    PING,
    SSE_HEADERS,
    FakeUpstream,
    SeenRequest,
    all_recordings,
    chat_event,
    die_after,
    echo,
    hang_before_headers,
    json_response,
    load_recording,
    make_timings,
    replay,
    slow_steady,
    sse,
    stall_after,
)
from tests.fakes import Script as FakeScript

Proxied = tuple[FakeUpstream, ProxyUnderTest]

CHAT_BODY = orjson.dumps(
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
)


async def _wait_record(proxy: ProxyUnderTest, count: int = 1, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while len(proxy.captured.records) < count:
        assert time.monotonic() < deadline, "the proxy wrote no record"
        await asyncio.sleep(0.005)


async def _raw_request(
    url: str, body: bytes, path: str = "/v1/chat/completions"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


class TestReplayedRecordings:
    """Streams recorded from the real llama-server pass through unchanged."""

    @pytest.mark.parametrize("name", all_recordings())
    async def test_recording_is_relayed_byte_for_byte(self, proxied: Proxied, name: str) -> None:
        """Status, end-to-end headers and every body byte of a real response reach the agent;
        the record completes, or is ``upstream_error`` when llama-server answered an error."""
        upstream, proxy = proxied
        rec = load_recording(name)
        upstream.script = replay(rec)
        resp = await proxy.client.request(
            rec.request_method,
            rec.request_path,
            data=rec.request_body or None,
            headers={"Content-Type": "application/json"},
        )
        body = await resp.read()
        assert resp.status == rec.status
        assert body == rec.body
        for key in ("Content-Type", "Server", "X-Accel-Buffering"):
            assert resp.headers.get(key) == rec.header(key)
        await _wait_record(proxy)
        assert resp.headers[REQUEST_ID_HEADER] == proxy.captured.last.id
        assert proxy.captured.last.response_bytes == len(rec.body)
        expected = Outcome.UPSTREAM_ERROR if rec.status >= 400 else Outcome.COMPLETED
        assert proxy.captured.last.outcome is expected

    async def test_streamed_chat_record_matches_server_timings(self, proxied: Proxied) -> None:
        """A replayed stream's record carries exactly the timings of its last JSON event."""
        upstream, proxy = proxied
        rec = load_recording("chat_stream")
        upstream.script = replay(rec)
        resp = await proxy.client.post(rec.request_path, data=rec.request_body)
        await resp.read()
        await _wait_record(proxy)
        events = [e for e in rec.body.split(b"\n\n") if e.startswith(b"data: {")]
        timings = orjson.loads(events[-1][6:])["timings"]
        r = proxy.captured.last
        assert (r.prefill_ms, r.decode_ms, r.cache_n, r.prompt_n, r.predicted_n) == (
            timings["prompt_ms"],
            timings["predicted_ms"],
            timings["cache_n"],
            timings["prompt_n"],
            timings["predicted_n"],
        )
        assert r.kind is Kind.CHAT and r.stream is True
        assert r.ttft_ms is not None and r.ttfb_ms is not None and r.e2e_ms is not None
        assert r.ttfb_ms <= r.ttft_ms <= r.e2e_ms

    async def test_request_ids_are_distinct_64_bit_hex(self, proxied: Proxied) -> None:
        """Each request gets its own id, 16 lowercase hex digits, sent to the agent in the
        response header and used as the record's id."""
        upstream, proxy = proxied
        upstream.script = json_response(200, b'{"ok":true}')
        ids = []
        for _ in range(40):
            resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
            await resp.read()
            ids.append(resp.headers[REQUEST_ID_HEADER])
        await _wait_record(proxy, 40)
        assert len(set(ids)) == 40
        assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)
        assert [r.id for r in proxy.captured.records] == ids


class TestRequestForwarding:
    """What the agent sends reaches the upstream unchanged."""

    async def test_body_path_query_and_credentials_are_forwarded(self, proxied: Proxied) -> None:
        """The body bytes, Authorization and X-Api-Key arrive upstream exactly as sent."""
        upstream, proxy = proxied
        upstream.script = echo()
        body = b'{"messages":[{"role":"user","content":"h\xc3\xa9 \\u2028"}],  "max_tokens":1}'
        resp = await proxy.client.post(
            "/v1/chat/completions",
            data=body,
            headers={
                "Authorization": "Bearer sk-test",
                "X-Api-Key": "k1",
                "Content-Type": "application/json",
            },
        )
        seen = orjson.loads(await resp.read())
        assert base64.b64decode(seen["body_b64"]) == body
        headers = {k.lower(): v for k, v in seen["headers"]}
        assert headers["authorization"] == "Bearer sk-test"
        assert headers["x-api-key"] == "k1"
        assert headers["content-length"] == str(len(body))
        assert headers["accept-encoding"] == "identity"

    async def test_encoded_path_and_query_are_forwarded_verbatim(self, proxied: Proxied) -> None:
        """Percent-encoding in the path and query is not normalised on the way upstream."""
        upstream, proxy = proxied
        upstream.script = echo()
        reader, writer = await _raw_request(proxy.url, b"{}", path="/v1/a%20b/c?x=%2F&y=%41")
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
        seen = await upstream.wait_seen()
        assert seen.path_qs in ("/v1/a b/c?x=/&y=A", "/v1/a%20b/c?x=%2F&y=%41")
        assert upstream.seen[0]._request is not None
        assert upstream.seen[0]._request.raw_path == "/v1/a%20b/c?x=%2F&y=%41"

    async def test_hop_by_hop_request_headers_do_not_cross(self, proxied: Proxied) -> None:
        """Connection, headers it names, Keep-Alive, TE and Upgrade are not sent upstream."""
        upstream, proxy = proxied
        upstream.script = echo()
        resp = await proxy.client.get(
            "/health",
            headers={
                "Connection": "keep-alive, X-Secret-Hop",
                "X-Secret-Hop": "1",
                "Keep-Alive": "timeout=5",
                "TE": "trailers",
                "X-End-To-End": "yes",
            },
        )
        names = {k.lower() for k, _ in orjson.loads(await resp.read())["headers"]}
        assert "x-secret-hop" not in names
        assert "te" not in names and "keep-alive" not in names
        assert "x-end-to-end" in names

    async def test_hop_by_hop_response_headers_do_not_cross(self, proxied: Proxied) -> None:
        """Hop-by-hop response headers and those named by Connection are dropped."""
        upstream, proxy = proxied
        upstream.script = json_response(
            200,
            b"{}",
            headers=(
                ("Content-Type", "application/json"),
                ("Connection", "X-Hop"),
                ("X-Hop", "1"),
                ("Keep-Alive", "timeout=5, max=100"),
                ("X-Kept", "2"),
            ),
        )
        resp = await proxy.client.get("/props")
        assert await resp.read() == b"{}"
        assert "X-Hop" not in resp.headers and "Keep-Alive" not in resp.headers
        assert resp.headers["X-Kept"] == "2"

    async def test_non_json_body_is_forwarded_and_flagged(self, proxied: Proxied) -> None:
        """A body that is not JSON reaches the upstream unchanged and the record says why."""
        upstream, proxy = proxied
        upstream.script = json_response(
            400, b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'
        )
        resp = await proxy.client.post("/v1/chat/completions", data=b"{not json")
        assert resp.status == 400
        assert upstream.seen[0].body == b"{not json"
        await _wait_record(proxy)
        assert proxy.captured.last.analysis_error == "request_body_not_json"
        assert proxy.captured.last.status == 400

    async def test_body_over_limit_is_refused_without_contacting_upstream(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """A body over max_body_bytes gets an OpenAI-shaped 413 and never reaches the upstream."""
        upstream, server = fake
        proxy = await make_proxy(
            str(server.make_url("")).rstrip("/"), server={"max_body_bytes": 100}
        )
        resp = await proxy.client.post("/v1/chat/completions", data=b"x" * 101)
        assert resp.status == 413
        err = (await resp.json())["error"]
        assert set(err) == {"message", "type", "code"}
        assert err["code"] == "request_too_large"
        assert upstream.seen == []
        await _wait_record(proxy)
        assert proxy.captured.last.outcome is Outcome.REQUEST_TOO_LARGE


class TestFailures:
    """Failures become outcomes; the agent gets an error or a visibly truncated stream."""

    async def test_unreachable_upstream_gives_openai_shaped_502(
        self, make_proxy: ProxyFactory
    ) -> None:
        """With nothing listening upstream the agent gets 502 with an OpenAI error body whose
        message (also the record's error) names the upstream URL and the cause."""
        proxy = await make_proxy("http://127.0.0.1:9")
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        assert resp.status == 502
        err = (await resp.json())["error"]
        assert err["type"] == "server_error" and err["code"] == "upstream_unreachable"
        assert err["message"].startswith(
            "upstream unreachable: http://127.0.0.1:9/v1/chat/completions: "
        )
        assert err["message"].endswith("(ClientConnectorError)")
        assert proxy.captured.last.error == err["message"]
        assert resp.headers[REQUEST_ID_HEADER] == proxy.captured.last.id
        assert proxy.captured.last.outcome is Outcome.UPSTREAM_UNREACHABLE
        assert proxy.captured.last.status == 502

    async def test_upstream_dying_mid_stream_aborts_the_client(self, proxied: Proxied) -> None:
        """The agent gets the bytes sent so far, then a broken stream, never a clean end."""
        upstream, proxy = proxied
        first = chat_event({"role": "assistant", "content": None}) + chat_event({"content": "Hi"})
        upstream.script = die_after([first])
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        got = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in resp.content.iter_any():
                got += chunk
        assert got == first
        await _wait_record(proxy)
        r = proxy.captured.last
        assert r.outcome is Outcome.UPSTREAM_CLOSED_MID_STREAM
        assert r.ttft_ms is not None and r.prefill_ms is None

    async def test_header_timeout_gives_504_and_closes_upstream(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """No upstream headers within header_timeout_s: 504, and the upstream socket is closed."""
        upstream, server = fake
        upstream.script = hang_before_headers(30)
        proxy = await make_proxy(
            str(server.make_url("")).rstrip("/"), upstream={"header_timeout_s": 0.3}
        )
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        assert resp.status == 504
        assert (await resp.json())["error"]["code"] == "upstream_timeout"
        assert await upstream.seen[0].wait_connection_closed(within=2.0)
        assert proxy.captured.last.outcome is Outcome.UPSTREAM_TIMEOUT

    async def test_idle_upstream_mid_stream_is_cut(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """A stream silent for longer than idle_timeout_s is aborted both ways."""
        upstream, server = fake
        upstream.script = stall_after([chat_event({"content": "a"})], 30)
        proxy = await make_proxy(
            str(server.make_url("")).rstrip("/"), upstream={"idle_timeout_s": 0.3}
        )
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
        assert await upstream.seen[0].wait_connection_closed(within=2.0)
        await _wait_record(proxy)
        assert proxy.captured.last.outcome is Outcome.UPSTREAM_IDLE_TIMEOUT

    async def test_slow_but_steady_stream_outlives_idle_timeout(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """Events 0.05 s apart for 0.7 s pass an idle timeout of 0.4 s: no total deadline."""
        upstream, server = fake
        upstream.script = slow_steady(14, 0.05)
        proxy = await make_proxy(
            str(server.make_url("")).rstrip("/"), upstream={"idle_timeout_s": 0.4}
        )
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        body = await resp.read()
        assert body.endswith(DONE)
        await _wait_record(proxy)
        r = proxy.captured.last
        assert r.outcome is Outcome.COMPLETED
        assert r.e2e_ms is not None and r.e2e_ms > 600


class TestClientHangUp:
    """When the agent hangs up, the upstream connection closes at once (llama-server's cancel):
    the hang-up is the only thing that can close it within the wait (the upstream stays
    silent or streams far longer, and no deadline of the proxy's default config comes
    sooner)."""

    async def test_hang_up_before_headers_closes_upstream(self, proxied: Proxied) -> None:
        """An agent leaving during prefill closes the upstream socket, which the upstream
        (silent for 30 s) would have kept open."""
        upstream, proxy = proxied
        upstream.script = hang_before_headers(30)
        _, writer = await _raw_request(proxy.url, CHAT_BODY)
        seen = await upstream.wait_seen()
        writer.close()
        t_close = time.monotonic()
        assert await seen.wait_connection_closed(within=5.0)
        assert seen.closed_at is not None and seen.closed_at >= t_close
        await _wait_record(proxy)
        r = proxy.captured.last
        assert r.outcome is Outcome.CLIENT_CLOSED and r.ttfb_ms is None

    async def test_hang_up_mid_stream_closes_upstream(self, proxied: Proxied) -> None:
        """An agent leaving mid-stream closes the upstream socket before the upstream's
        stream (200 events over 10 s) ends."""
        upstream, proxy = proxied
        upstream.script = slow_steady(200, 0.05)
        reader, writer = await _raw_request(proxy.url, CHAT_BODY)
        await reader.readuntil(b"data: ")
        seen = await upstream.wait_seen()
        writer.close()
        t_close = time.monotonic()
        assert await seen.wait_connection_closed(within=5.0)
        assert seen.closed_at is not None and seen.closed_at >= t_close
        assert seen.writes < 200
        await _wait_record(proxy)
        r = proxy.captured.last
        assert r.outcome is Outcome.CLIENT_CLOSED and r.ttfb_ms is not None


@dataclass
class HeldOpen:
    """A fake upstream's stream that stays open ``hold_s`` after its last event, and the
    fake's own clock (``time.monotonic``) at the moment it began to end the stream."""

    events: bytes
    hold_s: float
    closing_at: float | None = None

    def script(self) -> FakeScript:
        async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
            resp = web.StreamResponse(headers=dict(SSE_HEADERS))
            await resp.prepare(request)
            await resp.write(self.events)
            await asyncio.sleep(self.hold_s)
            self.closing_at = time.monotonic()
            await resp.write_eof()
            return resp

        return script


class TestWhereTheRecordEnds:
    """A completed exchange ends at the last byte written to the agent, not when the
    upstream ends its stream (llama-server closes some time after its last event).

    The proxy's clock starts before the fake gets the request (``seen.received_at``), so
    ``received_at + e2e`` on the fake's clock is no earlier than the record's end."""

    async def test_upstream_held_open_after_its_last_event(self, proxied: Proxied) -> None:
        """The upstream keeps its connection 0.5 s after ``[DONE]``: the record ends
        before the upstream began to close, and not before the last event arrived."""
        upstream, proxy = proxied
        held = HeldOpen(load_recording("chat_stream").body, 0.5)
        upstream.script = held.script()
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        assert (await resp.read()).endswith(DONE)
        await _wait_record(proxy)
        r, obs = proxy.captured.last, proxy.captured.observations[-1]
        assert r.outcome is Outcome.COMPLETED and r.e2e_ms is not None
        assert held.closing_at is not None and obs is not None and obs.last_byte_s is not None
        assert upstream.seen[0].received_at + r.e2e_ms / 1000 < held.closing_at
        assert r.e2e_ms >= obs.last_byte_s * 1000

    async def test_agent_leaving_after_done_while_the_upstream_holds(
        self, proxied: Proxied
    ) -> None:
        """An agent that has ``[DONE]`` waits 0.3 s and hangs up while the upstream still
        holds its connection: a completed exchange, ended before the agent hung up."""
        upstream, proxy = proxied
        events = load_recording("chat_stream").body
        upstream.script = HeldOpen(events, 30).script()
        reader, writer = await _raw_request(proxy.url, CHAT_BODY)
        await reader.readuntil(DONE)
        await asyncio.sleep(0.3)
        writer.close()
        hung_up = time.monotonic()
        await _wait_record(proxy)
        r = proxy.captured.last
        assert r.outcome is Outcome.COMPLETED and r.e2e_ms is not None
        assert upstream.seen[0].received_at + r.e2e_ms / 1000 < hung_up

    async def test_upstream_ending_with_its_last_event(self, proxied: Proxied) -> None:
        """An upstream that ends right after its last event (nothing wrong): the record
        ends after that event arrived and was forwarded, as before."""
        upstream, proxy = proxied
        rec = load_recording("chat_stream")
        upstream.script = replay(rec)
        resp = await proxy.client.post(rec.request_path, data=rec.request_body)
        assert await resp.read() == rec.body
        await _wait_record(proxy)
        r, obs = proxy.captured.last, proxy.captured.observations[-1]
        assert r.outcome is Outcome.COMPLETED and r.e2e_ms is not None
        assert obs is not None and obs.last_byte_s is not None
        assert r.e2e_ms >= obs.last_byte_s * 1000
        assert r.ttft_ms is not None and r.ttft_ms <= r.e2e_ms


class TestObservation:
    """The analysis beside the relay."""

    async def test_chunking_and_pings_do_not_change_bytes_or_record(self, proxied: Proxied) -> None:
        """A stream cut into 7-byte writes with pings arrives intact and is analysed fully."""
        upstream, proxy = proxied
        events = [
            chat_event({"role": "assistant", "content": None}),
            chat_event({"content": "h\u00e9llo \u6f22"}),
            PING,
            chat_event(
                {},
                finish_reason="stop",
                timings=make_timings(
                    prompt_n=7, prompt_ms=70.0, predicted_n=3, predicted_ms=20.0, cache_n=5
                ),
            ),
            DONE,
        ]
        upstream.script = sse(events, chunking=7)
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        assert await resp.read() == b"".join(events)
        await _wait_record(proxy)
        r = proxy.captured.last
        assert (r.prefill_ms, r.cache_n, r.prompt_tokens, r.finish_reason) == (70.0, 5, 12, "stop")
        assert r.token_events == 1

    async def test_stats_reports_kinds_and_recent(self, proxied: Proxied) -> None:
        """/stats counts the request under its kind and lists it in recent."""
        upstream, proxy = proxied
        upstream.script = replay(load_recording("chat_stream"))
        resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
        await resp.read()
        await _wait_record(proxy)
        stats = await (await proxy.admin.get("/stats")).json()
        assert stats["requests"] == 1
        assert stats["kinds"]["chat"]["count"] == 1
        assert stats["kinds"]["chat"]["ttft_ms"]["p50"] == proxy.captured.last.ttft_ms
        assert stats["recent"][0]["id"] == proxy.captured.last.id
        assert upstream.seen and all(s.path_qs != "/stats" for s in upstream.seen)

    async def test_concurrent_stats_readers_share_one_build(
        self, proxied: Proxied, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Readers of /stats arriving together get the same, complete document from one
        build (in one go, from the windows' histograms: the median within ALPHA of the
        exact one); a record arriving later makes the next read rebuild it."""
        upstream, proxy = proxied
        stats = proxy.app[STATS]
        for i in range(3000):
            stats.add(
                Record(
                    id=f"r-{i}",
                    ts="t",
                    method="POST",
                    path="/v1/chat/completions",
                    kind=Kind.TOOL if i % 2 else Kind.CHAT,
                    ttft_ms=float(i),
                )
            )
        builds = []
        snapshot = stats.snapshot

        def counted() -> dict[str, Any]:
            builds.append(1)
            return snapshot()

        monkeypatch.setattr(stats, "snapshot", counted)
        resps = await asyncio.gather(*(proxy.admin.get("/stats") for _ in range(4)))
        bodies = [await r.read() for r in resps]
        assert all(r.status == 200 for r in resps)
        assert len(set(bodies)) == 1
        assert len(builds) == 1
        doc = orjson.loads(bodies[0])
        assert doc["requests"] == 3000
        assert doc["kinds"]["tool"]["ttft_ms"]["p50"] == pytest.approx(1500.0, rel=ALPHA)
        upstream.script = replay(load_recording("chat_stream"))
        await (await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)).read()
        await _wait_record(proxy)
        assert (await (await proxy.admin.get("/stats")).json())["requests"] == 3001
        assert len(builds) == 2


class TestUpstreamConnections:
    """How the proxy pools connections to the upstream."""

    async def test_stream_connection_closed_by_upstream_is_never_reused(
        self, proxied: Proxied
    ) -> None:
        """llama-server closes the socket after every event stream without saying so; the
        next request, streamed or not, must not land on that dead socket (no 502)."""
        upstream, proxy = proxied
        events = [
            chat_event({"role": "assistant", "content": None}),
            chat_event({"content": "a"}),
            chat_event({}, finish_reason="stop", timings=make_timings()),
            DONE,
        ]
        plain = json_response(200, b'{"choices":[],"timings":{"prompt_n":1}}')

        doomed: set[Any] = set()

        async def like_llama_server(request: Any, seen: Any) -> Any:
            if request.transport in doomed:
                # llama-server has already closed this socket: whatever the client writes
                # on it is lost, and it sees the connection close before any byte
                request.transport.close()
                return web.Response()
            if b'"stream":true' not in seen.body:
                return await plain(request, seen)
            resp = await sse(events)(request, seen)
            doomed.add(request.transport)
            return resp

        upstream.script = like_llama_server
        statuses = []
        for i in range(20):
            body = b'{"stream":true}' if i % 2 == 0 else b'{"stream":false}'
            resp = await proxy.client.post("/v1/chat/completions", data=body)
            await resp.read()
            statuses.append(resp.status)
        assert statuses == [200] * 20


class TestHeadWithBody:
    """A head whose body is not there yet is never held for it."""

    async def test_head_is_not_held_for_a_late_body(self, proxied: Proxied) -> None:
        """The upstream sends its head and only then, once the agent has that head, its body:
        the agent gets the head first (a proxy holding it for the body would never answer)."""
        upstream, proxy = proxied
        agent_has_head = asyncio.Event()

        async def head_then_body(request: web.Request, seen: Any) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = 2
            await resp.prepare(request)
            await agent_has_head.wait()
            await resp.write(b"{}")
            return resp

        upstream.script = head_then_body
        resp = await asyncio.wait_for(
            proxy.client.post("/v1/chat/completions", data=b'{"max_tokens":4}'), 5
        )
        agent_has_head.set()
        assert resp.status == 200
        assert await asyncio.wait_for(resp.read(), 5) == b"{}"


class TestRequestFactsAfterSending:
    """A body that asks for no stream is analysed after the request is on its way; its
    record is the same."""

    async def test_unreachable_upstream_record_has_the_bodys_facts(
        self, make_proxy: ProxyFactory
    ) -> None:
        """Even when the exchange ends at once (nothing listens upstream), the record holds
        what the body says: a tool turn, its model, no stream."""
        proxy = await make_proxy("http://127.0.0.1:9")
        body = orjson.dumps(
            {
                "model": "robot-brain",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "move_arm"}}],
                "stream": False,
            }
        )
        resp = await proxy.client.post("/v1/chat/completions", data=body)
        assert resp.status == 502
        record = proxy.captured.last
        assert (record.kind, record.model, record.stream) == (Kind.TOOL, "robot-brain", False)

    async def test_relayed_plain_request_record_has_the_bodys_facts(self, proxied: Proxied) -> None:
        """A relayed tool turn without ``stream``: the record's kind, model and tool-call
        check come from the body parsed after sending it."""
        upstream, proxy = proxied
        reply = orjson.dumps(
            {
                "choices": [
                    {
                        "finish_reason": "tool_calls",
                        "message": {
                            "tool_calls": [
                                {"function": {"name": "move_arm", "arguments": '{"x":1}'}}
                            ]
                        },
                    }
                ]
            }
        )
        upstream.script = json_response(200, reply)
        body = orjson.dumps(
            {
                "model": "robot-brain",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "move_arm"}}],
            }
        )
        resp = await proxy.client.post("/v1/chat/completions", data=body)
        assert await resp.read() == reply
        await _wait_record(proxy)
        record = proxy.captured.last
        assert (record.kind, record.model, record.stream) == (Kind.TOOL, "robot-brain", False)
        assert (record.tool_calls, record.tool_call_valid) == (1, True)
