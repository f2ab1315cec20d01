"""A stray chunked terminator after a response that has no body. Pure.

llama-server answers ``POST /cors-proxy`` with a 204 that carries ``Transfer-Encoding:
chunked`` and then the chunked terminator ``0\\r\\n\\r\\n`` (llama.cpp issue 26598). RFC 9112
section 6.3: a 204 or 304 ends at its header section whatever its headers say, so those five
bytes belong to no response; aiohttp's client parser reads them as the next status line and
fails the 204 itself ("Bad status line"). :class:`StrayTerminator` sits in front of the parser
of one upstream connection and drops exactly those bytes: after the head of a 204 or 304
that declared ``chunked``, a following ``0\\r\\n\\r\\n`` is removed; any other byte passes.

Only response heads are scanned (once per response, until their blank line); body bytes pass
untouched, so a stream costs one state check per chunk.
"""

from __future__ import annotations

import enum

__all__ = ["MAX_HEAD_BYTES", "StrayTerminator"]

TERMINATOR = b"0\r\n\r\n"
MAX_HEAD_BYTES = 64 * 1024
"""A head longer than this is left to the parser (which refuses it); no more is scanned."""
_BODYLESS = frozenset({204, 304})
_HTTP1 = b"HTTP/1."


class _State(enum.Enum):
    HEAD = "head"
    TERMINATOR = "terminator"
    BODY = "body"


def _bodyless_and_chunked(head: bytes) -> bool:
    """Whether a response head is a 204/304 whose headers declare chunked framing."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit() or int(parts[1]) not in _BODYLESS:
        return False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"transfer-encoding":
            return b"chunked" in value.lower()
    return False


def _never_bodyless(data: bytes) -> bool:
    """Whether ``data`` begins with a whole status line (``HTTP/1.x NNN`` then a space or
    CR) whose code is not 1xx, 204 or 304."""
    code = data[9:12]
    return (
        data.startswith(_HTTP1)
        and data[8:9] == b" "
        and data[12:13] in (b" ", b"\r")
        and code.isdigit()
        and code[:1] != b"1"
        and code not in (b"204", b"304")
    )


def _informational(head: bytes) -> bool:
    parts = head.split(b" ", 2)
    return len(parts) >= 2 and parts[1][:1] == b"1" and len(parts[1]) == 3


class StrayTerminator:
    """Filters the bytes of one connection's responses; :meth:`reset` when a request is sent
    (llama-server does not pipeline: a response begins only after a request)."""

    def __init__(self) -> None:
        self._state = _State.HEAD
        self._head = bytearray()
        self._held = b""
        self.dropped = 0
        """How many stray terminators were dropped on this connection."""
        self.in_body = False
        """True while body bytes pass (they need no :meth:`feed`: it returns them as they are)."""

    def _set(self, state: _State) -> None:
        self._state = state
        self.in_body = state is _State.BODY

    def reset(self) -> None:
        """A new response is expected: scan its head."""
        self._set(_State.HEAD)
        self._head.clear()
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """The bytes to give the parser for ``data`` (the same object when nothing is
        removed or held)."""
        if self.in_body or not data:
            return data
        if self._state is _State.TERMINATOR:
            return self._after_head(data)
        return self._in_head(data)

    def _in_head(self, data: bytes) -> bytes:
        if not self._head and _never_bodyless(data):
            # the common case, decided from the status line: no 1xx, 204 or 304, so no
            # stray terminator can follow this head and it need not be scanned
            self._set(_State.BODY)
            return data
        start = len(self._head)
        self._head += data
        end = self._head.find(b"\r\n\r\n", max(0, start - 3))
        if end < 0:
            if len(self._head) > MAX_HEAD_BYTES:
                self._set(_State.BODY)
            return data
        head = bytes(self._head[:end])
        rest = data[end + 4 - start :]
        if _informational(head):  # a 1xx: the final head follows
            self._head.clear()
            return data[: end + 4 - start] + self._in_head(rest) if rest else data
        self._head.clear()
        if not _bodyless_and_chunked(head):
            self._set(_State.BODY)
            return data
        self._set(_State.TERMINATOR)
        return data[: end + 4 - start] + self._after_head(rest)

    def _after_head(self, data: bytes) -> bytes:
        """Bytes after a bodyless chunked head: a whole terminator is dropped, a partial one
        held until it is whole or proves to be something else."""
        seen = self._held + data
        self._held = b""
        if len(seen) < len(TERMINATOR) and TERMINATOR.startswith(seen):
            self._held = seen
            return b""
        self._set(_State.BODY)
        if seen.startswith(TERMINATOR):
            self.dropped += 1
            return seen[len(TERMINATOR) :]
        return seen
