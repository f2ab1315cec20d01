#!/usr/bin/env python3
"""Relay overhead of timing-proxy: direct vs proxied requests, interleaved, in one run.

Three processes on 127.0.0.1 only:

* a fast fake llama-server (this file, ``--role upstream``: an aiohttp app that writes each
  llama-shaped SSE event as its own chunk, as fast as possible or paced);
* the proxy (``python -m proxy serve --listen ... --upstream ...``), stdout to /dev/null with
  the JSON log line per request left on (the production cost); optionally a second proxy
  running on uvloop (``--uvloop``);
* the load client (this process, one aiohttp session).

and, as references for what any relay costs on the machine, a bare aiohttp relay, a lean
relay (aiohttp server, httptools upstream client; when httptools is installed) and a TCP
splice (bytes copied between sockets, no HTTP).

It measures, in this order: the added latency per request (streamed and plain; direct and
proxied requests interleaved in random order per round), the per-event forwarding delay of a
paced stream (each event carries the upstream's CLOCK_MONOTONIC stamp), the throughput of one
long stream, the proxy's CPU time per event (process CPU clock of the proxy during the long
stream and during a load of concurrent 30 tok/s "robot" streams), and in-process the CPU cost
of ``StreamTracker.feed`` per event. It prints Markdown tables and writes a JSON file.

Usage::

    .venv/bin/python bench/relay_overhead.py [--quick] [--uvloop] [--profile]
                                             [--out bench/results/NAME.json]

See bench/README.md for the method and what each number means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import os
import platform
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # never anything else
PY = sys.executable

# Targets from the issue.
TARGET_ADDED_P50_MS = 0.3
TARGET_ADDED_P99_MS = 1.0
TARGET_THROUGHPUT_RATIO = 0.9
TARGET_STREAMS_PER_CORE = 200  # "hundreds" of concurrent 30 tok/s streams: at least 200
ROBOT_RATE = 30.0  # tokens (events) per second of one robot stream
STEPS = ("latency", "event_delay", "throughput", "robots", "tracker")
BARE = "bare-relay"  # reference: a minimal aiohttp relay, no analysis (not timing-proxy)
SPLICE = "tcp-splice"  # reference: bytes copied between two sockets, no HTTP at all
LEAN = "lean-relay"  # reference: aiohttp server + an httptools upstream client, no analysis
REFERENCES = frozenset({BARE, SPLICE, LEAN})

# --------------------------------------------------------------------------------------------
# llama-shaped bytes (compact JSON, key order of llama-server's chat completion chunks)

_ID = b"chatcmpl-A02QtP5EbemMQDC05JRPzJTCrKUnGAiK"
_TAIL = (
    b'"created":1796010009,"id":"'
    + _ID
    + b'","model":"m","system_fingerprint":"b0","object":"chat.completion.chunk"'
)
_TOKENS = [
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
]
ROLE_EVENT = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant",'
    b'"content":null}}],' + _TAIL + b"}\n\n"
)
TOKEN_EVENTS = [
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
    + t
    + b"}}],"
    + _TAIL
    + b"}\n\n"
    for t in _TOKENS
]
DONE_EVENT = b"data: [DONE]\n\n"


def _timings(n: int) -> bytes:
    return (
        b'"timings":{"cache_n":0,"prompt_n":40,"prompt_ms":194.973,'
        b'"prompt_per_token_ms":4.874325,"prompt_per_second":205.156611,'
        b'"predicted_n":%d,"predicted_ms":%.3f,"predicted_per_token_ms":24.07,'
        b'"predicted_per_second":41.539}' % (n, n * 24.07)
    )


def final_event(n: int) -> bytes:
    return (
        b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],'
        + _TAIL
        + b","
        + _timings(n)
        + b"}\n\n"
    )


def token_event(i: int) -> bytes:
    return TOKEN_EVENTS[i % len(TOKEN_EVENTS)]


def stamped_token_event(i: int) -> bytes:
    """A token event carrying the upstream's CLOCK_MONOTONIC (``"t_ns"``), taken just now."""
    return (
        b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
        + _TOKENS[i % len(_TOKENS)]
        + b"}}],"
        + _TAIL
        + b',"t_ns":%d}\n\n' % time.monotonic_ns()
    )


def plain_body(n: int) -> bytes:
    content = b"".join(_TOKENS[i % len(_TOKENS)][1:-1] for i in range(n))
    return (
        b'{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant",'
        b'"content":"' + content + b'"}}],"created":1796010011,"model":"m",'
        b'"system_fingerprint":"b0","object":"chat.completion","usage":{'
        b'"completion_tokens":%d,"prompt_tokens":40,"total_tokens":%d,'
        b'"prompt_tokens_details":{"cached_tokens":0}},"id":"'
        % (n, n + 40)
        + _ID
        + b'",'
        + _timings(n)
        + b"}"
    )


def sse_events(n: int) -> int:
    """SSE events in a stream of ``n`` tokens: role, n tokens, finish+timings, [DONE]."""
    return n + 3


def stream_events(n: int) -> list[bytes]:
    """The whole stream of ``n`` tokens, one bytes object per event (for the tracker bench)."""
    return [ROLE_EVENT, *(token_event(i) for i in range(n)), final_event(n), DONE_EVENT]


# --------------------------------------------------------------------------------------------
# role: the fake upstream (a separate process)


async def serve_app(app: Any, port: int) -> None:
    """Serve the aiohttp ``app`` on HOST:port (0: any), print ``PORT n`` for the parent,
    and run until SIGTERM/SIGINT."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def run_upstream(keep_streams_alive: bool = False) -> None:
    """Serve the fake llama-server on 127.0.0.1:<free port>; print the port; stop on SIGTERM.

    Like llama-server, it closes the connection after every event stream (llama-server does
    so silently; here ``Connection: close`` says so, so that the direct client never races a
    stale socket). Direct and proxied streams thus both pay one TCP connect to the upstream.
    """
    import orjson
    from aiohttp import web

    sse_headers = {
        "Server": "llama.cpp",
        "Access-Control-Allow-Origin": "",
        "X-Accel-Buffering": "no",
        "Content-Type": "text/event-stream",
    }
    plain_cache: dict[int, bytes] = {}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        n = int(body.get("max_tokens", 20))
        if not body.get("stream"):
            data = plain_cache.get(n)
            if data is None:
                data = plain_cache[n] = plain_body(n)
            return web.Response(
                body=data,
                headers={
                    "Server": "llama.cpp",
                    "Access-Control-Allow-Origin": "",
                    "Content-Type": "application/json; charset=utf-8",
                },
            )
        interval = float(body.get("bench_interval_ms", 0)) / 1000
        stamp = bool(body.get("bench_stamp"))
        resp = web.StreamResponse(headers=sse_headers)
        if not keep_streams_alive:
            resp.force_close()
        await resp.prepare(request)
        write = resp.write
        await write(ROLE_EVENT)
        if interval > 0:
            sleep = asyncio.sleep
            make = stamped_token_event if stamp else token_event
            for i in range(n):
                await sleep(interval)
                await write(make(i))
        else:
            events = TOKEN_EVENTS
            k = len(events)
            for i in range(n):
                await write(events[i % k])
        await write(final_event(n))
        await write(DONE_EVENT)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    asyncio.run(serve_app(app, 0))


# --------------------------------------------------------------------------------------------
# role: a bare aiohttp relay (reference: the floor cost of relaying with aiohttp here)

_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    }
)


def relay_app(handle: Callable[[Any], Awaitable[Any]]) -> Any:
    """An aiohttp app sending every method and path to ``handle``."""
    from aiohttp import web

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def run_bare_relay(upstream: str, port: int) -> None:
    """The same relay loop as the proxy (readany -> write) with nothing else: no tracker,
    no timeouts, no record, no log line. Not a product: a reference for the numbers.
    Like the proxy, it pools upstream connections for plain requests and opens a fresh one
    for each stream (llama-server closes the connection after a stream)."""
    import aiohttp
    from aiohttp import web

    async def main() -> None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        stream_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True), auto_decompress=False
        )

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
            use = stream_session if b'"stream":true' in body else session
            async with use.request(
                request.method,
                upstream + request.raw_path,
                data=body or None,
                headers=headers,
                skip_auto_headers=("User-Agent", "Accept", "Content-Type"),
            ) as up:
                resp = web.StreamResponse(
                    status=up.status,
                    headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP},
                )
                if up.content_length is not None:
                    resp.content_length = up.content_length
                await resp.prepare(request)
                read = up.content.readany
                while chunk := await read():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        await serve_app(relay_app(handle), port)
        await session.close()
        await stream_session.close()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# role: a lean relay (reference: what the aiohttp *server* side costs, with a minimal client)


def run_lean_relay(upstream: str, port: int) -> None:
    """The bare relay's aiohttp server, but the upstream leg is a minimal HTTP/1.1 client on
    an asyncio protocol with httptools' parser instead of ``aiohttp.ClientSession``: one
    ``write`` of the request, body chunks queued as parsed. Same connection policy (idle
    connections reused for plain requests, a fresh one per stream). No timeouts, no error
    handling worth the name, no analysis: not a product, a measurement of how much of the
    bare relay's cost is aiohttp's client and how much its server."""
    import httptools  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from aiohttp import web

    host, _, up_port = upstream.removeprefix("http://").partition(":")
    hop = {h.encode() for h in _HOP}

    class Upstream(asyncio.Protocol):
        def __init__(self) -> None:
            self.closed = False
            self.transport: asyncio.Transport | None = None
            self.reset()

        def reset(self) -> None:
            self.parser = httptools.HttpResponseParser(self)
            self.headers: list[tuple[bytes, bytes]] = []
            self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.body: asyncio.Queue[bytes] = asyncio.Queue()
            self.complete = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.append((name, value))

        def on_headers_complete(self) -> None:
            self.status = self.parser.get_status_code()
            self.keep_alive = self.parser.should_keep_alive()
            self.head.set_result(None)

        def on_body(self, body: bytes) -> None:
            self.body.put_nowait(body)

        def on_message_complete(self) -> None:
            self.complete = True
            self.body.put_nowait(b"")

        def connection_lost(self, exc: Exception | None) -> None:
            self.closed = True
            if not self.head.done():
                self.head.set_exception(ConnectionError("upstream closed"))
            if not self.complete:
                self.body.put_nowait(b"")

    idle: list[Upstream] = []

    async def connection(fresh: bool) -> Upstream:
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed:
                conn.reset()
                return conn
        _t, conn = await asyncio.get_running_loop().create_connection(Upstream, host, int(up_port))
        return conn

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        conn = await connection(fresh=b'"stream":true' in body)
        assert conn.transport is not None
        head = [f"{request.method} {request.raw_path} HTTP/1.1\r\nHost: {host}:{up_port}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() not in _HOP]
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        conn.transport.write("".join(head).encode("latin-1") + body)
        await conn.head
        resp = web.StreamResponse(
            status=conn.status,
            headers={
                k.decode("latin-1"): v.decode("latin-1")
                for k, v in conn.headers
                if k.lower() not in hop
            },
        )
        for k, v in conn.headers:
            if k.lower() == b"content-length":
                resp.content_length = int(v)
        await resp.prepare(request)
        get = conn.body.get
        while chunk := await get():
            await resp.write(chunk)
        await resp.write_eof()
        if conn.keep_alive and conn.complete and not conn.closed:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        return resp

    asyncio.run(serve_app(relay_app(handle), port))


# --------------------------------------------------------------------------------------------
# role: a TCP splice (reference: the floor cost of any user-space hop on this machine)


def run_tcp_splice(upstream: str, port: int) -> None:
    """Copies bytes between each accepted connection and one upstream connection of its
    own, with asyncio protocols: no HTTP parsing, no headers rewritten, nothing analysed.
    No HTTP proxy can add less than this: it is the cost of one more process in the path
    (two more socket hops and the wake-ups between them). The upstream connection is opened
    when the client connects, so for a stream (after which the upstream closes and the
    splice closes the client's connection) the client's connect overlaps the upstream's."""
    host, _, up_port = upstream.removeprefix("http://").partition(":")

    class Upstream(asyncio.Protocol):
        def __init__(self, client: asyncio.Transport) -> None:
            self.client = client

        def data_received(self, data: bytes) -> None:
            self.client.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.client.close()

    class Client(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            self.pending: list[bytes] = []
            self.up: asyncio.Transport | None = None
            loop = asyncio.get_running_loop()
            task = loop.create_task(
                loop.create_connection(lambda: Upstream(transport), host, int(up_port))
            )
            task.add_done_callback(self._connected)

        def _connected(self, task: asyncio.Task[Any]) -> None:
            if task.exception() is not None:
                self.transport.close()
                return
            up, _proto = task.result()
            up.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.up = up
            for data in self.pending:
                up.write(data)
            self.pending.clear()

        def data_received(self, data: bytes) -> None:
            if self.up is None:
                self.pending.append(data)
            else:
                self.up.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.up is not None:
                self.up.close()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Client, HOST, port)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.close()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU time (user+system, all threads) of process ``pid``, in seconds, ns resolution."""
    try:
        return time.clock_gettime((~pid << 3) | 2)  # CPUCLOCK_SCHED process clock of pid
    except OSError:  # fall back to /proc (10 ms ticks)
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> dict[str, float]:
    """Machine-wide busy and steal CPU seconds so far (all processes, from /proc/stat)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal
    return {"busy": (f[0] + f[1] + f[2] + f[5] + f[6]) / tick, "steal": f[7] / tick}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def _start_role(name: str, *args: str) -> Proc:
    popen = subprocess.Popen(
        [PY, str(Path(__file__).resolve()), "--role", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert popen.stdout is not None
    line = popen.stdout.readline().decode()
    if not line.startswith("PORT "):
        popen.kill()
        raise RuntimeError(f"{name} failed to start: {line!r}")
    return Proc(name, popen, f"http://{HOST}:{int(line.split()[1])}")


def start_upstream(keep_streams_alive: bool) -> Proc:
    extra = ["--keep-streams-alive"] if keep_streams_alive else []
    return _start_role("upstream", "upstream", *extra)


def start_bare_relay(upstream: str) -> Proc:
    return _start_role(BARE, BARE, "--upstream", upstream)


def start_lean_relay(upstream: str) -> Proc:
    return _start_role(LEAN, LEAN, "--upstream", upstream)


def start_tcp_splice(upstream: str) -> Proc:
    return _start_role(SPLICE, SPLICE, "--upstream", upstream)


UVLOOP_LAUNCHER = (
    "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); "
    "from proxy.commands.cli import main; sys.exit(main(sys.argv[1:]))"
)


def start_proxy(
    name: str, upstream: str, config: Path, log_file: Path | None, uvloop: bool
) -> Proc:
    port = free_port()
    args = ["serve", "--config", str(config), "--listen", f"{HOST}:{port}", "--upstream", upstream]
    if log_file is not None:
        args += ["--log-file", str(log_file)]
    cmd = [PY, "-c", UVLOOP_LAUNCHER, *args] if uvloop else [PY, "-m", "proxy", *args]
    popen = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return Proc(name, popen, f"http://{HOST}:{port}")


async def wait_ready(session: Any, proc: Proc, path: str, timeout: float = 20.0) -> None:  # noqa: ASYNC109 - a readiness poll deadline
    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}")
        try:
            async with session.get(proc.url + path) as resp:
                await resp.read()
                return
        except OSError:
            pass
        except Exception as exc:  # aiohttp.ClientConnectorError etc.
            if "connect" not in type(exc).__name__.lower():
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} not ready after {timeout} s")
        await asyncio.sleep(0.05)


def uses_uvloop(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as fh:
        return "uvloop" in fh.read()
    return False


# --------------------------------------------------------------------------------------------
# statistics


def pct(values: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0-100) with linear interpolation; ``values`` need not be sorted."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "mean": statistics.fmean(values) if values else float("nan"),
        "max": max(values) if values else float("nan"),
    }


# --------------------------------------------------------------------------------------------
# client side


def chat_body(tokens: int, stream: bool, interval_ms: float = 0.0, stamp: bool = False) -> bytes:
    import orjson

    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": stream,
    }
    if interval_ms:
        body["bench_interval_ms"] = interval_ms
    if stamp:
        body["bench_stamp"] = True
    return orjson.dumps(body)


HEADERS = {"Content-Type": "application/json"}
PATH = "/v1/chat/completions"


async def timed_request(session: Any, url: str, body: bytes) -> tuple[float, bytes]:
    """Wall time (ms) from sending to the last body byte, and the body."""
    t0 = time.perf_counter_ns()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        data = await resp.read()
        status = resp.status
    t1 = time.perf_counter_ns()
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {data[:200]!r}")
    return (t1 - t0) / 1e6, data


async def stamped_stream(session: Any, url: str, body: bytes, delays: list[float]) -> int:
    """Read a stamped stream; append arrival - upstream stamp (ms) per token event."""
    events = 0
    buf = b""
    async with session.post(url, data=body, headers=HEADERS) as resp:
        async for chunk in resp.content.iter_any():
            now = time.monotonic_ns()
            buf += chunk
            while True:
                i = buf.find(b"\n\n")
                if i < 0:
                    break
                ev = buf[:i]
                buf = buf[i + 2 :]
                events += 1
                j = ev.find(b'"t_ns":')
                if j >= 0:
                    delays.append((now - int(ev[j + 7 : ev.index(b"}", j)])) / 1e6)
    if buf:
        raise RuntimeError("stream ended mid-event")
    return events


async def drain_stream(session: Any, url: str, body: bytes) -> tuple[float, int, bytes]:
    """Read a long stream as fast as possible: (seconds to last byte, bytes, last bytes)."""
    size = 0
    tail = b""
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            tail = (tail + chunk)[-32:]
    return time.perf_counter() - t0, size, tail


@dataclass
class Bench:
    args: argparse.Namespace
    upstream: Proc
    proxies: dict[str, Proc]  # mode -> proxy process
    session: Any
    plain_session: Any  # plain requests get their own pool: streams end with a close
    rng: random.Random
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def modes(self) -> list[str]:
        return ["direct", *self.proxies]

    def url(self, mode: str) -> str:
        base = self.upstream.url if mode == "direct" else self.proxies[mode].url
        return base + PATH

    def cpu_all(self) -> dict[str, float]:
        out = {"upstream": self.upstream.cpu(), "client": time.process_time()}
        out.update({m: p.cpu() for m, p in self.proxies.items()})
        return out

    # -- 1. latency ----------------------------------------------------------------------

    async def latency(self) -> dict[str, Any]:
        a = self.args
        kinds = {
            "stream": chat_body(a.stream_tokens, True),
            "plain": chat_body(a.stream_tokens, False),
        }
        modes = self.modes
        sessions = {"stream": self.session, "plain": self.plain_session}
        # warm-up, and check that the proxy relays the bytes unchanged
        for kind, body in kinds.items():
            got: dict[str, bytes] = {}
            for _ in range(max(1, a.warmup)):
                got = {
                    m: (await timed_request(sessions[kind], self.url(m), body))[1] for m in modes
                }
            if len(set(got.values())) != 1:
                raise RuntimeError(f"{kind}: proxied body differs from direct body")
        times: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in kinds}
        gc.collect()
        cpu0 = self.cpu_all()
        t0 = time.perf_counter()
        for _ in range(a.rounds):
            for kind, body in kinds.items():
                order = modes[:]
                self.rng.shuffle(order)
                for m in order:
                    ms, _data = await timed_request(sessions[kind], self.url(m), body)
                    times[kind][m].append(ms)
        elapsed = time.perf_counter() - t0
        cpu1 = self.cpu_all()
        out: dict[str, Any] = {
            "rounds": a.rounds,
            "warmup": a.warmup,
            "proxy_cpu_us_per_request": {
                m: (cpu1[m] - cpu0[m]) / (len(kinds) * a.rounds) * 1e6 for m in self.proxies
            },
            "tokens": a.stream_tokens,
            "stream_sse_events": sse_events(a.stream_tokens),
            "plain_body_bytes": len(plain_body(a.stream_tokens)),
            "seconds": elapsed,
            "kinds": {},
        }
        for kind in kinds:
            direct = times[kind]["direct"]
            k: dict[str, Any] = {"direct_ms": summary(direct)}
            for m in self.proxies:
                prox = times[kind][m]
                paired = [p - d for p, d in zip(prox, direct, strict=True)]
                k[f"{m}_ms"] = summary(prox)
                q = max(1, len(direct) // 4)
                k[f"{m}_added_ms"] = {
                    "blocks_p50": [
                        pct(prox[i : i + q], 50) - pct(direct[i : i + q], 50)
                        for i in range(0, len(direct) - q + 1, q)
                    ][:4],
                    "median_diff": pct(prox, 50) - pct(direct, 50),
                    "p90_diff": pct(prox, 90) - pct(direct, 90),
                    "p99_diff": pct(prox, 99) - pct(direct, 99),
                    "paired": summary(paired),
                }
            out["kinds"][kind] = k
        return out

    # -- 2. per-event forwarding delay -----------------------------------------------------

    async def event_delay(self) -> dict[str, Any]:
        a = self.args
        body = chat_body(a.paced_tokens, True, interval_ms=a.paced_interval_ms, stamp=True)
        delays: dict[str, list[float]] = {m: [] for m in self.modes}
        cpu0 = self.cpu_all()
        events: Counter[str] = Counter()
        for _ in range(a.paced_rounds):
            order = self.modes[:]
            self.rng.shuffle(order)
            for m in order:
                got = await stamped_stream(self.session, self.url(m), body, delays[m])
                events[m] += got
        cpu1 = self.cpu_all()
        out: dict[str, Any] = {
            "streams_per_mode": a.paced_rounds,
            "tokens": a.paced_tokens,
            "interval_ms": a.paced_interval_ms,
            "direct_ms": summary(delays["direct"]),
        }
        for m in self.proxies:
            out[f"{m}_ms"] = summary(delays[m])
            out[f"{m}_added_ms"] = {
                q: pct(delays[m], n) - pct(delays["direct"], n)
                for q, n in (("p50", 50), ("p90", 90), ("p99", 99))
            }
            ev = events[m]
            out[f"{m}_proxy_cpu_us_per_event"] = (cpu1[m] - cpu0[m]) / ev * 1e6
        return out

    # -- 3. throughput of one long stream ------------------------------------------------

    async def throughput(self) -> dict[str, Any]:
        a = self.args
        body = chat_body(a.long_tokens, True)
        n_events = sse_events(a.long_tokens)
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in self.modes}
        sizes: set[int] = set()
        await drain_stream(self.session, self.url("direct"), body)  # warm-up
        for m in self.proxies:
            await drain_stream(self.session, self.url(m), body)
        for _ in range(a.long_runs):
            order = self.modes[:]
            self.rng.shuffle(order)
            for m in order:
                gc.collect()
                cpu0 = self.cpu_all()
                secs, size, tail = await drain_stream(self.session, self.url(m), body)
                cpu1 = self.cpu_all()
                if not tail.endswith(DONE_EVENT):
                    raise RuntimeError(f"{m}: long stream did not end with [DONE]")
                sizes.add(size)
                run = {
                    "seconds": secs,
                    "events_per_s": n_events / secs,
                    "upstream_cpu_s": cpu1["upstream"] - cpu0["upstream"],
                    "client_cpu_s": cpu1["client"] - cpu0["client"],
                }
                if m != "direct":
                    run["proxy_cpu_s"] = cpu1[m] - cpu0[m]
                    run["proxy_cpu_us_per_event"] = run["proxy_cpu_s"] / n_events * 1e6
                runs[m].append(run)
        if len(sizes) != 1:
            raise RuntimeError(f"long stream sizes differ: {sizes}")
        out: dict[str, Any] = {
            "tokens": a.long_tokens,
            "sse_events": n_events,
            "bytes": sizes.pop(),
            "runs_per_mode": a.long_runs,
            "headline": "median of runs",
            "modes": {},
        }
        med_direct = statistics.median(r["events_per_s"] for r in runs["direct"])
        best_direct = max(r["events_per_s"] for r in runs["direct"])
        for m in self.modes:
            eps = [r["events_per_s"] for r in runs[m]]
            entry: dict[str, Any] = {
                "runs": runs[m],
                "events_per_s_median": statistics.median(eps),
                "events_per_s_best": max(eps),
            }
            if m != "direct":
                entry["ratio_median"] = entry["events_per_s_median"] / med_direct
                entry["ratio_best"] = entry["events_per_s_best"] / best_direct
                cpu = [r["proxy_cpu_us_per_event"] for r in runs[m]]
                entry["proxy_cpu_us_per_event_median"] = statistics.median(cpu)
                entry["proxy_cpu_total_s"] = sum(r["proxy_cpu_s"] for r in runs[m])
                entry["proxy_cpu_us_per_event_all_runs"] = (
                    entry["proxy_cpu_total_s"] / (n_events * len(runs[m])) * 1e6
                )
            out["modes"][m] = entry
        return out

    # -- 4. robot load: many concurrent 30 tok/s streams ---------------------------------

    async def robots(self, mode: str, concurrency: int, duration: float) -> dict[str, Any]:
        import aiohttp

        a = self.args
        body = chat_body(a.robot_tokens, True, interval_ms=1000 / ROBOT_RATE, stamp=True)
        delays: list[float] = []
        counts = {"events": 0, "requests": 0}
        url = self.url(mode)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as session:
            deadline = time.monotonic() + duration

            async def robot() -> None:
                await asyncio.sleep(self.rng.uniform(0, 1.0))  # stagger the starts
                while time.monotonic() < deadline:
                    got = await stamped_stream(session, url, body, delays)
                    counts["events"] += got  # not `+= await`: that loses concurrent updates
                    counts["requests"] += 1

            gc.collect()
            cpu0 = self.cpu_all()
            t0 = time.perf_counter()
            await asyncio.gather(*(robot() for _ in range(concurrency)))
            secs = time.perf_counter() - t0
            cpu1 = self.cpu_all()
        cpu = {k: cpu1[k] - cpu0[k] for k in cpu1}
        out: dict[str, Any] = {
            "concurrency": concurrency,
            "tokens_per_request": a.robot_tokens,
            "rate_tok_s": ROBOT_RATE,
            "seconds": secs,
            "requests": counts["requests"],
            "events": counts["events"],
            "events_per_s": counts["events"] / secs,
            "delay_ms": summary(delays),
            "cpu_s": {"upstream": cpu["upstream"], "client": cpu["client"]},
        }
        if mode != "direct":
            proxy_cpu = cpu[mode]
            per_event = proxy_cpu / counts["events"]
            out["cpu_s"]["proxy"] = proxy_cpu
            out["proxy_cpu_share_of_one_core"] = proxy_cpu / secs
            out["proxy_cpu_us_per_event"] = per_event * 1e6
            out["streams_per_core_at_30_tok_s"] = 1 / (per_event * ROBOT_RATE)
        return out

    async def robot_load(self) -> dict[str, Any]:
        """Each concurrency level, each path in turn (direct first, then the relays)."""
        a = self.args
        out: dict[str, Any] = {"levels": {}}
        for c in a.robot_concurrency:
            level: dict[str, Any] = {}
            for m in self.modes:
                level[m] = await self.robots(m, c, a.robot_seconds)
            for m in self.proxies:
                level[m]["added_delay_ms"] = {
                    q: level[m]["delay_ms"][q] - level["direct"]["delay_ms"][q]
                    for q in ("p50", "p90", "p99")
                }
            out["levels"][str(c)] = level
        for m in self.proxies:  # the headline: the least streams per core of all levels
            out[f"{m}_streams_per_core_at_30_tok_s"] = min(
                lv[m]["streams_per_core_at_30_tok_s"] for lv in out["levels"].values()
            )
        return out


# --------------------------------------------------------------------------------------------
# 5. in-process CPU cost of the tracker (no I/O)


def tracker_cpu(tokens: int, reps: int) -> dict[str, Any]:
    import orjson

    sys.path.insert(0, str(ROOT))
    from proxy.core.sse import SSEFramer
    from proxy.core.tracker import StreamTracker

    events = stream_events(tokens)
    n = len(events)
    chunkings = {
        "1_event_per_chunk": events,
        "4_events_per_chunk": [b"".join(events[i : i + 4]) for i in range(0, n, 4)],
    }

    def timeit(fn: Callable[[], object]) -> dict[str, float]:
        cpu_us: list[float] = []
        wall_us: list[float] = []
        for _ in range(reps):
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            c1, w1 = time.process_time(), time.perf_counter()
            cpu_us.append((c1 - c0) / n * 1e6)
            wall_us.append((w1 - w0) / n * 1e6)
        return {
            "cpu_us_per_event_min": min(cpu_us),
            "cpu_us_per_event_median": statistics.median(cpu_us),
            "wall_us_per_event_min": min(wall_us),
            "wall_us_per_event_median": statistics.median(wall_us),
        }

    out: dict[str, Any] = {
        "tokens": tokens,
        "sse_events": n,
        "reps": reps,
        "bytes": sum(map(len, events)),
    }
    for name, chunks in chunkings.items():

        def run_tracker(chunks: list[bytes] = chunks) -> object:
            tr = StreamTracker(time.perf_counter(), sse=True)
            feed = tr.feed
            for c in chunks:
                feed(c)
            obs = tr.finish()
            if (
                obs.events != n
                or not obs.done
                or obs.timings is None
                or obs.token_events != tokens
                or obs.analysis_error is not None
            ):
                raise RuntimeError(f"tracker saw the stream wrongly: {obs}")
            return obs

        def run_framer(chunks: list[bytes] = chunks) -> object:
            fr = SSEFramer()
            feed = fr.feed
            for c in chunks:
                feed(c)
            if fr.events != n:
                raise RuntimeError("framer miscounted")
            return fr

        out[name] = {
            "tracker": timeit(run_tracker),
            "framer_only": timeit(run_framer),
            "chunks": len(chunks),
        }
    datas = [e[6:-2] for e in events]

    def parse_all() -> None:
        for d in datas[:-1]:
            orjson.loads(d)

    out["reference_orjson_loads_every_event"] = timeit(parse_all)
    return out


# --------------------------------------------------------------------------------------------
# profiling with py-spy (optional)

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

CATEGORIES: list[tuple[str, Callable[[str, str], bool]]] = [
    ("proxy/tracker.py", lambda fn, f: f.endswith("proxy/tracker.py")),
    ("proxy/sse.py", lambda fn, f: f.endswith("proxy/sse.py")),
    ("orjson (native)", lambda fn, f: "orjson" in f),
    ("proxy/relay.py", lambda fn, f: f.endswith("proxy/relay.py")),
    (
        "proxy record + log line (assemble, record, stats, logs, structlog, metrics)",
        lambda fn, f: any(
            s in f
            for s in (
                "proxy/assemble.py",
                "proxy/record.py",
                "proxy/stats.py",
                "proxy/logs.py",
                "proxy/metrics",
                "structlog/",
                "prometheus_client/",
            )
        ),
    ),
    (
        "aiohttp write path (StreamResponse.write, http_writer)",
        lambda fn, f: (
            "aiohttp/http_writer.py" in f
            or (
                "aiohttp/web_response.py" in f
                and fn.rsplit(".", 1)[-1] in ("write", "_write", "drain")
            )
        ),
    ),
    (
        "aiohttp read path (streams, client_proto, http parser)",
        lambda fn, f: any(
            s in f
            for s in (
                "aiohttp/streams.py",
                "aiohttp/client_proto.py",
                "aiohttp/_http_parser",
                "aiohttp/http_parser.py",
            )
        ),
    ),
    (
        "aiohttp request handling (web_protocol, client request)",
        lambda fn, f: any(
            s in f
            for s in (
                "aiohttp/web_protocol.py",
                "aiohttp/client.py",
                "aiohttp/client_reqrep.py",
                "aiohttp/connector.py",
                "aiohttp/web_app.py",
            )
        ),
    ),
    (
        "asyncio transport write (incl. send)",
        lambda fn, f: (
            ("asyncio/selector_events.py" in f or "uvloop" in f)
            and fn.rsplit(".", 1)[-1] in ("write", "writelines")
        ),
    ),
    (
        "socket send (kernel, incl. loopback delivery)",
        lambda fn, f: fn in ("send", "sendmsg", "writev") and "libc" in f,
    ),
    (
        "timeouts (asyncio.timeout enter/exit, timer heap)",
        lambda fn, f: (
            "asyncio/timeouts.py" in f or (fn == "TimerHandle.__lt__" and "asyncio/events.py" in f)
        ),
    ),
]


_IDLE_LEAVES = frozenset({"epoll_wait", "epoll_pwait", "select_epoll_poll", "poll"})
_SYSCALLS = frozenset(
    {
        "send",
        "sendmsg",
        "sendto",
        "writev",
        "write",
        "recv",
        "recvfrom",
        "recvmsg",
        "read",
        "recv_into",
    }
)

# Self attribution: each sample goes to the first frame, from the leaf up, that matches one
# of these (in this order for that frame); the kernel side of loopback TCP is charged to send.
SELF_CATEGORIES: list[tuple[str, Callable[[str, str], bool]]] = [
    (
        "socket syscalls (send/recv; kernel loopback TCP)",
        lambda fn, f: fn in _SYSCALLS and ("libc" in f or "libpthread" in f),
    ),
    ("orjson (native)", lambda fn, f: "orjson" in f),
    ("proxy/sse.py", lambda fn, f: f.endswith("proxy/sse.py")),
    (
        "proxy/tracker.py (incl. its regex and dataclass calls)",
        lambda fn, f: f.endswith("proxy/tracker.py"),
    ),
    (
        "proxy record + log line (assemble, record, stats, logs, structlog, metrics)",
        lambda fn, f: any(
            s in f
            for s in (
                "proxy/assemble.py",
                "proxy/record.py",
                "proxy/stats.py",
                "proxy/logs.py",
                "proxy/metrics",
                "structlog/",
                "prometheus_client/",
            )
        ),
    ),
    (
        "proxy/relay.py, headers.py, request.py, app.py",
        lambda fn, f: any(
            f.endswith(x)
            for x in ("proxy/relay.py", "proxy/headers.py", "proxy/request.py", "proxy/app.py")
        ),
    ),
    ("aiohttp", lambda fn, f: "aiohttp/" in f or "multidict" in f or "yarl" in f),
    ("asyncio event loop", lambda fn, f: "asyncio/" in f or "uvloop" in f),
]


def summarize_raw(path: Path, top: int = 20) -> dict[str, Any]:
    """Aggregate py-spy ``--format raw`` (collapsed stacks): self and inclusive shares of the
    busy samples (stacks whose leaf is epoll_wait are idle and left out)."""
    total = idle = 0
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    cat_c: Counter[str] = Counter()
    own_c: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = []
        for fr in stack.split(";"):
            m = _FRAME.match(fr)
            func, file = (m.group("func"), m.group("file")) if m else (fr, "?")
            frames.append((func, _short(file)))
        if not frames:
            continue
        if frames[-1][0] in _IDLE_LEAVES:
            idle += count
            continue
        total += count
        self_c[f"{frames[-1][0]} ({frames[-1][1]})"] += count
        for key in {f"{fn} ({f})" for fn, f in frames}:
            incl_c[key] += count
        for name, pred in CATEGORIES:
            if any(pred(fn, f) for fn, f in frames):
                cat_c[name] += count
        owner = "other (interpreter, gc, ...)"
        for fn, f in reversed(frames):
            hit = next((n for n, pred in SELF_CATEGORIES if pred(fn, f)), None)
            if hit is not None:
                owner = hit
                break
        own_c[owner] += count
    if not total:
        return {"samples": 0, "idle_samples": idle}
    return {
        "samples": total,
        "idle_samples": idle,
        "self_by_category_pct": {n: round(100 * v / total, 1) for n, v in own_c.most_common()},
        "categories_inclusive_pct": {n: round(100 * cat_c[n] / total, 1) for n, _ in CATEGORIES},
        "top_self_pct": [(k, round(100 * v / total, 1)) for k, v in self_c.most_common(top)],
        "top_inclusive_pct": [
            (k, round(100 * v / total, 1)) for k, v in incl_c.most_common(top * 2)
        ],
    }


def _short(file: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


async def profile(bench: Bench, results_dir: Path) -> dict[str, Any]:
    """Profile the asyncio proxy with py-spy during the long-stream run and the robot load."""
    pyspy = shutil.which("py-spy", path=str(Path(PY).parent)) or shutil.which("py-spy")
    if pyspy is None:
        return {"error": "py-spy not installed (.venv/bin/pip install py-spy)"}
    proxy = bench.proxies["proxy"]
    a = bench.args
    out: dict[str, Any] = {"py_spy": pyspy, "rate_hz": a.profile_rate, "seconds": a.profile_seconds}

    async def record(
        name: str, fmt: str, native: bool, workload: Callable[[float], Awaitable[object]]
    ) -> dict[str, Any]:
        suffix = ".svg" if fmt == "flamegraph" else ".raw.txt"
        target = results_dir / f"profile-{name}{suffix}"
        cmd = [
            pyspy,
            "record",
            "--pid",
            str(proxy.pid),
            "--duration",
            str(a.profile_seconds),
            "--rate",
            str(a.profile_rate),
            "--format",
            fmt,
            "-o",
            str(target),
        ]
        if native:
            cmd.append("--native")
        spy = await asyncio.create_subprocess_exec(
            *cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        await asyncio.sleep(1.0)  # let it attach
        cpu0, t0 = proxy.cpu(), time.perf_counter()
        await workload(a.profile_seconds - 1.5)
        cpu1, t1 = proxy.cpu(), time.perf_counter()
        _, err = await spy.communicate()
        entry: dict[str, Any] = {
            "file": str(target.relative_to(ROOT)),
            "command": shlex.join(cmd),
            "native": native,
            "proxy_cpu_share": (cpu1 - cpu0) / (t1 - t0),
        }
        if spy.returncode != 0 or not target.exists():
            entry["error"] = err.decode(errors="replace")[-500:]
        elif fmt == "raw":
            entry.update(summarize_raw(target))
        return entry

    long_body = chat_body(a.long_tokens, True)

    async def long_streams(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await drain_stream(bench.session, bench.url("proxy"), long_body)

    async def robots(seconds: float) -> None:
        await bench.robots("proxy", max(a.robot_concurrency), seconds)

    kinds = [chat_body(a.stream_tokens, True), chat_body(a.stream_tokens, False)]

    async def requests(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for body in kinds:
                await timed_request(bench.session, bench.url("proxy"), body)

    out["long_stream_raw"] = await record("long-stream", "raw", True, long_streams)
    if "error" in out["long_stream_raw"]:  # --native may be refused: try without
        out["long_stream_raw"] = await record("long-stream", "raw", False, long_streams)
    native = out["long_stream_raw"].get("native", False)
    out["robots_raw"] = await record("robots", "raw", native, robots)
    out["requests_raw"] = await record("requests", "raw", native, requests)
    svg = await record("long-stream", "flamegraph", False, long_streams)
    out["long_stream_svg"] = {k: svg[k] for k in ("file", "command") if k in svg}
    if "error" in svg:
        out["long_stream_svg"]["error"] = svg["error"]
    return out


# --------------------------------------------------------------------------------------------
# machine and report


def machine_info() -> dict[str, Any]:
    import aiohttp
    import orjson

    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        import uvloop

        uv: str | None = getattr(uvloop, "__version__", "?")
    except ImportError:
        uv = None

    def git(*args: str) -> str | None:  # read-only git queries
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain", "--", "proxy")
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "orjson": orjson.__version__,
        "uvloop": uv,
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "proxy_dir_modified": bool(status) if status is not None else None,
    }


def command_line() -> str:
    try:
        py = os.path.relpath(PY, ROOT) if not os.path.relpath(PY, ROOT).startswith("..") else PY
    except ValueError:
        py = PY
    script = os.path.relpath(Path(__file__).resolve(), ROOT)
    return shlex.join([py, script, *sys.argv[1:]])


def _f(x: float, nd: int = 3) -> str:
    return f"{x:.{nd}f}"


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _other_load(step: dict[str, Any]) -> float:
    return float(step["machine_cpu_s"]["other_processes"] / step["step_seconds"])


def report(res: dict[str, Any]) -> str:
    m = res["machine"]
    modes: list[str] = res["proxy_modes"]
    judged = [x for x in modes if x not in REFERENCES]
    lines = [
        f"Date: {res['timestamp']}  ",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, "
        f"Python {m['python']}, aiohttp {m['aiohttp']}, orjson {m['orjson']}"
        + (f", uvloop {m['uvloop']}" if m["uvloop"] else "")
        + "  ",
        f"Code: {m['git_commit']}"
        + (" (proxy/ modified)" if m["proxy_dir_modified"] else "")
        + "  ",
        f"Command: `{res['command']}` ({res['runtime_s']:.0f} s)  ",
        "Fake upstream: "
        + (
            "keeps connections alive after streams (unlike llama-server)"
            if res["args"].get("keep_streams_alive")
            else "closes the connection after each stream, like llama-server "
            "(with `Connection: close`)"
        )
        + ".  ",
        f"Processes: load client + {', '.join(modes)} + fake upstream on "
        f"{m['nproc']} cores: they compete for CPU. References, not timing-proxy: `{BARE}` "
        f"(a minimal aiohttp relay with no analysis, no timeouts, no log), `{LEAN}` (its "
        f"aiohttp server with an httptools upstream client), `{SPLICE}` (bytes copied "
        "between sockets, no HTTP).  ",
        f"Machine busy before start: {m.get('busy_cores_before_start', 0):.2f} cores. "
        "Other processes on the machine (CPU cores busy, average per step): "
        + ", ".join(
            f"{step} {_other_load(res[step]):.2f}"
            for step in ("latency", "event_delay", "throughput", "robots")
            if "machine_cpu_s" in res.get(step, {})
        ),
        "",
    ]
    lat = res.get("latency")
    thr = res.get("throughput")
    rob = res.get("robots")
    tgt = [
        "| Target | "
        + " | ".join(f"{x} (reference)" if x in REFERENCES else x for x in modes)
        + " | Met ("
        + ", ".join(judged)
        + ") |",
        "|---|" + "---|" * len(modes) + "---|",
    ]

    def row(
        label: str, values: list[float], fmt: Callable[[float], str], ok: Callable[[float], bool]
    ) -> None:
        tgt.append(
            f"| {label} | "
            + " | ".join(fmt(v) for v in values)
            + " | "
            + ", ".join(
                _ok(ok(v)) for x, v in zip(modes, values, strict=True) if x not in REFERENCES
            )
            + " |"
        )

    for kind in ("stream", "plain"):
        if not lat:
            break
        k = lat["kinds"][kind]
        row(
            f"added p50 per request, {kind} (Δ medians, ms) ≤ {TARGET_ADDED_P50_MS}",
            [k[f"{p}_added_ms"]["median_diff"] for p in modes],
            _f,
            lambda v: v <= TARGET_ADDED_P50_MS,
        )
        row(
            f"added p99 per request, {kind} (p99 of paired Δ, ms) ≤ {TARGET_ADDED_P99_MS}",
            [k[f"{p}_added_ms"]["paired"]["p99"] for p in modes],
            _f,
            lambda v: v <= TARGET_ADDED_P99_MS,
        )
    if thr:
        row(
            f"{thr['sse_events']:,}-event stream, proxied/direct events/s (median) "
            f"≥ {TARGET_THROUGHPUT_RATIO}",
            [thr["modes"][p]["ratio_median"] for p in modes],
            lambda v: _f(v, 2),
            lambda v: v >= TARGET_THROUGHPUT_RATIO,
        )
    if rob:
        row(
            f"streams one core carries at 30 tok/s (robot load, least of "
            f"{'/'.join(rob['levels'])} concurrent) ≥ {TARGET_STREAMS_PER_CORE}",
            [rob[f"{p}_streams_per_core_at_30_tok_s"] for p in modes],
            lambda v: f"{v:,.0f}",
            lambda v: v >= TARGET_STREAMS_PER_CORE,
        )
    if thr:
        row(
            f"streams one core carries at 30 tok/s (long-stream CPU, coalesced reads; "
            f"optimistic) ≥ {TARGET_STREAMS_PER_CORE}",
            [
                1e6 / (thr["modes"][p]["proxy_cpu_us_per_event_all_runs"] * ROBOT_RATE)
                for p in modes
            ],
            lambda v: f"{v:,.0f}",
            lambda v: v >= TARGET_STREAMS_PER_CORE,
        )
    lines += ["### Targets", "", *tgt, ""]
    if lat:
        lines += _latency_section(lat, modes)
    if "event_delay" in res:
        lines += _event_delay_section(res["event_delay"], modes)
    if thr:
        lines += _throughput_section(thr, modes)
    if rob:
        lines += _robot_section(rob, modes, res["args"]["robot_seconds"])
    if "tracker" in res:
        lines += _tracker_section(res["tracker"])
    if res.get("profile"):
        lines += _profile_section(res["profile"])
    return "\n".join(lines)


def _latency_section(lat: dict[str, Any], modes: list[str]) -> list[str]:
    lines: list[str] = []

    lines += [
        f"### Latency per request (ms, wall time to the last body byte; {lat['rounds']} "
        f"interleaved rounds after {lat['warmup']} warm-up)",
        "",
        "| Response | Path | p50 | p90 | p99 | added: Δ p50 | Δ p99 | paired Δ p50 | "
        "paired Δ p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cpu_req = lat["proxy_cpu_us_per_request"]
    for kind, label in (
        ("stream", f"streamed, {lat['stream_sse_events']} events"),
        ("plain", f"plain JSON, {lat['plain_body_bytes']} B"),
    ):
        k = lat["kinds"][kind]
        d = k["direct_ms"]
        lines.append(
            f"| {label} | direct | {_f(d['p50'])} | {_f(d['p90'])} | {_f(d['p99'])} | | | | |"
        )
        for p in modes:
            s, ad = k[f"{p}_ms"], k[f"{p}_added_ms"]
            lines.append(
                f"| {label} | {p} | {_f(s['p50'])} | {_f(s['p90'])} | {_f(s['p99'])} | "
                f"{_f(ad['median_diff'])} | {_f(ad['p99_diff'])} | {_f(ad['paired']['p50'])} "
                f"| {_f(ad['paired']['p99'])} |"
            )
    lines += [
        "",
        "Relay CPU per request (mean of streamed and plain, µs): "
        + ", ".join(f"{x} {cpu_req[x]:.0f}" for x in modes)
        + "  ",
        "Added p50 (Δ medians) in each quarter of the rounds, min–max: "
        + "; ".join(
            f"{kind} "
            + ", ".join(
                f"{x} {min(b):.3f}–{max(b):.3f}"
                for x in modes
                if (b := lat["kinds"][kind][f"{x}_added_ms"]["blocks_p50"])
            )
            for kind in ("stream", "plain")
        ),
    ]
    return lines


def _event_delay_section(ev: dict[str, Any], modes: list[str]) -> list[str]:
    lines = [
        "",
        f"### Per-event forwarding delay (ms, arrival − upstream stamp; {ev['streams_per_mode']}"
        f" streams × {ev['tokens']} events at {ev['interval_ms']} ms per path)",
        "",
        "| Path | p50 | p90 | p99 | added p50 | added p99 | relay CPU µs/event (one wake-up "
        "per event) |",
        "|---|---|---|---|---|---|---|",
        f"| direct | {_f(ev['direct_ms']['p50'])} | {_f(ev['direct_ms']['p90'])} | "
        f"{_f(ev['direct_ms']['p99'])} | | | |",
    ]
    for p in modes:
        s, ad = ev[f"{p}_ms"], ev[f"{p}_added_ms"]
        lines.append(
            f"| {p} | {_f(s['p50'])} | {_f(s['p90'])} | {_f(s['p99'])} | "
            f"{_f(ad['p50'])} | {_f(ad['p99'])} | "
            f"{_f(ev[f'{p}_proxy_cpu_us_per_event'], 1)} |"
        )
    return lines


def _throughput_section(thr: dict[str, Any], modes: list[str]) -> list[str]:
    lines = [
        "",
        f"### One long stream ({thr['sse_events']:,} events, {thr['bytes']:,} B, as fast as "
        f"possible; {thr['runs_per_mode']} runs per path, interleaved)",
        "",
        "| Path | events/s median | events/s best | ratio (median) | ratio (best) | "
        "proxy CPU µs/event | upstream CPU s | client CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in ["direct", *modes]:
        e = thr["modes"][p]
        up = statistics.median(r["upstream_cpu_s"] for r in e["runs"])
        cl = statistics.median(r["client_cpu_s"] for r in e["runs"])
        if p == "direct":
            lines.append(
                f"| direct | {e['events_per_s_median']:,.0f} | "
                f"{e['events_per_s_best']:,.0f} | | | | {_f(up, 2)} | {_f(cl, 2)} |"
            )
        else:
            lines.append(
                f"| {p} | {e['events_per_s_median']:,.0f} | "
                f"{e['events_per_s_best']:,.0f} | {_f(e['ratio_median'], 2)} | "
                f"{_f(e['ratio_best'], 2)} | "
                f"{_f(e['proxy_cpu_us_per_event_all_runs'], 1)} | "
                f"{_f(up, 2)} | {_f(cl, 2)} |"
            )
    return lines


def _robot_section(rob: dict[str, Any], modes: list[str], seconds: float) -> list[str]:
    first = next(iter(rob["levels"].values()))["direct"]
    lines = [
        "",
        f"### Robot load (concurrent streams at {ROBOT_RATE:.0f} tok/s, "
        f"{first['tokens_per_request']} tokens per request, ~{seconds} s "
        "per path and level; event delay = arrival − upstream stamp, ms)",
        "",
        "| Streams | Path | events/s | requests | delay p50 | delay p99 | added p50 | added p99 "
        "| relay CPU (share of a core) | relay CPU µs/event | streams/core at 30 tok/s | "
        "client + upstream CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, level in rob["levels"].items():
        for p in ["direct", *modes]:
            r = level[p]
            others = (r["cpu_s"]["client"] + r["cpu_s"]["upstream"]) / r["seconds"]
            head = (
                f"| {c} | {p} | {r['events_per_s']:,.0f} | {r['requests']} | "
                f"{_f(r['delay_ms']['p50'])} | {_f(r['delay_ms']['p99'])} | "
            )
            if p == "direct":
                lines.append(head + f"| | | | | {others:.2f} |")
                continue
            lines.append(
                head + f"{_f(r['added_delay_ms']['p50'])} | {_f(r['added_delay_ms']['p99'])} | "
                f"{r['proxy_cpu_share_of_one_core']:.0%} | "
                f"{_f(r['proxy_cpu_us_per_event'], 1)} | "
                f"{r['streams_per_core_at_30_tok_s']:,.0f} | {others:.2f} |"
            )
    return lines


def _tracker_section(tr: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"### Analysis cost in-process (StreamTracker.feed + finish, {tr['sse_events']:,}-event "
        f"stream, no I/O; min / median of {tr['reps']} reps)",
        "",
        "| Chunking | tracker CPU µs/event | framer only µs/event |",
        "|---|---|---|",
    ]
    for name in ("1_event_per_chunk", "4_events_per_chunk"):
        t = tr[name]
        lines.append(
            f"| {name.replace('_', ' ')} | {_f(t['tracker']['cpu_us_per_event_min'], 2)} / "
            f"{_f(t['tracker']['cpu_us_per_event_median'], 2)} | "
            f"{_f(t['framer_only']['cpu_us_per_event_min'], 2)} / "
            f"{_f(t['framer_only']['cpu_us_per_event_median'], 2)} |"
        )
    ref = tr["reference_orjson_loads_every_event"]
    lines.append(
        f"| (reference: orjson.loads of every event) | "
        f"{_f(ref['cpu_us_per_event_min'], 2)} / "
        f"{_f(ref['cpu_us_per_event_median'], 2)} | |"
    )
    return lines


def _profile_section(prof: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "long_stream_raw" in prof:
        for key, title in (
            ("long_stream_raw", "long stream"),
            ("robots_raw", "robot load"),
            ("requests_raw", "back-to-back 20-token requests"),
        ):
            p = prof.get(key, {})
            if "categories_inclusive_pct" not in p:
                lines += ["", f"Profile ({title}): {p.get('error', 'no samples')}"]
                continue
            lines += [
                "",
                f"### Proxy profile, {title} (py-spy, {p['samples']} busy samples, "
                f"proxy busy {p['proxy_cpu_share']:.0%} of a core; % of busy samples)",
                "",
                "| Self time by owner | % |",
                "|---|---|",
            ]
            lines += [f"| {n} | {v} |" for n, v in p["self_by_category_pct"].items()]
            lines += [
                "",
                "| Inclusive share (a sample counts for every match in its stack) | % |",
                "|---|---|",
            ]
            lines += [f"| {n} | {v} |" for n, v in p["categories_inclusive_pct"].items()]
            lines += ["", "| Top self time | % |", "|---|---|"]
            lines += [f"| `{n}` | {v} |" for n, v in p["top_self_pct"][:12]]
    else:
        lines += ["", f"Profile: {prof.get('error', 'not run')}"]
    return lines


# --------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--role",
        choices=["bench", "upstream", BARE, LEAN, SPLICE],
        default="bench",
        help=argparse.SUPPRESS,
    )
    p.add_argument("--upstream", help=argparse.SUPPRESS)  # for the relay roles
    p.add_argument("--no-bare", action="store_true", help="skip the reference bare aiohttp relay")
    p.add_argument(
        "--no-lean",
        action="store_true",
        help="skip the reference lean relay (aiohttp server, httptools client; "
        "skipped anyway when httptools is not installed)",
    )
    p.add_argument("--no-splice", action="store_true", help="skip the reference TCP splice")
    p.add_argument(
        "--keep-streams-alive",
        action="store_true",
        help="the fake upstream keeps the connection after an event stream (real "
        "llama-server closes it; by default the fake does too)",
    )
    p.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run, ~40 s)")
    p.add_argument(
        "--out",
        type=Path,
        help="JSON results file (default: bench/results/relay_overhead-<UTC time>.json)",
    )
    p.add_argument(
        "--uvloop", action="store_true", help="also run a second proxy on uvloop (if importable)"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile the asyncio proxy with py-spy (long stream, "
        "robot load, back-to-back requests); writes "
        "bench/results/profile-*.{raw.txt,svg}",
    )
    p.add_argument(
        "--log-file",
        action="store_true",
        help="also make the proxy append its JSON log lines to a temp file",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--steps",
        type=lambda v: v.split(","),
        default=list(STEPS),
        help=f"comma-separated subset of {','.join(STEPS)} (default: all)",
    )
    g = p.add_argument_group("sizes (defaults: full run; --quick lowers them)")
    g.add_argument("--rounds", type=int, help="latency rounds per kind (2000; quick 300)")
    g.add_argument("--warmup", type=int, help="warm-up requests per kind and path (100; 30)")
    g.add_argument(
        "--stream-tokens",
        type=int,
        default=20,
        help="tokens of the latency stream and plain body (20)",
    )
    g.add_argument("--paced-rounds", type=int, help="paced streams per path (8; 2)")
    g.add_argument("--paced-tokens", type=int, default=200, help="events per paced stream")
    g.add_argument("--paced-interval-ms", type=float, default=5.0)
    g.add_argument("--long-tokens", type=int, default=20_000)
    g.add_argument(
        "--long-runs", type=int, default=7, help="runs per path; the headline is the median (7)"
    )
    g.add_argument(
        "--robot-concurrency",
        type=lambda v: [int(x) for x in v.split(",")],
        help="concurrent 30 tok/s streams, comma-separated levels (50,200; 50)",
    )
    g.add_argument("--robot-seconds", type=float, help="robot load per path and level (6; 4)")
    g.add_argument("--robot-tokens", type=int, default=60, help="tokens per robot request")
    g.add_argument("--tracker-reps", type=int, help="in-process tracker repetitions (7; 3)")
    g.add_argument("--profile-seconds", type=int, default=10)
    g.add_argument("--profile-rate", type=int, default=200)
    args = p.parse_args(argv)
    defaults = {
        "rounds": (2000, 300),
        "warmup": (100, 30),
        "paced_rounds": (8, 2),
        "robot_concurrency": ([50, 200], [50]),
        "robot_seconds": (6.0, 4.0),
        "tracker_reps": (7, 3),
    }
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    started = time.perf_counter()
    stamp = datetime.now(UTC)
    machine = machine_info()
    m0 = machine_cpu()
    time.sleep(2.0)  # noqa: ASYNC251 - nothing else runs yet; how busy is the machine before we start? (others' processes)
    machine["busy_cores_before_start"] = (machine_cpu()["busy"] - m0["busy"]) / 2.0
    if machine["busy_cores_before_start"] > 0.1:
        print(
            f"warning: the machine is already busy ({machine['busy_cores_before_start']:.2f} "
            "cores) before the bench starts: results will be noisy",
            file=sys.stderr,
        )
    want_uvloop = args.uvloop
    if want_uvloop and machine["uvloop"] is None:
        print("uvloop is not importable: running the asyncio proxy only", file=sys.stderr)
        want_uvloop = False
    results_dir = ROOT / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    config = tmp / "config.toml"
    # The default pool (16) would queue the robot load inside the proxy.
    config.write_text(f"[upstream]\nmax_connections = {max(args.robot_concurrency) + 16}\n")
    procs: list[Proc] = []
    rng = random.Random(args.seed)
    try:
        upstream = start_upstream(args.keep_streams_alive)
        procs.append(upstream)
        proxies: dict[str, Proc] = {}
        for mode, uv in (("proxy", False), ("proxy-uvloop", True)):
            if uv and not want_uvloop:
                continue
            log = tmp / f"{mode}.jsonl" if args.log_file else None
            proxies[mode] = start_proxy(mode, upstream.url, config, log, uv)
            procs.append(proxies[mode])
        if not args.no_bare:
            proxies[BARE] = start_bare_relay(upstream.url)
            procs.append(proxies[BARE])
        if not args.no_lean and importlib.util.find_spec("httptools") is not None:
            proxies[LEAN] = start_lean_relay(upstream.url)
            procs.append(proxies[LEAN])
        if not args.no_splice:
            proxies[SPLICE] = start_tcp_splice(upstream.url)
            procs.append(proxies[SPLICE])
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as plain,
        ):
            await wait_ready(session, upstream, PATH.replace("chat/completions", "models"))
            for proc in proxies.values():
                await wait_ready(session, proc, "/health")
                if proc.name == "proxy-uvloop" and not uses_uvloop(proc.pid):
                    raise RuntimeError("the uvloop proxy does not run uvloop")
            bench = Bench(args, upstream, proxies, session, plain, rng)
            res: dict[str, Any] = {
                "timestamp": stamp.isoformat(timespec="seconds").replace("+00:00", "Z"),
                "command": command_line(),
                "machine": machine,
                "args": {
                    k: (str(v) if isinstance(v, Path) else v)
                    for k, v in vars(args).items()
                    if k != "role"
                },
                "proxy_modes": list(proxies),
                "processes": {
                    "client_pid": os.getpid(),
                    "upstream_pid": upstream.pid,
                    **{f"{m}_pid": p.pid for m, p in proxies.items()},
                },
                "proxy_log": "stdout to /dev/null"
                + (" + --log-file (temp file)" if args.log_file else ""),
            }
            steps: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
                ("latency", bench.latency),
                ("event_delay", bench.event_delay),
                ("throughput", bench.throughput),
                ("robots", bench.robot_load),
            ]
            for name, step in steps:
                if name not in args.steps:
                    continue
                print(
                    f"[{time.perf_counter() - started:6.1f} s] {name} ...",
                    file=sys.stderr,
                    flush=True,
                )
                t0, m0, c0 = time.perf_counter(), machine_cpu(), bench.cpu_all()
                res[name] = await step()
                t1, m1, c1 = time.perf_counter(), machine_cpu(), bench.cpu_all()
                ours = sum(c1[k] - c0[k] for k in c1)
                res[name]["step_seconds"] = t1 - t0
                res[name]["machine_cpu_s"] = {
                    "busy": m1["busy"] - m0["busy"],
                    "steal": m1["steal"] - m0["steal"],
                    "bench_processes": ours,
                    "other_processes": m1["busy"] - m0["busy"] - ours,
                }
            print(
                f"[{time.perf_counter() - started:6.1f} s] tracker ...", file=sys.stderr, flush=True
            )
            if "tracker" in args.steps:
                res["tracker"] = tracker_cpu(args.long_tokens, args.tracker_reps)
            res["runtime_s"] = time.perf_counter() - started
            if args.profile:
                print(
                    f"[{time.perf_counter() - started:6.1f} s] profile ...",
                    file=sys.stderr,
                    flush=True,
                )
                res["profile"] = await profile(bench, results_dir)
                res["runtime_with_profile_s"] = time.perf_counter() - started
            for proc in proxies.values():
                if proc.name in REFERENCES:
                    continue
                async with session.get(proc.url + "/stats") as resp:
                    stats = await resp.json()
                res.setdefault("proxy_stats_requests", {})[proc.name] = stats.get("requests")
        return res
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "upstream":
        run_upstream(args.keep_streams_alive)
        return 0
    if args.role == BARE:
        run_bare_relay(args.upstream, 0)
        return 0
    if args.role == LEAN:
        run_lean_relay(args.upstream, 0)
        return 0
    if args.role == SPLICE:
        run_tcp_splice(args.upstream, 0)
        return 0
    import json

    res = asyncio.run(run_bench(args))
    out = args.out or (
        ROOT / "bench" / "results" / f"relay_overhead-{res['timestamp'].replace(':', '')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    text = report(res)
    res["markdown"] = text
    out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(text)
    shown = out.resolve()
    print(f"\nResults: {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
