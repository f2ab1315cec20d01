"""Incremental Server-Sent Events framer: bytes in, events out, no I/O.

Implements WHATWG HTML "event stream interpretation" on raw bytes. Lines end with CRLF, LF or
CR only (never U+2028 and friends); a leading UTF-8 BOM is skipped; ``data`` stays bytes, so a
UTF-8 character split across chunks is harmless. A CR ending a chunk terminates its line at
once and a LF opening the next chunk is swallowed, so CRLF split across chunks counts once.

``data:`` with an empty value still dispatches (data ``b""``): the spec tests for an empty
data buffer before stripping its final LF. ``id`` persists across events (the last event ID);
``retry`` is reported only on the event whose block carried it.

Memory is capped: when an event's data held plus its current line (field name included)
would exceed ``max_event_bytes``, the event is dropped, later lines up to its blank line are
ignored unparsed, and ``oversized`` counts it. LF-only input (llama-server's
``data: {json}\\n\\n``) takes a fast path: a whole one-line ``data:`` event costs one
``find`` and one slice, with no per-byte work; a chunk that is exactly one such event, which
is how llama-server writes its streams, is checked and sliced without entering the loop
(:meth:`SSEFramer.whole`: its data alone, with no list and no event object around it).
"""

from __future__ import annotations

from contextlib import suppress
from functools import partial
from typing import NamedTuple

__all__ = ["SSEEvent", "SSEFramer"]

_BOM = b"\xef\xbb\xbf"


class SSEEvent(NamedTuple):
    """One dispatched event; ``id`` is the last event ID in force when it was dispatched.
    Immutable; a named tuple, which costs a third of a frozen dataclass to make, once per
    event of every stream."""

    data: bytes
    event: str = "message"
    id: str | None = None
    retry: int | None = None


_event = partial(tuple.__new__, SSEEvent)
"""``_event((data, event, id, retry))``: an :class:`SSEEvent`, made as the named tuple's own
constructor makes it (``tuple.__new__``) without that constructor's Python-level call, once
per event of every stream."""


class SSEFramer:
    """Feed chunks of one stream in order; ``feed`` returns the events they complete."""

    def __init__(self, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self.max_event_bytes = max_event_bytes
        self.events = 0  # events dispatched
        self.comments = 0  # comment lines (``:`` keep-alive pings included)
        self.oversized = 0  # events dropped for exceeding max_event_bytes
        self.incomplete_at_eof = False  # set by flush(): the stream ended mid-event
        self._head: bytes | None = b""  # bytes held while a leading BOM is undecided
        self._buf = bytearray()  # the current, unterminated line
        self._data: list[bytes] = []  # data field values of the current event
        self._size = 0  # sum of len(self._data)
        self._event: bytes | None = None
        self._retry: int | None = None
        self._last_id: str | None = None  # persists across events, per spec
        self._dirty = False  # the current event has a field line, or is being skipped
        self._skipping = False  # dropping an oversized event up to its blank line
        self._discarding = False  # skipping and mid-line: drop bytes up to the next LF
        self._trailing_cr = False  # last chunk ended in CR: a leading LF is its CRLF half
        self._simple = False  # idle after the last chunk: a chunk of one whole event frames alone

    @property
    def buffered(self) -> int:
        """Bytes currently held: partial line, undecided BOM bytes and data of the event."""
        return len(self._head or b"") + len(self._buf) + self._size

    @property
    def idle(self) -> bool:
        """Between events: nothing held, no event begun or being skipped, no CR pending and
        the leading BOM settled. Then how bytes frame depends on them alone."""
        return not (
            self._head is not None
            or self._buf
            or self._dirty
            or self._discarding
            or self._trailing_cr
        )

    def whole(self, chunk: bytes) -> bytes | None:
        """The data of ``chunk`` when it is one whole one-line ``data:`` event, LF-ended,
        arriving between events (how llama-server writes its streams): the event is counted
        and nothing else changes. None: ``chunk`` is for :meth:`feed`."""
        if (
            self._simple
            and type(chunk) is bytes
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk[-1] == 10  # the chunk ends with its first LF and a second one
            and chunk.startswith(b"data:")
            and chunk.find(b"\r") < 0
            and len(chunk) - 2 <= self.max_event_bytes
        ):
            self.events += 1
            return chunk[6:-2] if chunk[5] == 32 else chunk[5:-2]  # one space after the colon
        return None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk`` and return the events it completes; never raises."""
        data = self.whole(chunk)
        if data is not None:
            return [_event((data, "message", self._last_id, None))]
        self._simple = False  # until this chunk is framed
        out: list[SSEEvent] = []
        if (
            self._head is not None
            or self._trailing_cr
            or type(chunk) is not bytes
            or chunk.find(b"\r") >= 0  # faster than ``in`` for one byte
        ):
            chunk = self._normalise(chunk)
        if not chunk:
            return out
        pos = self._close_open_line(chunk) if self._buf or self._discarding else 0
        if pos < 0:
            return out
        # the hot loop stays inline: llama-server's one-line events take the fast path
        n = len(chunk)
        cap = self.max_event_bytes
        find = chunk.find
        startswith = chunk.startswith
        while pos < n:
            i = find(b"\n", pos)
            if i < 0:
                break
            if i == pos:
                self._blank(out)
                pos += 1
            elif (
                not self._dirty
                and startswith(b"\n", i + 1)
                and startswith(b"data:", pos)
                and i - pos <= cap
            ):  # fast path: a whole one-line ``data:`` event
                s = pos + 6 if startswith(b" ", pos + 5) else pos + 5
                out.append(_event((chunk[s:i], "message", self._last_id, None)))
                pos = i + 2
            else:
                self._line(chunk[pos:i])
                pos = i + 1
        if pos < n:  # an unterminated line remains
            self._hold(memoryview(chunk)[pos:])
        self.events += len(out)
        self._simple = self.idle
        return out

    def _normalise(self, chunk: bytes) -> bytes:
        """``chunk`` as bytes with LF line ends, after a leading BOM and a CRLF's LF half."""
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        if self._head is not None:  # stream start: skip one BOM, even if split
            head = self._head + chunk
            if len(head) < 3 and _BOM.startswith(head):
                self._head = head
                return b""
            self._head = None
            chunk = head[3:] if head.startswith(_BOM) else head
        if self._trailing_cr and chunk:
            self._trailing_cr = False
            if chunk[0] == 10:
                chunk = chunk[1:]
        if b"\r" in chunk:  # normalise to LF; CR/LF never occur inside UTF-8 sequences
            self._trailing_cr = chunk[-1] == 13
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return chunk

    def _close_open_line(self, chunk: bytes) -> int:
        """Finish the line the last chunk left open; where the next line starts, or -1 when
        ``chunk`` holds no line end (then all of it was taken)."""
        i = chunk.find(b"\n")
        if i < 0:
            if not self._discarding:
                self._hold(chunk)
            return -1
        if self._discarding:
            self._discarding = False
        else:
            self._buf += memoryview(chunk)[:i]
            line = bytes(self._buf)
            self._buf.clear()
            self._line(line)
        return i + 1

    def _hold(self, rest: bytes | memoryview) -> None:
        """Keep the start of an unterminated line, within the event's byte cap."""
        if self._skipping:
            self._discarding = True
            return
        self._buf += rest
        if self._size + len(self._buf) > self.max_event_bytes:
            self._overflow()
            self._discarding = True

    def flush(self) -> list[SSEEvent]:
        """End of stream: discard any incomplete event (per spec) and flag it."""
        self.incomplete_at_eof = bool(self._head or self._buf or self._dirty or self._discarding)
        self._head = None
        self._buf = bytearray()
        self._reset()
        self._discarding = self._trailing_cr = False
        return []

    def _line(self, line: bytes) -> None:
        """Process one complete, non-empty line of the current event."""
        if self._skipping:
            return
        if self._size + len(line) > self.max_event_bytes:
            self._overflow()
            return
        if line[0] == 58:  # ':' comment
            self.comments += 1
            return
        self._dirty = True
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 2 :] if line.startswith(b" ", colon + 1) else line[colon + 1 :]
        if name == b"data":
            self._data.append(value)
            self._size += len(value) + 1  # the LF that joins data lines counts too
        elif name == b"event":
            self._event = value
        elif name == b"id":
            if b"\x00" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            with suppress(ValueError):  # more digits than sys.get_int_max_str_digits()
                self._retry = int(value)

    def _blank(self, out: list[SSEEvent]) -> None:
        """A blank line: dispatch the current event if it has a data buffer."""
        if not self._dirty:
            return
        if self._data and not self._skipping:
            data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
            event = self._event.decode("utf-8", "replace") if self._event else "message"
            out.append(SSEEvent(data, event, self._last_id, self._retry))
        self._reset()

    def _overflow(self) -> None:
        """Drop the current event and skip input up to its terminating blank line."""
        self.oversized += 1
        self._reset()
        self._buf.clear()
        self._skipping = self._dirty = True

    def _reset(self) -> None:
        self._data = []
        self._size = 0
        self._event = self._retry = None
        self._skipping = self._dirty = False
