"""The timing tracker: response bytes and an injected clock in, an :class:`Observation` out.

Pure (no I/O). The relay hands it every chunk exactly as it forwarded it. A stream is framed
by :class:`~proxy.core.sse.SSEFramer` and each event read through the response's
:class:`~proxy.core.dialects.Dialect`: its byte patterns say whether the event carries a
token, reasoning, or something else worth reading (``timings``, ``usage``, a tool call, an
error, a finish reason, the end); only then, or for the first event (``model``), is the
event's JSON parsed, once, and the dialect's readers asked. llama-server writes compact JSON,
in which a key cannot occur unescaped inside a string, so the patterns find keys, not text.
A plain JSON body is kept (bounded) and read at the end.

:meth:`StreamTracker.feed` never raises: an exception in the analysis is kept in
``analysis_error`` and the analysis stops, while the relay goes on forwarding bytes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.core.dialects import CHAT_COMPLETIONS, REASONING, Dialect
from proxy.core.observation import MAX_REASONING_BYTES, Observation
from proxy.core.record import ServerTimings
from proxy.core.sse import SSEFramer
from proxy.core.tool_calls import MAX_ARGUMENT_BYTES, ToolCall, ToolCallAssembly

__all__ = [
    "MAX_ARGUMENT_BYTES",
    "MAX_REASONING_BYTES",
    "Clock",
    "Observation",
    "StreamTracker",
    "ToolCall",
]

Clock = Callable[[], float]

_UNREAD = object()
"""An event's JSON not parsed yet."""
_NOT_JSON = object()
"""An event's data that does not parse as JSON."""


def _json(data: bytes) -> object:
    """``data`` parsed, or :data:`_NOT_JSON`."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _NOT_JSON


class StreamTracker:
    """Watches one response body. ``sse`` selects SSE framing, else a JSON body is read."""

    def __init__(
        self,
        t0: float,
        *,
        sse: bool,
        clock: Clock = time.perf_counter,
        max_event_bytes: int = 8 * 1024 * 1024,
        max_body_bytes: int = 32 * 1024 * 1024,
        skip: str | None = None,
        dialect: Dialect = CHAT_COMPLETIONS,
        defer_bytes: int = 0,
    ) -> None:
        """``skip`` names why the body cannot be read (e.g. it is compressed): then only
        bytes and times are observed, and the counts of events and calls stay unknown.
        ``dialect`` is the API whose events these are. ``defer_bytes`` lets :meth:`feed`
        keep up to that many bytes, with their times, and read them only when more would
        not fit or when what was seen is asked for (:meth:`finish`, :meth:`peek`,
        :attr:`done`): a short response is then read after the relay has forwarded all of
        it. The observation is the same either way."""
        self._defer = defer_bytes
        self._deferred: list[tuple[bytes, float]] = []
        self._deferred_bytes = 0
        self._dialect = dialect
        self._tool_deltas = dialect.tool_reader()
        self._end_data = dialect.end_data
        self._carries_token = dialect.token.search
        self._interesting = dialect.interesting.search
        self._t0 = t0
        self._clock = clock
        self._skip = skip
        self._framer = SSEFramer(max_event_bytes) if sse and skip is None else None
        self._body: list[bytes] | None = None if sse or skip is not None else []
        self._max_body = max_body_bytes
        self._bytes = 0
        self._first_byte: float | None = None
        self._first_event: float | None = None
        self._last_byte: float | None = None
        self._first_token: float | None = None
        self._last_token: float | None = None
        self._tool_time: float | None = None
        self._events = 0
        self._token_events = 0
        self._timings: ServerTimings | None = None
        self._usage: ServerTimings | None = None
        self._model: str | None = None
        self._response_id: str | None = None
        self._finish: str | None = None
        self._calls = ToolCallAssembly()
        self._error: str | None = None
        self._call_cut = False
        self._analysis_error: str | None = skip
        self._done = False
        self._reasoning_first: float | None = None
        self._reasoning_last: float | None = None
        self._reasoning_parts: list[str] | None = []  # None once over the cap
        self._reasoning_size = 0

    @property
    def done(self) -> bool:
        """True once the event that ends a complete stream (``[DONE]``) was seen (the bytes
        kept unread are read first)."""
        if self._deferred:
            self._read_deferred()
        return self._done

    @property
    def bytes_seen(self) -> int:
        """Body bytes fed so far (those kept unread included)."""
        return self._bytes + self._deferred_bytes

    def feed(self, chunk: bytes, at: float | None = None) -> None:
        """Take one forwarded chunk, read from the upstream at clock time ``at`` (now when
        not given). Never raises."""
        if self._defer:
            when = self._clock() if at is None else at
            kept = self._deferred_bytes + len(chunk)
            if kept <= self._defer:
                self._deferred.append((chunk, when))
                self._deferred_bytes = kept
                return
            self._read_deferred()
            at = when
        self._feed(chunk, at)

    def _read_deferred(self) -> None:
        """Read the chunks kept unread, in order, each at its own time."""
        deferred, self._deferred, self._deferred_bytes = self._deferred, [], 0
        for chunk, at in deferred:
            self._feed(chunk, at)

    def _feed(self, chunk: bytes, at: float | None) -> None:
        now = (self._clock() if at is None else at) - self._t0
        if self._first_byte is None:
            self._first_byte = now
        self._last_byte = now
        self._bytes += len(chunk)
        if self._analysis_error is not None:
            return
        try:
            framer = self._framer
            if framer is not None:
                data = framer.whole(chunk)
                if data is not None:
                    self._on_event(data, now)
                else:
                    for event in framer.feed(chunk):
                        self._on_event(event.data, now)
            elif self._body is not None:
                self._keep(chunk)
        except Exception as exc:  # the analysis must never disturb the relay
            self._analysis_error = f"tracker: {type(exc).__name__}"

    def _keep(self, chunk: bytes) -> None:
        """Keep a plain body's chunk, within ``max_body_bytes``."""
        assert self._body is not None
        if self._bytes <= self._max_body:
            self._body.append(chunk)
        else:
            self._body = None
            self._analysis_error = "response_body_too_large"

    def _on_event(self, data: bytes, now: float) -> None:
        """One framed event: counted, matched against the dialect's patterns, and its JSON
        parsed (once) when it is the first, when ``interesting`` finds something in it, or
        when it is a token event that carries reasoning."""
        self._events += 1
        if self._first_event is None:
            self._first_event = now
        if data == self._end_data:
            self._done = True
            return
        text = self._carries_token(data)
        token = text is not None
        obj: object = _UNREAD
        if self._events == 1 or self._interesting(data) is not None:
            obj = _json(data)
            if isinstance(obj, dict) and self._read_event(obj, now):
                token = True
        if token:
            self._token_events += 1
            if self._first_token is None:
                self._first_token = now
            self._last_token = now
            if text is not None and text.lastgroup == REASONING:
                self._think(_json(data) if obj is _UNREAD else obj, now)

    def _think(self, obj: object, now: float) -> None:
        """A reasoning event's parsed JSON at ``now``: its time and text (none when the event
        is no JSON)."""
        if obj is _NOT_JSON:
            return
        reader = self._dialect.reasoning_text
        text = reader(obj) if reader is not None and isinstance(obj, dict) else None
        if self._reasoning_first is None:
            self._reasoning_first = now
        self._reasoning_last = now
        parts = self._reasoning_parts
        if parts is None or not text:
            return
        self._reasoning_size += len(text)
        if self._reasoning_size > MAX_REASONING_BYTES:
            self._reasoning_parts = None
        else:
            parts.append(text)

    def _read_event(self, obj: dict[str, Any], now: float) -> bool:
        """Read one parsed event; true when it carried tool-call text."""
        self._read_object(obj)
        deltas = self._tool_deltas(obj)
        if deltas is None:
            return False
        self._calls.merge(deltas)
        self._tool_time = now
        return True

    def _read_object(self, obj: dict[str, Any]) -> None:
        if self._model is None:
            self._model = self._dialect.model(obj)
        if self._response_id is None:
            self._response_id = self._dialect.response_id(obj)
        timings = ServerTimings.from_json(obj.get("timings"))
        if timings is not None:
            self._timings = timings
        usage = self._dialect.usage(obj)
        if usage is not None:
            self._usage = usage if self._usage is None else _later(self._usage, usage)
        error = self._dialect.error(obj)
        if error is not None:
            self._error = error
        for reason in self._dialect.finish_reasons(obj):
            self._finish = reason
        if self._dialect.ends(obj):
            self._done = True

    def _read_body(self) -> None:
        if not self._body:
            return
        obj = _json(b"".join(self._body))
        if not isinstance(obj, dict):
            return
        self._read_object(obj)
        reader = self._dialect.reasoning_text
        text = reader(obj) if reader is not None else None
        if text:
            self._reasoning_parts = [text]
        calls = self._dialect.body_tool_calls(obj)
        if calls is not None:
            self._calls.merge(calls)
            self._tool_time = self._last_byte
            self._call_cut = self._dialect.body_call_cut(obj)

    def finish(self) -> Observation:
        """End of the response (clean or not): what was seen."""
        self._read_deferred()
        oversized = 0
        try:
            if self._framer is not None:
                for event in self._framer.flush():
                    self._on_event(event.data, self._last_byte or 0.0)
                oversized = self._framer.oversized
            elif self._analysis_error is None:
                self._read_body()
        except Exception as exc:
            self._analysis_error = self._analysis_error or f"tracker: {type(exc).__name__}"
        return self._observation(oversized)

    def peek(self) -> Observation:
        """What was seen so far, ending nothing: the events complete so far (an event still
        unterminated is not read, a plain body is not read before :meth:`finish`)."""
        self._read_deferred()
        return self._observation(self._framer.oversized if self._framer is not None else 0)

    def _observation(self, oversized: int) -> Observation:
        return Observation(
            first_byte_s=self._first_byte,
            first_event_s=self._first_event,
            first_token_s=self._first_token,
            last_token_s=self._last_token,
            last_byte_s=self._last_byte,
            tool_call_s=self._tool_time,
            events=self._events,
            token_events=self._token_events,
            response_bytes=self._bytes,
            timings=self._timings or self._usage,
            model=self._model,
            response_id=self._response_id,
            finish_reason=self._finish,
            tool_calls=self._calls.calls(),
            upstream_error=self._error,
            analysis_error=self._analysis_error,
            oversized_events=oversized,
            done=self._done,
            recognised=self._recognised(),
            analysed=self._skip is None,
            reasoning_first_s=self._reasoning_first,
            reasoning_last_s=self._reasoning_last,
            reasoning_text="".join(self._reasoning_parts or ()) or None,
            call_cut=self._call_cut,
            arguments_dropped=self._calls.dropped,
        )

    def _recognised(self) -> bool:
        """Something the API's own was seen: a token, a call, counts, a reason, an end."""
        return bool(
            self._token_events
            or self._calls
            or self._timings
            or self._usage
            or self._finish is not None
            or self._error is not None
            or self._done
        )


def _later(earlier: ServerTimings, later: ServerTimings) -> ServerTimings:
    """The counts of ``later`` where it knows them, else those of ``earlier``."""
    known = {
        f.name: v for f in dataclasses.fields(later) if (v := getattr(later, f.name)) is not None
    }
    return dataclasses.replace(earlier, **known)
