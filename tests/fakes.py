"""A fake llama-server for relay tests.

``FakeUpstream`` is an aiohttp application with one catch-all route. Each test sets
``fake.script`` to decide how the next requests are answered: a ``Recording`` (replayed with no
delays), or one of the script factories below (``replay``, ``sse``, ``die_after``,
``hang_before_headers``, ``stall_after``, ``slow_steady``, ``json_response``, ``echo``,
``firehose``, ``llama_chat``). Every request is logged in ``fake.seen`` together with what
happened to its connection, so tests can check that the proxy forwarded the request unchanged and
that it closed the upstream connection when it should.

``llama_chat`` is also the relay benchmark's upstream (``bench/overhead/servers.py`` serves
``FakeUpstream(llama_chat(), keep_seen=False)`` in a process of its own): a fast chat completion
endpoint writing precomputed llama-shaped events (``LLAMA_ROLE_EVENT``, ``llama_token_event``,
``llama_final_event``, ``llama_plain_body``), as fast as possible or paced.

Every SSE event a test writes is framed by ``sse_frame``, ``sse_json`` or ``typed_event`` (or
built on them, as ``chat_event`` is), and every test clock is a ``FakeClock``.

Usage with pytest-aiohttp::

    fake = FakeUpstream()
    fake.script = sse([b"data: {}\\n\\n", DONE])
    server = await aiohttp_server(fake.app)   # handler_cancellation is on in TestServer
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from aiohttp import web
from multidict import CIMultiDict

RECORDINGS_DIR = Path(__file__).parent / "recordings"

#: Headers that describe the framing of one hop. ``replay`` never copies these: aiohttp frames
#: the replayed response itself.
FRAMING_HEADERS = frozenset({"transfer-encoding", "content-length"})
#: Hop-by-hop headers llama-server sends besides the framing ones.
HOP_BY_HOP_HEADERS = frozenset({"connection", "keep-alive"})

#: The headers llama-server puts on an SSE response (apart from framing and keep-alive).
SSE_HEADERS: tuple[tuple[str, str], ...] = (
    ("Access-Control-Allow-Origin", ""),
    ("Content-Type", "text/event-stream"),
    ("Server", "llama.cpp"),
    ("X-Accel-Buffering", "no"),
)

#: The headers llama-server puts on a plain JSON answer (apart from framing and keep-alive).
JSON_HEADERS: tuple[tuple[str, str], ...] = (
    ("Access-Control-Allow-Origin", ""),
    ("Content-Type", "application/json; charset=utf-8"),
    ("Server", "llama.cpp"),
)

DONE = b"data: [DONE]\n\n"
PING = b":\n\n"

Outcome = Literal["pending", "completed", "cancelled", "reset", "died"]


# --------------------------------------------------------------------------------------------
# A clock


class FakeClock:
    """A clock the test sets by hand: calling it answers ``now`` (seconds) and counts the read."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on."""
        self.now += seconds

    def ns(self) -> int:
        """The clock read as epoch nanoseconds (a wall clock such as ``time.time_ns``)."""
        return round(self() * 1_000_000_000)


# --------------------------------------------------------------------------------------------
# Recordings


@dataclass(frozen=True)
class Recording:
    """One request/response pair captured from a real llama-server by tests/record_llama.py."""

    name: str
    request_method: str
    request_path: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    chunks: list[tuple[float, bytes]]
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    request_body: bytes = b""

    @property
    def body(self) -> bytes:
        """The whole response body: every chunk, concatenated."""
        return b"".join(chunk for _, chunk in self.chunks)

    def header(self, name: str) -> str | None:
        """First response header called ``name`` (case-insensitive), or None."""
        lname = name.lower()
        return next((v for k, v in self.headers if k.lower() == lname), None)


def all_recordings() -> list[str]:
    """Names of every recording in tests/recordings, sorted."""
    return sorted(p.stem for p in RECORDINGS_DIR.glob("*.json"))


def load_recording(name: str) -> Recording:
    """Load tests/recordings/<name>.json."""
    data: dict[str, Any] = orjson.loads((RECORDINGS_DIR / f"{name}.json").read_bytes())
    req = data["request"]
    resp = data["response"]
    return Recording(
        name=data["name"],
        request_method=req["method"],
        request_path=req["path"],
        status=resp["status"],
        reason=resp["reason"],
        headers=[(k, v) for k, v in resp["headers"]],
        chunks=[(float(c["t"]), base64.b64decode(c["b64"])) for c in resp["chunks"]],
        request_headers=[(k, v) for k, v in req["headers"]],
        request_body=req["body"].encode(),
    )


# --------------------------------------------------------------------------------------------
# What the fake saw


@dataclass
class SeenRequest:
    """One request the fake received, and what became of its connection."""

    method: str
    path_qs: str
    headers: CIMultiDict[str]
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes
    received_at: float = field(default_factory=time.monotonic)
    #: Set when the connection closed while the script ran (the handler was cancelled, or a
    #: write found the peer gone), or when ``die_after`` closed it on purpose. For a script that
    #: completed, ``wait_connection_closed`` notices a close that comes later.
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    closed_at: float | None = None
    finished_at: float | None = None
    #: How the script ended: still running ("pending"), returned ("completed"), cancelled by
    #: aiohttp because the peer left ("cancelled"), a write hit a closed peer ("reset"), or
    #: ``die_after`` dropped the connection itself ("died").
    outcome: Outcome = "pending"
    #: Body writes that returned (``firehose``, ``slow_steady``, ``sse``, ``replay`` ...).
    writes: int = 0
    bytes_written: int = 0
    _request: web.BaseRequest | None = field(default=None, repr=False)

    def mark_closed(self, outcome: Outcome | None = None) -> None:
        """Record that the connection is gone (first call wins) and how the script ended."""
        if outcome is not None and self.outcome == "pending":
            self.outcome = outcome
        if self.closed.is_set():
            return
        self.closed_at = time.monotonic()
        self.closed.set()

    def connection_is_closed(self) -> bool:
        """True if the TCP connection this request arrived on is gone."""
        req = self._request
        if req is None:
            return True
        transport = req.transport
        return transport is None or transport.is_closing()

    def writing_paused(self) -> bool:
        """True while the fake's transport is paused for writing (the peer is not reading)."""
        req = self._request
        return req is not None and req.transport is not None and req.protocol.writing_paused

    async def wait_connection_closed(self, within: float = 5.0, poll: float = 0.005) -> bool:
        """Wait up to ``within`` s for the connection to close (also after the script completed).

        Returns False if it is still open then.
        """
        deadline = time.monotonic() + within
        while not self.closed.is_set():
            if self.connection_is_closed():
                self.mark_closed()
                break
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True


Script = Callable[[web.Request, SeenRequest], Awaitable[web.StreamResponse]]


async def _write(
    resp: web.StreamResponse, request: web.Request, seen: SeenRequest, data: bytes
) -> None:
    await resp.write(data)
    seen.writes += 1
    seen.bytes_written += len(data)


async def _start(
    request: web.Request,
    status: int = 200,
    headers: Sequence[tuple[str, str]] = SSE_HEADERS,
    reason: str | None = None,
) -> web.StreamResponse:
    resp = web.StreamResponse(status=status, reason=reason, headers=CIMultiDict(headers))
    await resp.prepare(request)
    return resp


# --------------------------------------------------------------------------------------------
# The fake


class FakeUpstream:
    """A fake llama-server: replays recordings, plus awkward shapes, and logs what it saw."""

    def __init__(self, script: Script | Recording | None = None, *, keep_seen: bool = True) -> None:
        """``script`` answers every request (default: llama-server's 404). ``keep_seen=False``
        keeps ``seen`` empty: for a long-running load (the benchmark) that must not grow."""
        self.script: Script | Recording = script if script is not None else not_found()
        self.keep_seen = keep_seen
        self.seen: list[SeenRequest] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = SeenRequest(
            method=request.method,
            path_qs=request.path_qs,
            headers=CIMultiDict(request.headers),
            raw_headers=list(request.raw_headers),
            body=body,
            _request=request,
        )
        if self.keep_seen:
            self.seen.append(seen)
        script = self.script
        if isinstance(script, Recording):
            script = replay(script)
        try:
            resp = await script(request, seen)
        except asyncio.CancelledError:
            # handler_cancellation: aiohttp cancels the handler when the peer goes away.
            seen.mark_closed("cancelled")
            raise
        except ConnectionResetError:
            # A write found the peer gone (handler_cancellation off, or it raced the cancel).
            seen.mark_closed("reset")
            raise
        seen.finished_at = time.monotonic()
        if seen.outcome == "pending":
            seen.outcome = "completed"
        return resp

    async def wait_seen(self, count: int = 1, within: float = 5.0) -> SeenRequest:
        """Wait until at least ``count`` requests arrived; return the ``count``-th one."""
        deadline = time.monotonic() + within
        while len(self.seen) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"fake upstream saw {len(self.seen)} requests, wanted {count}")
            await asyncio.sleep(0.005)
        return self.seen[count - 1]


# --------------------------------------------------------------------------------------------
# Scripts


def replay(rec: Recording, speed: float = 0.0, hop_by_hop: bool = False) -> Script:
    """Answer with a recording: same status, reason, headers and body chunks.

    ``speed=0`` writes the chunks back to back; ``speed=1`` keeps the recorded arrival times
    (``speed=2`` waits twice as long). Transfer-Encoding/Content-Length are never copied: aiohttp
    frames the body itself, with a Content-Length if the recording had one, chunked otherwise.
    ``Connection``/``Keep-Alive`` are dropped unless ``hop_by_hop`` is true (to test that a proxy
    strips them); a recorded ``Connection: close`` always makes the fake close the connection.
    """
    skip = FRAMING_HEADERS if hop_by_hop else FRAMING_HEADERS | HOP_BY_HOP_HEADERS
    headers = [(k, v) for k, v in rec.headers if k.lower() not in skip]
    had_length = rec.header("Content-Length") is not None
    conn = rec.header("Connection")
    closes = conn is not None and conn.lower() == "close"

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=rec.status, reason=rec.reason, headers=CIMultiDict(headers)
        )
        if had_length:
            resp.content_length = len(rec.body)
        if closes:
            resp.force_close()
        t0 = time.monotonic()
        await resp.prepare(request)
        for t, chunk in rec.chunks:
            if speed > 0:
                delay = t * speed - (time.monotonic() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
            await _write(resp, request, seen, chunk)
        await resp.write_eof()
        return resp

    return script


def sse(
    events: Sequence[bytes],
    delay: float = 0.0,
    chunking: int | None = None,
    status: int = 200,
    headers: Sequence[tuple[str, str]] = SSE_HEADERS,
) -> Script:
    """Stream arbitrary byte pieces with llama-style SSE headers.

    With ``chunking=None`` each item of ``events`` is one write; with ``chunking=n`` the
    concatenated bytes are re-cut into ``n``-byte writes (to split events, and UTF-8 sequences,
    across reads). ``delay`` seconds pass before every write.
    """
    data = b"".join(events)
    pieces = (
        list(events)
        if chunking is None
        else [data[i : i + chunking] for i in range(0, len(data), chunking)]
    )

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        resp = await _start(request, status, headers)
        for piece in pieces:
            if delay > 0:
                await asyncio.sleep(delay)
            await _write(resp, request, seen, piece)
        await resp.write_eof()
        return resp

    return script


def die_after(
    chunks: Sequence[bytes],
    headers: Sequence[tuple[str, str]] = SSE_HEADERS,
    delay: float = 0.0,
) -> Script:
    """Send headers and ``chunks``, then drop the connection: no terminating chunk, no clean EOF."""

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        resp = await _start(request, 200, headers)
        for chunk in chunks:
            if delay > 0:
                await asyncio.sleep(delay)
            await _write(resp, request, seen, chunk)
        transport = request.transport
        assert transport is not None
        transport.close()
        seen.mark_closed("died")
        return resp

    return script


def hang_before_headers(seconds: float, then: Script | None = None) -> Script:
    """Sleep ``seconds`` before sending anything, then run ``then`` (default: an empty stream).

    Models a request waiting in llama-server's queue: no status line, no bytes. If the proxy
    gives up meanwhile, ``seen.closed`` is set at that moment.
    """

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        if then is not None:
            return await then(request, seen)
        return await sse([DONE])(request, seen)

    return script


def stall_after(
    chunks: Sequence[bytes],
    seconds: float | asyncio.Event,
    tail: Sequence[bytes] = (),
    headers: Sequence[tuple[str, str]] = SSE_HEADERS,
) -> Script:
    """Send ``chunks``, go silent for ``seconds`` (or until the event is set: a test decides
    when) with the connection open, then send ``tail`` and end."""

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        resp = await _start(request, 200, headers)
        for chunk in chunks:
            await _write(resp, request, seen, chunk)
        if isinstance(seconds, asyncio.Event):
            await seconds.wait()
        else:
            await asyncio.sleep(seconds)
        for chunk in tail:
            await _write(resp, request, seen, chunk)
        await resp.write_eof()
        return resp

    return script


def slow_steady(n: int, interval: float, done: bool = True) -> Script:
    """Stream a llama-shaped chat: role+first token, then ``n - 1`` tokens ``interval`` apart.

    The last event is the finish chunk carrying ``timings`` and, if ``done``, ``[DONE]`` follows.
    Every event is one write (so ``seen.writes`` counts events).
    """

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        resp = await _start(request)
        await _write(
            resp,
            request,
            seen,
            chat_event({"role": "assistant", "content": None}) + chat_event({"content": "t0"}),
        )
        for i in range(1, n):
            await asyncio.sleep(interval)
            await _write(resp, request, seen, chat_event({"content": f" t{i}"}))
        await asyncio.sleep(interval)
        final = chat_event(
            {},
            finish_reason="stop",
            timings=make_timings(prompt_n=10, predicted_n=n + 1, predicted_ms=interval * n * 1000),
        )
        await _write(resp, request, seen, final + (DONE if done else b""))
        await resp.write_eof()
        return resp

    return script


def json_response(
    status: int, body: bytes, headers: Sequence[tuple[str, str]] = JSON_HEADERS
) -> Script:
    """A plain (Content-Length) response, like llama-server's non-stream answers and errors."""

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        resp = web.Response(status=status, body=body, headers=CIMultiDict(headers))
        seen.writes += 1
        seen.bytes_written += len(body)
        return resp

    return script


def not_found() -> Script:
    """llama-server's 404 for a path it does not serve (the fake's default script)."""
    return json_response(
        404, b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
    )


def echo() -> Script:
    """Answer 200 with JSON describing the request exactly as received.

    Keys: ``method``, ``path_qs``, ``headers`` (``[[name, value], ...]`` in raw order, decoded as
    latin-1), ``body_b64``.
    """

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        payload = {
            "method": seen.method,
            "path_qs": seen.path_qs,
            "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in seen.raw_headers],
            "body_b64": base64.b64encode(seen.body).decode(),
        }
        return await json_response(200, orjson.dumps(payload))(request, seen)

    return script


def firehose(chunk_size: int = 65536, count: int = 64, done: bool = True) -> Script:
    """Write ``count`` SSE events of exactly ``chunk_size`` bytes each, as fast as allowed.

    ``seen.writes`` counts the writes that completed, and ``seen.writing_paused()`` tells whether
    the fake is blocked right now, so a test can show that a slow reader holds the upstream back.
    """
    overhead = len(b'data: {"pad":""}\n\n')
    if chunk_size <= overhead:
        raise ValueError(f"chunk_size must be > {overhead}")
    event = b'data: {"pad":"' + b"x" * (chunk_size - overhead) + b'"}\n\n'

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        resp = await _start(request)
        for _ in range(count):
            await _write(resp, request, seen, event)
        if done:
            await _write(resp, request, seen, DONE)
        await resp.write_eof()
        return resp

    return script


# --------------------------------------------------------------------------------------------
# SSE writers: every event a test writes is framed here


def sse_frame(payload: bytes, event: str | None = None) -> bytes:
    """One SSE event: an ``event:`` line when ``event`` is given, the ``data:`` line holding
    ``payload`` as it is, and the blank line that ends the event."""
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + b"data: " + payload + b"\n\n"


def sse_json(obj: Any, event: str | None = None) -> bytes:
    """One SSE event whose data is ``obj`` as compact JSON, as llama-server writes it."""
    return sse_frame(orjson.dumps(obj), event)


def typed_event(obj: dict[str, Any]) -> bytes:
    """One event of the Responses or Messages API as llama-server writes it: the ``event:``
    line names the data's ``type``."""
    return sse_json(obj, str(obj["type"]))


# --------------------------------------------------------------------------------------------
# llama-shaped event builders


def make_timings(
    prompt_n: int = 10,
    prompt_ms: float = 20.0,
    predicted_n: int = 5,
    predicted_ms: float = 40.0,
    cache_n: int = 0,
) -> dict[str, Any]:
    """A ``timings`` object with llama-server's key order and derived ratios."""
    steps = predicted_n - 1
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps > 0 else 0.0,
        "predicted_per_second": 1000.0 * steps / predicted_ms
        if predicted_ms and steps > 0
        else 0.0,
    }


def chat_event(
    delta: dict[str, Any],
    finish_reason: str | None = None,
    timings: dict[str, Any] | None = None,
    chat_id: str = "chatcmpl-fakefakefakefakefakefakefakefake",
    created: int = 1764471600,
) -> bytes:
    """One ``data: {...}\\n\\n`` chat.completion.chunk event, compact, llama key order."""
    obj: dict[str, Any] = {
        "choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}],
        "created": created,
        "id": chat_id,
        "model": "gemma-3-270m-q4_k_m.gguf",
        "system_fingerprint": "b0-fake",
        "object": "chat.completion.chunk",
    }
    if timings is not None:
        obj["timings"] = timings
    return sse_json(obj)


# --------------------------------------------------------------------------------------------
# A fast llama-server chat endpoint (the relay benchmark's upstream, and a script for tests)
#
# The events are precomputed bytes (compact JSON, key order of llama-server's chat completion
# chunks) so that the fake can write them as fast as a relay can read them.

_LLAMA_ID = b"chatcmpl-A02QtP5EbemMQDC05JRPzJTCrKUnGAiK"
_LLAMA_TAIL = (
    b'"created":1796010009,"id":"'
    + _LLAMA_ID
    + b'","model":"m","system_fingerprint":"b0","object":"chat.completion.chunk"'
)
_LLAMA_TOKENS = (
    b'" The"',
    b'" quick"',
    b'" brown"',
    b'" fox"',
    b'","',
    b'" jumps"',
    b'"\\n"',
    b'" over"',
    b'" 12"',
    b'"!"',
    b'" lazy"',
    b'" dog"',
)
#: The first event of a ``llama_chat`` stream: the assistant role, no content.
LLAMA_ROLE_EVENT = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant",'
    b'"content":null}}],' + _LLAMA_TAIL + b"}\n\n"
)
#: The token events a ``llama_chat`` stream cycles through.
LLAMA_TOKEN_EVENTS = tuple(
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
    + t
    + b"}}],"
    + _LLAMA_TAIL
    + b"}\n\n"
    for t in _LLAMA_TOKENS
)
#: The path ``llama_chat`` answers (any other path or method gets llama-server's 404).
CHAT_PATH = "/v1/chat/completions"


def _llama_timings(n: int) -> bytes:
    return (
        b'"timings":{"cache_n":0,"prompt_n":40,"prompt_ms":194.973,'
        b'"prompt_per_token_ms":4.874325,"prompt_per_second":205.156611,'
        b'"predicted_n":%d,"predicted_ms":%.3f,"predicted_per_token_ms":24.07,'
        b'"predicted_per_second":41.539}' % (n, n * 24.07)
    )


def llama_final_event(n: int) -> bytes:
    """The finish event of a ``n``-token stream: ``finish_reason`` length and ``timings``."""
    return (
        b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],'
        + _LLAMA_TAIL
        + b","
        + _llama_timings(n)
        + b"}\n\n"
    )


def llama_token_event(i: int) -> bytes:
    """Token event number ``i`` (0-based) of a ``llama_chat`` stream."""
    return LLAMA_TOKEN_EVENTS[i % len(LLAMA_TOKEN_EVENTS)]


def stamped_token_event(i: int) -> bytes:
    """A token event carrying the upstream's CLOCK_MONOTONIC (``"t_ns"``), taken just now."""
    return (
        b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
        + _LLAMA_TOKENS[i % len(_LLAMA_TOKENS)]
        + b"}}],"
        + _LLAMA_TAIL
        + b',"t_ns":%d}\n\n' % time.monotonic_ns()
    )


def llama_plain_body(n: int) -> bytes:
    """The ``stream:false`` answer for ``max_tokens=n``: one JSON object with usage and
    timings (645 bytes for 20 tokens)."""
    content = b"".join(_LLAMA_TOKENS[i % len(_LLAMA_TOKENS)][1:-1] for i in range(n))
    return (
        b'{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant",'
        b'"content":"' + content + b'"}}],"created":1796010011,"model":"m",'
        b'"system_fingerprint":"b0","object":"chat.completion","usage":{'
        b'"completion_tokens":%d,"prompt_tokens":40,"total_tokens":%d,'
        b'"prompt_tokens_details":{"cached_tokens":0}},"id":"'
        % (n, n + 40)
        + _LLAMA_ID
        + b'",'
        + _llama_timings(n)
        + b"}"
    )


def llama_event_count(n: int) -> int:
    """SSE events in a stream of ``n`` tokens: role, n tokens, finish+timings, [DONE]."""
    return n + 3


def llama_stream(n: int) -> list[bytes]:
    """The whole unpaced stream of ``n`` tokens, one bytes object per event."""
    return [LLAMA_ROLE_EVENT, *(llama_token_event(i) for i in range(n)), llama_final_event(n), DONE]


async def _write_tokens(resp: web.StreamResponse, n: int) -> None:
    write = resp.write
    events = LLAMA_TOKEN_EVENTS
    k = len(events)
    for i in range(n):
        await write(events[i % k])


async def _write_paced_tokens(
    resp: web.StreamResponse, n: int, interval: float, stamp: bool
) -> None:
    write = resp.write
    sleep = asyncio.sleep
    make = stamped_token_event if stamp else llama_token_event
    for i in range(n):
        await sleep(interval)
        await write(make(i))


def llama_chat(keep_streams_alive: bool = False) -> Script:
    """Answer ``POST /v1/chat/completions`` like llama-server, fast (any other request: 404).

    ``stream:true``: the role event, ``max_tokens`` token events, the finish event with
    ``timings``, ``[DONE]``; each event its own write (not counted in ``seen.writes``), back to
    back, or ``bench_interval_ms`` apart (with ``bench_stamp``, each token event carries the
    upstream's ``time.monotonic_ns()`` as ``t_ns``). Like llama-server it closes the connection
    after every event stream (saying so with ``Connection: close``) unless
    ``keep_streams_alive``. ``stream:false``: ``llama_plain_body(max_tokens)``.
    """
    plain_cache: dict[int, bytes] = {}
    missing = not_found()

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        if request.method != "POST" or request.path != CHAT_PATH:
            return await missing(request, seen)
        body = orjson.loads(seen.body)
        n = int(body.get("max_tokens", 20))
        if not body.get("stream"):
            data = plain_cache.get(n)
            if data is None:
                data = plain_cache[n] = llama_plain_body(n)
            return web.Response(body=data, headers=CIMultiDict(JSON_HEADERS))
        interval = float(body.get("bench_interval_ms", 0)) / 1000
        resp = web.StreamResponse(headers=CIMultiDict(SSE_HEADERS))
        if not keep_streams_alive:
            resp.force_close()
        await resp.prepare(request)
        await resp.write(LLAMA_ROLE_EVENT)
        if interval > 0:
            await _write_paced_tokens(resp, n, interval, bool(body.get("bench_stamp")))
        else:
            await _write_tokens(resp, n)
        await resp.write(llama_final_event(n))
        await resp.write(DONE)
        await resp.write_eof()
        return resp

    return script
