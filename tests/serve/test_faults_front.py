"""Fault injection at the agent's listener: what an agent (or anything on its port) sends.

A compressed body (a gzip bomb), a request whose head or body stalls, and requests the
proxy refuses by itself: a target that is not a path, a header section over the limit, an
``Expect`` it will not meet, smuggling attempts. Each test checks what the client received,
what the upstream saw and the record; the last class runs ``python -m proxy serve`` itself,
so the listener is configured exactly as ``run`` configures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import socket
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.core.headers import REQUEST_ID_HEADER
from proxy.core.record import Outcome, Record
from proxy.serve.listener import LISTENER_LOG
from proxy.serve.tasks import spawn
from tests.conftest import Captured, ProxyFactory, ProxyProcess, ProxyUnderTest, proxy_in_front_of
from tests.fakes import FakeUpstream, echo, json_response

HOST = "127.0.0.1"
STALL_S = 0.2
"""The read deadline of the stalled-request tests: they wait it out, so it is short."""
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
OK_BODY = b'{"ok":true}'


# --------------------------------------------------------------------------------------------
# Helpers


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Connect = Callable[[str], Awaitable[Connection]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Open raw connections to a listener; each is closed after the test."""
    writers: list[asyncio.StreamWriter] = []

    async def open_connection(url: str) -> Connection:
        reader, writer = await asyncio.open_connection(HOST, _port(url))
        writers.append(writer)
        return reader, writer

    yield open_connection
    for writer in writers:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _head(
    method: str, target: str, headers: list[tuple[str, str]], version: str = "HTTP/1.1"
) -> bytes:
    lines = [f"{method} {target} {version}", "Host: proxy", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _post(body: bytes, headers: list[tuple[str, str]] | None = None) -> bytes:
    """A POST of ``body`` to the chat endpoint, framed by its length."""
    fields = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    return _head("POST", "/v1/chat/completions", [*fields, *(headers or [])]) + body


async def _until_closed(reader: asyncio.StreamReader, within: float = 5.0) -> tuple[bytes, float]:
    """Everything the proxy sends until it closes the connection, and the seconds it took
    (fails if the connection is still open after ``within``)."""
    t0 = time.monotonic()
    got = bytearray()
    while True:
        left = within - (time.monotonic() - t0)
        assert left > 0, f"the connection is still open after {within} s; got {bytes(got)!r}"
        try:
            chunk = await asyncio.wait_for(reader.read(65536), left)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return bytes(got), time.monotonic() - t0


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (last wins, lower-case names) and Content-Length body of one response."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", len(rest)))
    return int(status_line.split()[1]), headers, rest[:length]


async def _exchange(
    url: str, data: bytes, within: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` on a new connection and read one response (the proxy closes after it,
    or the response is complete)."""
    reader, writer = await asyncio.open_connection(HOST, _port(url))
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within)
        status, headers, _ = _parse(head)
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(reader.readexactly(length), within) if length else b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return status, headers, body


def _openai_error(body: bytes, code: str) -> dict[str, Any]:
    """The proxy's own error body: ``{"error": {"message", "type", "code"}}``."""
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


async def _records(captured: Captured, count: int = 1, within: float = 5.0) -> list[Record]:
    deadline = time.monotonic() + within
    while len(captured.records) < count:
        assert time.monotonic() < deadline, f"{len(captured.records)} record(s), wanted {count}"
        await asyncio.sleep(0.005)
    return captured.records


Fake = tuple[FakeUpstream, TestServer]


@pytest.fixture
async def raw_fake(aiohttp_server: Any) -> Fake:
    """A fake llama-server that reads request bodies as they arrive (no decompression of
    its own) and takes heads up to 64 KiB a line, answering 200 ``{"ok":true}``."""
    upstream = FakeUpstream(json_response(200, OK_BODY))
    server = await aiohttp_server(
        upstream.app, auto_decompress=False, max_line_size=65536, max_field_size=65536
    )
    return upstream, server


async def _proxy(
    make_proxy: ProxyFactory, fake: Fake, **sections: dict[str, object]
) -> ProxyUnderTest:
    return await make_proxy(str(fake[1].make_url("")).rstrip("/"), **sections)


# ============================================================================================
# 1. A compressed request body: relayed as received, limited on the bytes received


def _bomb(decoded_size: int) -> bytes:
    """A chat body of ``decoded_size`` bytes, gzip-compressed (a few KiB)."""
    shell = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": ""}]})
    pad = b"a" * (decoded_size - len(shell))
    plain = shell.replace(b'"content":""', b'"content":"' + pad + b'"')
    assert len(plain) == decoded_size
    return gzip.compress(plain, 9)


class TestCompressedBody:
    """A ``Content-Encoding`` body reaches llama-server byte for byte; the analysis reads a
    bounded decoded copy, or says why it cannot."""

    async def test_gzip_bomb_is_relayed_as_received_and_flagged(
        self, raw_fake: Fake, make_proxy: ProxyFactory
    ) -> None:
        """A 4 KiB gzip body that inflates to 4 MiB, under a 1 MiB limit, goes upstream as
        the 4 KiB the agent sent (still labelled gzip); the record says the decoded copy
        would exceed the limit."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake, server={"max_body_bytes": 1024 * 1024})
        bomb = _bomb(4 * 1024 * 1024)
        assert len(bomb) < 64 * 1024
        status, _, body = await _exchange(proxy.url, _post(bomb, [("Content-Encoding", "gzip")]))
        assert (status, body) == (200, OK_BODY)
        (seen,) = upstream.seen
        assert seen.body == bomb and seen.headers["Content-Encoding"] == "gzip"
        (record,) = await _records(proxy.captured)
        assert record.outcome is Outcome.COMPLETED
        assert record.request_bytes == len(bomb)
        assert record.analysis_error == "request_body_decoded_over_limit:gzip"

    async def test_gzip_body_is_analysed_from_a_decoded_copy(
        self, raw_fake: Fake, make_proxy: ProxyFactory
    ) -> None:
        """A gzip tool request under the limit is relayed compressed, and its record has the
        facts of the decoded JSON (model, kind) with no analysis_error."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        packed = gzip.compress(orjson.dumps({**CHAT, "tools": TOOLS}))
        status, _, _ = await _exchange(proxy.url, _post(packed, [("Content-Encoding", "gzip")]))
        assert status == 200
        assert upstream.seen[0].body == packed
        (record,) = await _records(proxy.captured)
        assert (record.model, str(record.kind), record.analysis_error) == ("m", "tool", None)
        assert record.request_bytes == len(packed)

    async def test_chunked_deflate_body_is_relayed_as_received(
        self, raw_fake: Fake, make_proxy: ProxyFactory
    ) -> None:
        """A chunked ``deflate`` upload reaches the upstream as the bytes sent, and is read."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        packed = zlib.compress(orjson.dumps(CHAT))
        head = _head(
            "POST",
            "/v1/chat/completions",
            [("Content-Encoding", "deflate"), ("Transfer-Encoding", "chunked")],
        )
        pieces = [packed[i : i + 7] for i in range(0, len(packed), 7)]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        status, _, _ = await _exchange(proxy.url, head + chunked)
        assert status == 200 and upstream.seen[0].body == packed
        (record,) = await _records(proxy.captured)
        assert (record.model, record.analysis_error) == ("m", None)

    @pytest.mark.parametrize(
        ("encoding", "body", "flag"),
        [
            ("gzip", b"not gzip at all", "request_body_encoding_invalid:gzip"),
            ("gzip", gzip.compress(orjson.dumps(CHAT))[:-9], "request_body_encoding_invalid:gzip"),
            ("br", b"\x8b\x02\x80hi\x03", "request_body_encoding_unknown:br"),
        ],
        ids=["bad-gzip", "truncated-gzip", "brotli"],
    )
    async def test_undecodable_body_is_relayed_and_flagged(
        self, raw_fake: Fake, make_proxy: ProxyFactory, encoding: str, body: bytes, flag: str
    ) -> None:
        """A body the proxy cannot decode is relayed unchanged (llama-server answers it) and
        the record names why it was not analysed."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        status, _, _ = await _exchange(proxy.url, _post(body, [("Content-Encoding", encoding)]))
        assert status == 200
        assert upstream.seen[0].body == body
        assert upstream.seen[0].headers["Content-Encoding"] == encoding
        (record,) = await _records(proxy.captured)
        assert (record.outcome, record.analysis_error) == (Outcome.COMPLETED, flag)

    @pytest.mark.parametrize("encoding", [None, "identity"])
    async def test_plain_body_is_not_flagged(
        self, raw_fake: Fake, make_proxy: ProxyFactory, encoding: str | None
    ) -> None:
        """A body without a coding (or ``identity``) is analysed as ever: nothing flagged."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        plain = orjson.dumps(CHAT)
        extra = [("Content-Encoding", encoding)] if encoding else []
        status, _, _ = await _exchange(proxy.url, _post(plain, extra))
        assert status == 200 and upstream.seen[0].body == plain
        (record,) = await _records(proxy.captured)
        assert (record.model, record.analysis_error) == ("m", None)


# ============================================================================================
# 2. A request whose head or body stalls


class TestStalledRequest:
    """``[client] read_timeout_s``: a body not all there in time gets a 408 and the connection
    closes; a head not complete in time closes the connection. The upstream is never held."""

    async def test_body_that_never_comes_gets_a_408(
        self, raw_fake: Fake, make_proxy: ProxyFactory, connect: Connect
    ) -> None:
        """Headers announcing 100 bytes, then nothing: an OpenAI-shaped 408, the connection
        closed, a ``client_timeout`` record, and llama-server never contacted."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake, client={"read_timeout_s": STALL_S})
        reader, writer = await connect(proxy.url)
        writer.write(_head("POST", "/v1/chat/completions", [("Content-Length", "100")]) + b"{")
        got, _ = await _until_closed(reader)
        status, headers, body = _parse(got)
        assert status == 408 and headers["connection"].lower() == "close"
        _openai_error(body, "client_timeout")
        (record,) = await _records(proxy.captured)
        assert (record.outcome, record.status) == (Outcome.CLIENT_TIMEOUT, 408)
        assert headers[REQUEST_ID_HEADER.lower()] == record.id
        assert upstream.seen == []

    @pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
    async def test_trickling_body_gets_a_408(
        self, raw_fake: Fake, make_proxy: ProxyFactory, connect: Connect, chunked: bool
    ) -> None:
        """A body sent a byte at a time, never finishing within the deadline, is cut with a
        408 (the deadline is the whole body's, not a gap between two reads)."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake, client={"read_timeout_s": STALL_S})
        framing = ("Transfer-Encoding", "chunked") if chunked else ("Content-Length", "1000")
        reader, writer = await connect(proxy.url)
        writer.write(_head("POST", "/v1/chat/completions", [framing]))

        async def trickle() -> None:
            while True:
                writer.write(b"1\r\nx\r\n" if chunked else b"x")
                await asyncio.sleep(STALL_S / 5)  # five pieces per deadline

        feeding = spawn(trickle(), set())
        try:
            got, _ = await _until_closed(reader)
        finally:
            feeding.cancel()
        status, _, body = _parse(got)
        assert status == 408
        _openai_error(body, "client_timeout")
        (record,) = await _records(proxy.captured)
        assert record.outcome is Outcome.CLIENT_TIMEOUT and upstream.seen == []

    async def test_head_that_never_ends_closes_the_connection(
        self, raw_fake: Fake, make_proxy: ProxyFactory, connect: Connect
    ) -> None:
        """A request line and one header, then nothing: the connection is closed (no request
        exists yet to answer or record), and the proxy serves the next connection."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake, client={"read_timeout_s": STALL_S})
        reader, writer = await connect(proxy.url)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n")
        got, _ = await _until_closed(reader)
        assert got == b""
        assert proxy.captured.records == [] and upstream.seen == []
        status, _, _ = await _exchange(proxy.url, _post(orjson.dumps(CHAT)))
        assert status == 200

    async def test_body_within_the_deadline_is_relayed(
        self, raw_fake: Fake, make_proxy: ProxyFactory, connect: Connect
    ) -> None:
        """A body arriving in pieces but whole within the deadline is relayed: no 408."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake, client={"read_timeout_s": 10.0})
        body = orjson.dumps(CHAT)
        reader, writer = await connect(proxy.url)
        writer.write(_post(body)[: -len(body)])
        for i in range(0, len(body), 20):
            writer.write(body[i : i + 20])
            await asyncio.sleep(0.02)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert _parse(head)[0] == 200
        assert upstream.seen[0].body == body
        (record,) = await _records(proxy.captured)
        assert record.outcome is Outcome.COMPLETED


# ============================================================================================
# 3. What the proxy refuses by itself: OpenAI-shaped, recorded, no traceback


class TestRefusals:
    """Requests the proxy answers itself, before any byte goes upstream."""

    @pytest.mark.parametrize(
        ("method", "target"),
        [("OPTIONS", "*"), ("CONNECT", "llama:8080"), ("GET", "http://llama:8080/v1/models")],
        ids=["asterisk-form", "authority-form", "absolute-form"],
    )
    async def test_target_that_is_not_a_path_is_a_400(
        self, raw_fake: Fake, make_proxy: ProxyFactory, method: str, target: str
    ) -> None:
        """``OPTIONS *``, ``CONNECT host:port`` and an absolute URL get an OpenAI-shaped 400
        with a ``bad_request`` record; nothing goes upstream."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        status, headers, body = await _exchange(proxy.url, _head(method, target, []))
        assert status == 400 and headers["content-type"].startswith("application/json")
        error = _openai_error(body, "bad_request")
        assert error["type"] == "invalid_request_error"
        (record,) = await _records(proxy.captured)
        assert (record.outcome, record.status, record.method) == (Outcome.BAD_REQUEST, 400, method)
        assert upstream.seen == []

    async def test_header_section_over_the_limit_is_a_431(
        self, raw_fake: Fake, make_proxy: ProxyFactory
    ) -> None:
        """Twenty 4 KB headers (80 KB, each one under aiohttp's own field limit) over a
        64 KiB total: an OpenAI-shaped 431, ``request_too_large``, nothing forwarded."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        big = [(f"X-Pad-{i}", "a" * 4000) for i in range(20)]
        status, _, body = await _exchange(proxy.url, _post(orjson.dumps(CHAT), big))
        assert status == 431
        _openai_error(body, "request_too_large")
        (record,) = await _records(proxy.captured)
        assert (record.outcome, record.status) == (Outcome.REQUEST_TOO_LARGE, 431)
        assert upstream.seen == []

    async def test_header_section_under_the_limit_is_relayed(
        self, raw_fake: Fake, make_proxy: ProxyFactory
    ) -> None:
        """A 40 KB header and a 12 KB request target (60 KB in all, under 64 KiB) reach the
        upstream: the limit is on the total, not on aiohttp's 8190-byte line."""
        upstream, _ = raw_fake
        upstream.script = echo()
        proxy = await _proxy(make_proxy, raw_fake)
        target = "/v1/models?q=" + "b" * 12000
        status, _, body = await _exchange(proxy.url, _head("GET", target, [("X-Big", "a" * 40000)]))
        assert status == 200
        seen = orjson.loads(body)
        assert seen["path_qs"] == target and ["X-Big", "a" * 40000] in seen["headers"]
        (record,) = await _records(proxy.captured)
        assert record.outcome is Outcome.COMPLETED

    async def test_expect_continue_with_oversized_length_gets_413_without_100(
        self, raw_fake: Fake, make_proxy: ProxyFactory
    ) -> None:
        """``Expect: 100-continue`` with a Content-Length over the limit: the first bytes the
        agent gets are the 413 (never ``100 Continue``, which would invite the body)."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake, server={"max_body_bytes": 1000})
        head = _head(
            "POST", "/v1/chat/completions", [("Content-Length", "5000"), ("Expect", "100-continue")]
        )
        status, _, body = await _exchange(proxy.url, head)
        assert status == 413
        _openai_error(body, "request_too_large")
        (record,) = await _records(proxy.captured)
        assert record.outcome is Outcome.REQUEST_TOO_LARGE and upstream.seen == []

    async def test_expect_continue_within_the_limit_gets_100_then_relays(
        self, raw_fake: Fake, make_proxy: ProxyFactory, connect: Connect
    ) -> None:
        """``Expect: 100-continue`` under the limit: ``100 Continue``, then the body the agent
        sends is relayed as ever."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        body = orjson.dumps(CHAT)
        reader, writer = await connect(proxy.url)
        writer.write(
            _head(
                "POST",
                "/v1/chat/completions",
                [("Content-Length", str(len(body))), ("Expect", "100-continue")],
            )
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert _parse(head)[0] == 200 and upstream.seen[0].body == body

    async def test_unknown_expectation_is_a_417(
        self, raw_fake: Fake, make_proxy: ProxyFactory
    ) -> None:
        """An ``Expect`` other than ``100-continue`` gets an OpenAI-shaped 417."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        status, _, body = await _exchange(
            proxy.url, _post(orjson.dumps(CHAT), [("Expect", "tea-please")])
        )
        assert status == 417
        _openai_error(body, "bad_request")
        (record,) = await _records(proxy.captured)
        assert (record.outcome, record.status) == (Outcome.BAD_REQUEST, 417)
        assert upstream.seen == []

    async def test_broken_chunked_framing_mid_body_ends_in_the_read_deadline(
        self, raw_fake: Fake, make_proxy: ProxyFactory, connect: Connect
    ) -> None:
        """A chunked body whose framing breaks once the relay reads it: aiohttp's parser
        drops the body without ending it, so the read deadline answers (408, the connection
        closed); nothing is forwarded."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake, client={"read_timeout_s": 0.5})
        reader, writer = await connect(proxy.url)
        writer.write(
            _head("POST", "/v1/chat/completions", [("Transfer-Encoding", "chunked")])
            + b"2\r\n{}\r\n"
        )
        await asyncio.sleep(0.1)  # the relay is reading the body now
        writer.write(b"zz\r\n")
        got, _ = await _until_closed(reader)
        status, _, body = _parse(got)
        assert status == 408
        _openai_error(body, "client_timeout")
        (record,) = await _records(proxy.captured)
        assert record.outcome is Outcome.CLIENT_TIMEOUT and upstream.seen == []

    @pytest.mark.parametrize(
        "raw",
        [
            b"GET /v1/models HTTP/1.1 extra\r\nHost: proxy\r\n\r\n",
            b"POST /v1/x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST /v1/x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
            b"POST /v1/x HTTP/1.1\r\nHost: p\r\nX-A: b\r\n c\r\nContent-Length: 2\r\n\r\n{}",
            b"POST /v1/x HTTP/1.1\nHost: p\nContent-Length: 2\n\n{}",
        ],
        ids=["malformed-request-line", "cl-and-te", "duplicate-cl", "obs-fold", "bare-lf"],
    )
    async def test_parser_refusal_is_a_400_with_no_traceback(
        self,
        raw_fake: Fake,
        make_proxy: ProxyFactory,
        connect: Connect,
        caplog: pytest.LogCaptureFixture,
        raw: bytes,
    ) -> None:
        """A request aiohttp's parser refuses (a malformed request line, the smuggling
        shapes) is a 400, never forwarded, and is logged as one DEBUG line without a
        traceback (aiohttp logs each at ERROR with one: any client could flood the log)."""
        upstream, _ = raw_fake
        proxy = await _proxy(make_proxy, raw_fake)
        caplog.set_level(logging.DEBUG)
        reader, writer = await connect(proxy.url)
        writer.write(raw)
        got, _ = await _until_closed(reader)
        assert _parse(got)[0] == 400
        assert upstream.seen == [] and proxy.captured.records == []
        logged = [r for r in caplog.records if "Error handling request" in r.getMessage()]
        assert logged, "the refusal is not logged at all"
        assert all(r.levelno == logging.DEBUG and r.exc_info is None for r in logged), [
            (r.name, r.levelname, r.exc_info) for r in logged
        ]
        assert all(r.name == LISTENER_LOG.name for r in logged)


# ============================================================================================
# The listener as ``python -m proxy serve`` configures it


@pytest.fixture(scope="class")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """The proxy as a user starts it, with ``[client] read_timeout_s = 0.3``, in front of a
    port that is bound but not listening; one process for the tests of a class (each test
    leaves it as it found it: its connections closed)."""
    folder = tmp_path_factory.mktemp("served")
    config = folder / "config.toml"
    config.write_text("[client]\nread_timeout_s = 0.3\n[accounting]\nenabled = false\n")
    with socket.socket() as refusing:
        refusing.bind((HOST, 0))
        upstream = f"http://{HOST}:{refusing.getsockname()[1]}"
        with proxy_in_front_of(upstream, folder / "proxy", config) as proxy:
            yield proxy


def _recv_until_closed(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """What the proxy sends on ``sock`` until it closes it, and the seconds that took."""
    t0 = time.monotonic()
    got = b""
    sock.settimeout(within)
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        raise AssertionError(f"still open after {within} s; got {got!r}") from None
    return got, time.monotonic() - t0


class TestServedListener:
    """The listener ``run`` starts: its settings win over ``run_app``'s own (a keep-alive of
    75 s, decompression on) and aiohttp's log of a refused head carries no traceback."""

    def test_stalled_head_is_closed_after_read_timeout(self, served: ProxyProcess) -> None:
        """A head that never ends is closed after ``read_timeout_s`` (0.3 s), not after
        ``run_app``'s 75 s keep-alive."""
        with socket.create_connection((HOST, _port(served.url))) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n")
            got, _ = _recv_until_closed(sock, within=10.0)
        assert got == b""

    def test_refused_heads_leave_no_traceback(self, served: ProxyProcess) -> None:
        """Twenty malformed request lines are each answered 400 and leave nothing on
        stderr."""
        for i in range(20):
            with socket.create_connection((HOST, _port(served.url))) as sock:
                sock.sendall(f"GET /{i} HTTP/1.1 junk\r\nHost: proxy\r\n\r\n".encode())
                got, _ = _recv_until_closed(sock, within=10.0)
            assert got.startswith(b"HTTP/1.0 400 ")
        time.sleep(0.2)
        stderr = (served.log_file.parent / "stderr.txt").read_text()
        assert "Traceback" not in stderr and "Error handling request" not in stderr, stderr
