"""Header policy: which headers cross the proxy, in either direction.

Hop-by-hop headers (RFC 9110 §7.6.1, Go's ``hopHeaders``) describe one connection, not the
message, so they never cross; neither does any header that ``Connection`` names
(golang/go#16875). Framing (``Content-Length``, ``Transfer-Encoding``) is left to aiohttp,
which re-frames each side; copying an upstream ``Content-Length`` onto a streamed response
would make aiohttp silently truncate the body. ``Host`` is derived by the client from the
upstream URL, never copied from the agent's request.
"""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict

__all__ = [
    "BODYLESS",
    "HOP_BY_HOP",
    "REQUEST_DROP",
    "REQUEST_ID_HEADER",
    "bodyless_head",
    "request_drop",
    "request_headers",
    "response_headers",
]

HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that belong to one connection (lower case)."""

_FRAMING = frozenset({"content-length"})
_REQUEST_ONLY = frozenset({"host", "expect"})

REQUEST_ID_HEADER = "X-Timing-Proxy-Request-Id"
"""The one response header the proxy adds: its request id, the ``id`` of the record."""

BODYLESS = frozenset({204, 304})
"""Statuses whose response ends at its header section whatever its headers say (RFC 9112
section 6.3)."""
_BODYLESS_CODES = frozenset(str(status).encode() for status in BODYLESS)


def bodyless_head(head: bytes) -> bool:
    """Whether ``head``, the first bytes of an HTTP/1.x response, is a 204 or 304: a response
    that ends at its header section whatever its headers say (RFC 9112 section 6.3)."""
    return (
        head.startswith(b"HTTP/1.")
        and head[9:12] in _BODYLESS_CODES
        and head[12:13] in (b" ", b"\r")
    )


def _filter(
    headers: Iterable[tuple[str, str]], drop: frozenset[str], out: CIMultiDict[str]
) -> CIMultiDict[str]:
    """``out`` with ``headers`` added, less those in ``drop`` (which holds ``connection``)
    and those a ``Connection`` header names, in one pass: the few named are taken out at
    the end, as they may come before it."""
    add = out.add
    named: list[str] = []
    for name, value in headers:
        lower = name.lower()
        if lower not in drop:
            add(name, value)
        elif lower == "connection":
            named += (t.strip().lower() for t in value.split(","))
    for token in named:
        if token:
            out.popall(token, None)
    return out


REQUEST_DROP: frozenset[str] = HOP_BY_HOP | _FRAMING | _REQUEST_ONLY
"""Request headers that never reach the upstream (lower case)."""


def request_drop(*proxy_own: str) -> frozenset[str]:
    """:data:`REQUEST_DROP` and the proxy's own request headers (the annotate header: it
    is addressed to the proxy, not to llama-server), for :func:`request_headers`."""
    return REQUEST_DROP | {name.lower() for name in proxy_own}


def request_headers(
    headers: Iterable[tuple[str, str]], drop: frozenset[str] = REQUEST_DROP
) -> CIMultiDict[str]:
    """Return the agent's end-to-end request headers to send upstream, in their order.

    ``Authorization`` and ``X-Api-Key`` pass unchanged. ``Accept-Encoding`` is forced to
    ``identity`` so that the upstream never compresses what the framer must read. ``drop``
    names (lower case) what never crosses: :func:`request_drop` adds the proxy's own.
    """
    out = _filter(headers, drop, CIMultiDict())
    out["Accept-Encoding"] = "identity"
    return out


_RESPONSE_DROP = HOP_BY_HOP | _FRAMING


def response_headers(
    headers: Iterable[tuple[str, str]], into: CIMultiDict[str] | None = None
) -> CIMultiDict[str]:
    """Return the upstream's end-to-end response headers to send to the agent, in order,
    added to ``into`` (a response's own headers, which are then not copied) or to a new
    multidict."""
    return _filter(headers, _RESPONSE_DROP, CIMultiDict() if into is None else into)
