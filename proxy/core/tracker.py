"""The timing tracker: response bytes and an injected clock in, an :class:`Observation` out.

Pure (no I/O). The relay hands it every chunk exactly as it forwarded it; the tracker frames
SSE with :class:`~proxy.core.sse.SSEFramer` or, for a plain JSON body, keeps the bytes (bounded)
and reads them at the end. It parses the JSON only of events that matter: the first one
(for ``model``), and those carrying ``timings``, ``usage``, ``tool_calls``, ``error`` or a
``finish_reason``. Token-bearing events are recognised by a byte pattern, since
llama-server writes compact JSON in which a key cannot occur unescaped inside a string.
Where those keys sit is the API's :class:`~proxy.core.dialects.Dialect`, chosen once per
response.

:meth:`StreamTracker.feed` never raises: an exception in the analysis is kept in
``analysis_error`` and the analysis stops, while the relay goes on forwarding bytes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.dialects import CHAT_COMPLETIONS, Dialect, ToolDelta
from proxy.core.record import ServerTimings
from proxy.core.sse import SSEFramer

__all__ = ["Clock", "Observation", "StreamTracker", "ToolCall"]

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call as streamed: the name and the concatenated argument text.

    The arguments are model output: they are counted, never logged.
    """

    index: int
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Observation:
    """What the tracker saw of one response. Times are seconds since the request arrived."""

    first_byte_s: float | None = None
    first_event_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    last_byte_s: float | None = None
    tool_call_s: float | None = None
    events: int = 0
    token_events: int = 0
    response_bytes: int = 0
    timings: ServerTimings | None = None
    model: str | None = None
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    upstream_error: str | None = None
    analysis_error: str | None = None
    oversized_events: int = 0
    done: bool = False
    analysed: bool = True
    recognised: bool = False
    """Something in the response was the API's own: a token, a tool call, counts, a finish
    reason, an error or an end. Without it the token and call counts are unknown, not 0."""


@dataclass(slots=True)
class _Call:
    name: str = ""
    arguments: list[str] = field(default_factory=list)


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
    ) -> None:
        """``skip`` names why the body cannot be read (e.g. it is compressed): then only
        bytes and times are observed, and the counts of events and calls stay unknown.
        ``dialect`` is the API whose events these are."""
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
        self._finish: str | None = None
        self._calls: dict[int, _Call] = {}
        self._error: str | None = None
        self._analysis_error: str | None = skip
        self._done = False

    @property
    def done(self) -> bool:
        """True once the event that ends a complete stream (``[DONE]``) was seen."""
        return self._done

    @property
    def bytes_seen(self) -> int:
        """Body bytes fed so far."""
        return self._bytes

    def feed(self, chunk: bytes, at: float | None = None) -> None:
        """Take one forwarded chunk, read from the upstream at clock time ``at`` (now when
        not given). Never raises."""
        now = (self._clock() if at is None else at) - self._t0
        if self._first_byte is None:
            self._first_byte = now
        self._last_byte = now
        self._bytes += len(chunk)
        if self._analysis_error is not None:
            return
        try:
            if self._framer is not None:
                for event in self._framer.feed(chunk):
                    self._on_event(event.data, now)
            elif self._body is not None:
                if self._bytes <= self._max_body:
                    self._body.append(chunk)
                else:
                    self._body = None
                    self._analysis_error = "response_body_too_large"
        except Exception as exc:  # the analysis must never disturb the relay
            self._analysis_error = f"tracker: {type(exc).__name__}"

    def _on_event(self, data: bytes, now: float) -> None:
        self._events += 1
        if self._first_event is None:
            self._first_event = now
        if data == self._end_data:
            self._done = True
            return
        carries_token = self._carries_token(data) is not None
        if self._events == 1 or self._interesting(data) is not None:
            carries_token = self._read_event(data, now) or carries_token
        if carries_token:
            self._token(now)

    def _token(self, now: float) -> None:
        self._token_events += 1
        if self._first_token is None:
            self._first_token = now
        self._last_token = now

    def _read_event(self, data: bytes, now: float) -> bool:
        """Read one JSON event; true when it carried tool-call text."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(obj, dict):
            return False
        self._read_object(obj)
        deltas = self._tool_deltas(obj)
        if deltas is None:
            return False
        self._merge_tool_deltas(deltas)
        self._tool_time = now
        return True

    def _read_object(self, obj: dict[str, Any]) -> None:
        if self._model is None:
            self._model = self._dialect.model(obj)
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

    def _merge_tool_deltas(self, deltas: list[ToolDelta]) -> None:
        for index, name, args in deltas:
            call = self._calls.setdefault(index, _Call())
            if name is not None:
                call.name = name  # a repeated name is the full new name, not a suffix
            if args is not None:
                call.arguments.append(args)

    def _read_body(self) -> None:
        if not self._body:
            return
        try:
            obj = orjson.loads(b"".join(self._body))
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        self._read_object(obj)
        calls = self._dialect.body_tool_calls(obj)
        if calls is not None:
            self._merge_tool_deltas(calls)
            self._tool_time = self._last_byte

    def finish(self) -> Observation:
        """End of the response (clean or not): what was seen."""
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
        return self._observation(self._framer.oversized if self._framer is not None else 0)

    def _observation(self, oversized: int) -> Observation:
        calls = tuple(
            ToolCall(i, c.name, "".join(c.arguments)) for i, c in sorted(self._calls.items())
        )
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
            finish_reason=self._finish,
            tool_calls=calls,
            upstream_error=self._error,
            analysis_error=self._analysis_error,
            oversized_events=oversized,
            done=self._done,
            recognised=bool(
                self._token_events
                or self._calls
                or self._timings
                or self._usage
                or self._finish is not None
                or self._error is not None
                or self._done
            ),
            analysed=self._skip is None,
        )


def _later(earlier: ServerTimings, later: ServerTimings) -> ServerTimings:
    """The counts of ``later`` where it knows them, else those of ``earlier``."""
    known = {
        f.name: v for f in dataclasses.fields(later) if (v := getattr(later, f.name)) is not None
    }
    return dataclasses.replace(earlier, **known)
