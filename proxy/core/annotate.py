"""In-band annotation, opt-in: where the timing goes in each API's stream, and what it says. Pure.

An annotated event stream gets one SSE comment line, ``: timing-proxy {json}`` and a blank
line, at an event boundary: right after the event that carries llama-server's timings and
before the stream's terminator. Every other byte stays as llama-server sent it, in order;
conforming SSE parsers ignore comment lines. Where the line goes is the API's
:class:`Anchor`; :class:`Splitter` finds it in the chunks as they are read, holding back at
a chunk's end only the few bytes that could be the start of the anchor. A non-streamed
answer gets a ``Server-Timing`` header instead (:func:`server_timing`).

Event boundaries are llama-server's: events end with ``\\n\\n`` (LF is its only line end).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.record import Record

__all__ = [
    "ANCHORS",
    "COMMENT_PREFIX",
    "FIELDS",
    "Anchor",
    "Splitter",
    "annotation",
    "comment",
    "server_timing",
]

COMMENT_PREFIX = b": timing-proxy "
"""How the annotation line starts: an SSE comment (a line that starts with a colon)."""

_BOUNDARY = b"\n\n"


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where the comment goes in one API's stream: at the event whose first bytes are
    ``start`` (at an event boundary), before it, or after it when ``after``."""

    start: bytes
    after: bool = False


ANCHORS: Mapping[str, Anchor] = {
    # before the terminator; the legacy /v1/completions ends the same way, the native
    # /completion has no terminator: its final event (stop, timings) is the stream's last,
    # so the comment goes at the end
    "chat_completions": Anchor(b"data: [DONE]\n"),
    "completions": Anchor(b"data: [DONE]\n"),
    # after response.completed (it carries timings and usage): llama-server sends no end
    "responses": Anchor(b"event: response.completed\n", after=True),
    # before message_stop (message_delta, with the usage, comes before it)
    "messages": Anchor(b"event: message_stop\n"),
}
"""The anchor of each API (the record's ``api``); an API without one gets the comment at the
end of a stream that ended normally."""

FIELDS: tuple[str, ...] = (
    "id",
    "api",
    "kind",
    "ttfb_ms",
    "ttft_ms",
    "decode_wall_ms",
    "prefill_ms",
    "decode_ms",
    "prompt_n",
    "cache_n",
    "predicted_n",
    "prefill_tok_s",
    "decode_tok_s",
    "cache_hit_ratio",
    "finish_reason",
    "tool_calls",
    "tool_call_valid",
    "tool_call_ms",
    "tool_call_tokens",
)
"""The record's fields an annotation holds, each with the value the record will have: all
are decided by the events before the anchor."""


def annotation(record: Record, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The annotation's JSON object: :data:`FIELDS` of ``record`` (built from what was seen
    up to the anchor), then ``schema``: the accounting's state and the schema fields known."""
    out = {name: getattr(record, name) for name in FIELDS}
    out["kind"] = str(record.kind)
    out.update(schema)
    return out


def comment(fields: Mapping[str, Any]) -> bytes:
    """The comment line and its blank line: compact JSON, one line (orjson escapes every
    control character in strings and writes no whitespace, so no newline gets in)."""
    return COMMENT_PREFIX + orjson.dumps(fields) + _BOUNDARY


class Splitter:
    """Finds where the comment goes in one stream, fed the upstream's chunks in order.

    :meth:`split` returns the bytes to write now, in order, and, once the place is found,
    the bytes that follow it (the splitter is then spent). Before that, bytes at a chunk's
    end that could begin the anchor are held back and returned with the next chunk.
    """

    __slots__ = ("_after", "_held", "_in_event", "_needle", "_skip", "_tail", "found")

    def __init__(self, anchor: Anchor | None) -> None:
        self._needle = _BOUNDARY + anchor.start if anchor is not None else None
        self._skip = len(anchor.start) - 1 if anchor is not None else 0
        self._after = anchor is not None and anchor.after
        self._tail = _BOUNDARY  # the last two bytes released: a stream starts at a boundary
        self._held = b""
        self._in_event = False  # an ``after`` anchor's event has begun, its end not yet seen
        self.found = False

    @property
    def held(self) -> bytes:
        """The bytes held back so far (never more than the anchor's length)."""
        return self._held

    def split(self, chunk: bytes) -> tuple[bytes, bytes | None]:
        """``(now, None)``: write ``now``, the place is not in it; ``(before, after)``: the
        comment goes between ``before`` and ``after``."""
        buf = self._held + chunk if self._held else chunk
        self._held = b""
        view = self._tail + buf  # buf's index = view's index - 2
        at = self._place(view)
        if at is None:
            now = buf[: len(buf) - len(self._held)]
            self._tail = (self._tail + now)[-2:]
            return now, None
        self.found = True
        return buf[:at], buf[at:]

    def _place(self, view: bytes) -> int | None:
        """Where the comment goes in ``view[2:]``, or None (then maybe holding bytes back)."""
        if self._in_event:
            return self._event_end(view, 1)
        if self._needle is None:
            return None
        i = view.find(self._needle)
        if i < 0:
            self._held = self._partial(view, self._needle)
            return None
        if not self._after:
            return i  # the anchor's first byte: view index i + 2
        self._in_event = True
        return self._event_end(view, i + 2 + self._skip)

    def _event_end(self, view: bytes, start: int) -> int | None:
        """Just after the blank line that ends the anchor's event, searched from ``start``."""
        j = view.find(_BOUNDARY, start)
        return None if j < 0 else j  # after the boundary: view index j + 2

    @staticmethod
    def _partial(view: bytes, needle: bytes) -> bytes:
        """The longest end of ``view`` that begins the anchor after a boundary: only the
        anchor's own bytes are held, never the blank line before it."""
        for k in range(min(len(needle) - 1, len(view)), 2, -1):
            if view.endswith(needle[:k]):
                return view[len(view) - (k - 2) :]
        return b""

    def end(self) -> tuple[bytes, bool]:
        """The stream ended: the bytes still held (to write), and whether the stream then
        ends at an event boundary (where a comment may still go)."""
        held, self._held = self._held, b""
        return held, not held and self._tail == _BOUNDARY


def _number(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def server_timing(record: Record, upstream_ms: float | None) -> str:
    """The ``Server-Timing`` value (W3C) of a non-streamed answer: llama-server's prefill and
    decode, the tool call, the upstream's first byte and the whole body, on the proxy's clock
    where the metric says so; unknown values are left out."""
    metrics: list[tuple[str, float | None, str]] = [
        ("prefill", record.prefill_ms, _prefill_desc(record)),
        ("decode", record.decode_ms, _count_desc(record.predicted_n, "tokens")),
        ("tool_call", record.tool_call_ms, _count_desc(record.tool_call_tokens, "tokens")),
        ("ttfb", record.ttfb_ms, "first byte from llama-server"),
        ("upstream", upstream_ms, "request in to whole body, held for this header"),
    ]
    parts = [f"timing-proxy;desc={record.id}"] if record.id else []
    for name, dur, desc in metrics:
        if dur is not None:
            parts.append(
                f'{name};dur={_number(dur)};desc="{desc}"' if desc else f"{name};dur={_number(dur)}"
            )
    return ", ".join(parts)


def _prefill_desc(record: Record) -> str:
    if record.prompt_n is None:
        return ""
    cached = f", {record.cache_n} cached" if record.cache_n is not None else ""
    return f"{record.prompt_n} tokens{cached}"


def _count_desc(count: int | None, unit: str) -> str:
    return f"{count} {unit}" if count is not None else ""
