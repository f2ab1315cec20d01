"""The upstream as the proxy reaches it: its client session, a relayed request sent to it
and its head waited for, the check at start, and a failure to reach it said in words
(``connection refused (ClientConnectorError)``)."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.connector import Connection
from yarl import URL

from proxy.config import Config
from proxy.core.headers import BODYLESS, bodyless_head, request_headers
from proxy.core.record import Outcome
from proxy.serve.intake import Refusal

__all__ = [
    "UpstreamResponse",
    "ask",
    "auth_headers",
    "check_upstream",
    "failure_cause",
    "own_headers",
    "upstream_session",
]

CHECK_TIMEOUT_S = 3.0
"""How long the check at start waits for ``/health`` to answer."""

HEAD_WATCH_BYTES = 64 * 1024
"""How far :class:`BodylessGuard` reads into a response for the end of its header section."""


class BodylessGuard(asyncio.Protocol):
    """Sits between an upstream connection's transport and aiohttp's protocol while a
    response's head is awaited, and passes every byte on but those that follow a 204 or 304's
    header section in the read that ends it: RFC 9112 section 6.3 ends such a response at its
    head, so those bytes belong to no response (llama-server's chunked terminator after its
    204) and aiohttp's parser would fail the whole read on them. Like nginx and Go's
    ReverseProxy, the proxy drops them and closes the connection (:class:`UpstreamResponse`).
    Once the head has passed, the transport reads into aiohttp's protocol directly again."""

    def __init__(self, transport: asyncio.Transport, inner: asyncio.Protocol) -> None:
        self._transport = transport
        self.inner = inner
        self._head = b""
        """The response's bytes so far, its header section not ended yet."""
        self.dropped = False

    def data_received(self, data: bytes) -> None:
        head = self._head + data if self._head else data
        end = head.find(b"\r\n\r\n")
        if end < 0 and len(head) < HEAD_WATCH_BYTES:
            self._head = head
        else:
            self._transport.set_protocol(self.inner)
            kept = end + 4 - (len(head) - len(data))
            if end >= 0 and kept < len(data) and bodyless_head(head):
                self.dropped = True
                data = data[:kept]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _guard(transport: asyncio.Transport | None) -> BodylessGuard | None:
    """A :class:`BodylessGuard` put between ``transport`` and aiohttp's protocol."""
    if transport is None:
        return None
    protocol = transport.get_protocol()
    if isinstance(protocol, BodylessGuard):  # no head came for the last request on it
        protocol = protocol.inner
    if not isinstance(protocol, asyncio.Protocol):
        return None
    guard = BodylessGuard(transport, protocol)
    transport.set_protocol(guard)
    return guard


class UpstreamResponse(aiohttp.ClientResponse):
    """A response of the upstream sessions (their ``response_class``): a 204 or 304 that
    declares ``Transfer-Encoding: chunked``, or that came with bytes after its head, closes
    its connection at once.

    llama-server answers ``POST /cors-proxy`` with such a 204 and then sends the chunked
    terminator ``0\\r\\n\\r\\n`` (llama.cpp issue 26598). Those five bytes belong to no
    response: in the head's read :class:`BodylessGuard` drops them; in a later read, on a
    pooled connection, aiohttp's parser would take them for the status line of the next
    answer and fail that request. aiohttp hands a bodyless response's connection back to the
    pool while it starts the response, so it is closed here, right after, before any other
    request can take it: the next request opens a connection of its own. The response itself
    starts with the request already sent and nothing read, so the guard sees its head whole."""

    async def start(self, connection: Connection) -> aiohttp.ClientResponse:
        transport = connection.transport  # read first: it is gone from a released connection
        guard = _guard(transport)
        await super().start(connection)
        if self.status in BODYLESS and transport is not None:
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            if chunked or (guard is not None and guard.dropped):
                transport.close()
        return self


_NO_AUTO_HEADERS = ("User-Agent", "Accept", "Content-Type")
"""The headers aiohttp's client would add by itself, which the upstream sessions do not."""


def upstream_session(config: Config, *, pooled: bool = True) -> aiohttp.ClientSession:
    """A session for the upstream: no total deadline; pooled connections are closed before
    llama-server's 5 s idle close; ``pooled=False`` closes each connection after use. It
    adds no ``User-Agent``, ``Accept`` or ``Content-Type`` of aiohttp's own: a relayed
    request carries the agent's headers only (set here once, not worked out per request)."""
    up = config.upstream
    connector = (
        aiohttp.TCPConnector(limit=up.max_connections, keepalive_timeout=up.keepalive_timeout_s)
        if pooled
        else aiohttp.TCPConnector(limit=up.max_connections, force_close=True)
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=up.connect_timeout_s, sock_read=None
        ),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=_NO_AUTO_HEADERS,
        response_class=UpstreamResponse,
    )


async def ask(
    session: aiohttp.ClientSession,
    base: str,
    request: web.BaseRequest,
    drop: frozenset[str],
    body: bytes,
    header_timeout_s: float,
) -> aiohttp.ClientResponse:
    """Send the agent's request to the upstream at ``base`` (its path and query still
    encoded, its end-to-end headers but ``drop``, ``body`` as it arrived) and wait for the
    response's head, at most ``header_timeout_s`` (0: no limit). A :class:`Refusal` when
    none comes: 504 ``upstream_timeout``, or 502 ``upstream_unreachable`` in words."""
    url = URL(base + request.raw_path, encoded=True)
    asked = session.request(
        request.method,
        url,
        headers=request_headers(request.headers.items(), drop),
        data=body if body else None,
        allow_redirects=False,
    )
    try:
        if header_timeout_s <= 0:
            return await asked
        async with asyncio.timeout(header_timeout_s):
            return await asked
    except TimeoutError:
        message = f"upstream sent no response headers within {header_timeout_s} s"
        raise Refusal(Outcome.UPSTREAM_TIMEOUT, 504, message) from None
    except aiohttp.ClientError as exc:
        target = url.with_user(None).with_query(None).with_fragment(None)
        message = f"upstream unreachable: {target}: {failure_cause(exc)}"
        raise Refusal(Outcome.UPSTREAM_UNREACHABLE, 502, message) from None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer header for llama-server's ``--api-key`` (none when no key is set)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def own_headers(config: Config) -> dict[str, str]:
    """Headers of the proxy's own requests to the upstream (its API key, if one is set)."""
    return auth_headers(config.upstream.api_key)


def _os_words(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return f"host name not resolved: {error.strerror or error}"
    if error.errno is not None and error.errno > 0:
        return os.strerror(error.errno).lower()
    return str(error)


def failure_cause(exc: BaseException) -> str:
    """Why a request to the upstream failed, in words, then the exception's class:
    ``connection refused (ClientConnectorError)``; only the class when there are no words."""
    name = type(exc).__name__
    if isinstance(exc, aiohttp.ClientConnectorError):
        words = _os_words(exc.os_error)
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        words = "the connection closed before a response"
    elif isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
        words = "no answer in time"
    elif isinstance(exc, OSError):
        words = _os_words(exc)
    else:
        words = str(exc)
    return f"{words} ({name})" if words else name


async def check_upstream(session: aiohttp.ClientSession, config: Config, log: Any) -> bool:
    """GET ``/health`` once and log the result: ``upstream_ok`` (info) on any HTTP answer,
    ``upstream_unreachable`` (warning, with the URL and the cause) when there is none."""
    url = str(URL(config.upstream.url.rstrip("/") + "/health").with_user(None))
    try:
        resp = await session.get(
            url,
            headers=own_headers(config),
            timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S),
            allow_redirects=False,
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("upstream_unreachable", url=url, cause=failure_cause(exc))
        return False
    resp.close()  # the status is all the check needs: the body is never read
    log.info("upstream_ok", url=url, status=resp.status)
    return True
