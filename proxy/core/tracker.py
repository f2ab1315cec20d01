"""The timing tracker: response bytes and an injected clock in, an :class:`Observation` out.

Pure (no I/O). The relay hands it every chunk exactly as it forwarded it; the tracker frames
SSE with :class:`~proxy.core.sse.SSEFramer` or, for a plain JSON body, keeps the bytes (bounded)
and reads them at the end. It parses the JSON only of events that matter: the first one
(for ``model``), and those carrying ``timings``, ``usage``, ``tool_calls``, ``error`` or a
``finish_reason``. Token-bearing events are recognised by a byte pattern, since
llama-server writes compact JSON in which a key cannot occur unescaped inside a string.
Where those keys sit is the API's :class:`~proxy.core.dialects.Dialect`, chosen once per
response.

**The hot path** (issue 15): llama-server's token events differ from each other only in the
token's text (and, once a second, in ``created``). Once the tracker has read one token event
the slow way (framer, both byte patterns), it keeps that event's bytes around the text as a
*template*; the next event whose bytes are the template with another text, free of quotes
and line breaks, is counted as a token event from three ``bytes`` comparisons, with no framer
call, no pattern search and no object made. That is exact, not a heuristic: such an event
frames the same way, and the dialect's patterns find the same in it, as in the template's
event, unless its text is one of the few pieces a pattern match could span (the text between
two quotes in a string the ``interesting`` pattern matches, such as ``usage``), which takes
the slow path. :func:`_fast_spec` works those pieces out from the pattern once per dialect;
a dialect whose patterns do not allow the argument (an unbounded pattern, say) gets no fast
path. Anything else (the first event, tool-call deltas, the last event with ``timings``, a
new ``created``, CR line ends, another framing) goes through the framer as before.

:meth:`StreamTracker.feed` never raises: an exception in the analysis is kept in
``analysis_error`` and the analysis stops, while the relay goes on forwarding bytes.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from proxy.core.dialects import CHAT_COMPLETIONS, Dialect, ToolDelta
from proxy.core.record import ServerTimings
from proxy.core.sse import SSEFramer

__all__ = ["Clock", "Observation", "StreamTracker", "ToolCall"]

Clock = Callable[[], float]

MAX_REASONING_BYTES = 256 * 1024
"""Reasoning text kept per response (to count its tokens); beyond it, the text is dropped
and only its times are kept."""

MAX_ARGUMENT_BYTES = 256 * 1024
"""Tool-call argument text kept per response (to check and count it); beyond it, every
call's arguments are dropped, and the fields read from them are unknown."""


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
    reasoning_first_s: float | None = None
    reasoning_last_s: float | None = None
    reasoning_text: str | None = None
    """The reasoning (thinking) the model streamed, joined; ``None`` when there was none or
    it was over :data:`MAX_REASONING_BYTES`. Model output: counted, never logged."""
    call_cut: bool = False
    """A whole body showed its last call cut by the token limit where the call's arguments
    do not (the dialect's ``body_call_cut``)."""
    arguments_dropped: bool = False
    """The calls' arguments were over :data:`MAX_ARGUMENT_BYTES`: they are empty here."""


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
        self._finish: str | None = None
        self._calls: dict[int, _Call] = {}
        self._argument_size = 0
        self._error: str | None = None
        self._call_cut = False
        self._analysis_error: str | None = skip
        self._done = False
        # the fast path: the spec of this dialect (None: none), the template learnt from the
        # last token event read the slow way, and the template in force (None while the
        # framer is inside an event, or nothing was learnt)
        self._spec = _fast_spec(
            dialect.token, dialect.interesting, dialect.end_data, dialect.reasoning
        )
        self._cap = max_event_bytes
        self._learnt: _Template | None = None
        self._tpl: _Template | None = None
        self._plain: bytes | None = None  # the last token event read without parsing
        # reasoning: the dialect's pattern, first/last delta times, the text (JSON-escaped
        # bytes from the fast path, str from parsed events; None once over the cap)
        self._reasoning = dialect.reasoning.search if dialect.reasoning is not None else None
        self._reasoning_first: float | None = None
        self._reasoning_last: float | None = None
        self._reasoning_parts: list[bytes | str] | None = []
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
            tpl = self._tpl
            if tpl is not None and type(chunk) is bytes and chunk.startswith(tpl.head):
                # one token event of the template's shape (the common case), inline
                s = tpl.text_at
                q = chunk.find(b'"', s)
                end = q + tpl.tail_len
                if (
                    q > s
                    and end == len(chunk)
                    and chunk.startswith(tpl.tail, q)
                    and end <= self._cap
                    and chunk[s:q] not in tpl.spans
                    and chunk.find(b"\n", s, q) < 0
                    and chunk.find(b"\r", s, q) < 0
                    and (not tpl.reasoning or _read_as_is(chunk, s, q))
                ):
                    self._events += 1
                    self._token_events += 1
                    self._last_token = now
                    if tpl.reasoning:
                        self._think(chunk[s:q], now)
                    return
                chunk = chunk[self._fast_events(chunk, tpl, now) :]  # [0:] is chunk itself
                if not chunk:
                    return
            self._slow(chunk, now)
        except Exception as exc:  # the analysis must never disturb the relay
            self._analysis_error = f"tracker: {type(exc).__name__}"

    def _slow(self, chunk: bytes, now: float) -> None:
        """Frame ``chunk`` (a stream) or keep it (a plain body).

        A chunk cut anywhere (a fast stream's reads end mid-event) begins with the rest of an
        event: the framer takes the chunk only up to the first event end followed by the
        learnt template's head, and the fast path goes on from there, as if the read had
        ended at that event end (before a template is learnt, the framer takes the chunk up to
        its last event end, where one can be). The framer is fed the same bytes in the same
        order either way, so the events it frames, and the record, do not change."""
        if self._framer is None:
            if self._body is not None:
                self._keep(chunk)
            return
        if type(chunk) is not bytes or self._spec is None:
            self._framed(chunk, now)
            return
        learnt = self._learnt
        if learnt is None:  # no template yet: one can be learnt only at an event end
            k = chunk.rfind(b"\n\n")
            if k < 0 or k + 2 == len(chunk):
                self._framed(chunk, now)
                return
            self._framed(chunk[: k + 2], now)
            chunk, learnt = chunk[k + 2 :], self._learnt
        while learnt is not None:
            k = chunk.find(b"\n\n" + learnt.head)
            if k < 0:
                break
            self._framed(chunk[: k + 2], now)
            chunk = chunk[k + 2 :]
            tpl = self._tpl  # in force only if the framer is between events now
            if tpl is None:
                break
            chunk = chunk[self._fast_events(chunk, tpl, now) :]
            if not chunk:
                return
            learnt = tpl
        self._framed(chunk, now)

    def _keep(self, chunk: bytes) -> None:
        """Keep a plain body's chunk, within ``max_body_bytes``."""
        assert self._body is not None
        if self._bytes <= self._max_body:
            self._body.append(chunk)
        else:
            self._body = None
            self._analysis_error = "response_body_too_large"

    def _fast_events(self, chunk: bytes, tpl: _Template, now: float) -> int:
        """Count the template's token events at the start of ``chunk``; where they end."""
        pos = 0
        n = len(chunk)
        head, tail, spans = tpl.head, tpl.tail, tpl.spans
        lh, lt, cap = len(head), tpl.tail_len, self._cap
        count = 0
        while chunk.startswith(head, pos):
            s = pos + lh
            q = chunk.find(b'"', s)
            end = q + lt
            if not (
                q > s
                and end <= n
                and chunk.startswith(tail, q)
                and end - pos <= cap
                and chunk[s:q] not in spans
                and chunk.find(b"\n", s, q) < 0
                and chunk.find(b"\r", s, q) < 0
                and (not tpl.reasoning or _read_as_is(chunk, s, q))
            ):
                break
            count += 1
            if tpl.reasoning:
                self._think(chunk[s:q], now)
            pos = end
        if count:
            self._events += count
            self._token_events += count
            self._last_token = now
        return pos

    def _framed(self, chunk: bytes, now: float) -> None:
        """The slow path: frame ``chunk`` and read its events; then, when the framer is
        between events, put a template in force (a new one when the last event was a plain
        token event)."""
        framer = self._framer
        assert framer is not None
        idle_before = self._tpl is not None or (self._spec is not None and framer.idle)
        self._tpl = None
        events = framer.feed(chunk)
        for event in events:
            self._on_event(event.data, now)
        if self._spec is None or not framer.idle:
            return
        if events and events[-1].data is self._plain:
            self._learnt = self._learn(chunk, events[-1].data, idle_before) or self._learnt
        self._tpl = self._learnt

    def _learn(self, chunk: bytes, data: bytes, idle_before: bool) -> _Template | None:
        """A template from ``chunk``'s last event, whose data ``data`` :meth:`_on_event`
        found to be a token event it had no need to parse; None when it cannot be one."""
        spec = self._spec
        if spec is None or type(chunk) is not bytes:
            return None
        match = spec.token(data)
        k = match.end() - 1 if match is not None else -1  # where the token's text starts
        q = data.find(b'"', k)  # where it ends
        data_at = len(chunk) - 2 - len(data)
        if (
            k < 1
            or data[k - 1] != 34  # the pattern's last byte is the text's first
            or q <= k
            or data.find(b"\n") >= 0
            or chunk.find(b"\r") >= 0
            or not chunk.endswith(b"\n\n")
            or not chunk.startswith(data, data_at)
        ):
            return None
        start = chunk.rfind(b"\n\n", 0, data_at) + 2  # the event's first line
        if start == 1:  # it began in an earlier chunk, or this one
            if not idle_before:
                return None
            start = 0
        prefix = chunk[start:data_at]
        if not (prefix == b"data: " or prefix.endswith(b"\ndata: ")):
            return None
        before, after = data[:k], data[q:]
        if not spec.safe(before, after):
            return None
        thinks = self._reasoning is not None and self._reasoning(data) is not None
        if thinks and not self._text_is_reasoning(before, after):
            return None
        return _Template(prefix + before, after + b"\n\n", spec.spans, reasoning=thinks)

    def _text_is_reasoning(self, before: bytes, after: bytes) -> bool:
        """The slow path reads the reasoning of an event of this shape as its token text:
        with a probe for the text, the event parses and the dialect's reader returns the
        probe. (Else the fast path, which takes the text as the reasoning, would disagree
        with it, as on an event that is not JSON or has the text under another key.)"""
        reader = self._dialect.reasoning_text
        if reader is None:
            return False
        try:
            obj = orjson.loads(before + _PROBE + after)
        except orjson.JSONDecodeError:
            return False
        return isinstance(obj, dict) and reader(obj) == _PROBE.decode()

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
        elif carries_token:
            self._plain = data  # a template candidate
        if carries_token:
            self._token(now)
            if self._reasoning is not None and self._reasoning(data) is not None:
                self._think_parsed(data, now)

    def _think(self, text: bytes | str, now: float) -> None:
        """One reasoning delta at ``now``: its text (JSON-escaped bytes, or a str)."""
        if self._reasoning_first is None:
            self._reasoning_first = now
        self._reasoning_last = now
        parts = self._reasoning_parts
        if parts is None:
            return
        self._reasoning_size += len(text)
        if self._reasoning_size > MAX_REASONING_BYTES:
            self._reasoning_parts = None
        else:
            parts.append(text)

    def _think_parsed(self, data: bytes, now: float) -> None:
        """A reasoning event read the slow way: its text from the parsed JSON."""
        reader = self._dialect.reasoning_text
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        text = reader(obj) if reader is not None and isinstance(obj, dict) else None
        self._think(text or "", now)

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
            if args is not None and self._argument_size <= MAX_ARGUMENT_BYTES:
                self._argument_size += len(args)
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
        reader = self._dialect.reasoning_text
        text = reader(obj) if reader is not None else None
        if text:
            self._reasoning_parts = [text]
        calls = self._dialect.body_tool_calls(obj)
        if calls is not None:
            self._merge_tool_deltas(calls)
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
        dropped = self._argument_size > MAX_ARGUMENT_BYTES
        calls = tuple(
            ToolCall(i, c.name, "" if dropped else "".join(c.arguments))
            for i, c in sorted(self._calls.items())
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
            reasoning_first_s=self._reasoning_first,
            reasoning_last_s=self._reasoning_last,
            reasoning_text=self._reasoning_joined(),
            call_cut=self._call_cut,
            arguments_dropped=dropped,
        )

    def _reasoning_joined(self) -> str | None:
        parts = self._reasoning_parts
        if not parts:
            return None
        try:
            text = "".join(
                p if isinstance(p, str) else orjson.loads(b'"' + p + b'"') for p in parts
            )
        except (orjson.JSONDecodeError, TypeError):  # never: the fast path keeps whole texts
            return None
        return text or None


_PROBE = b"timing-proxy probe"
"""A token text that needs no escape, for :meth:`StreamTracker._text_is_reasoning`."""

_AS_IS = re.compile(rb'(?:[^"\\\x00-\x1f]|\\[\\/bfnrt])*')
"""A JSON string's content without ``\\u`` escapes: read as it is, it is the text."""


def _read_as_is(chunk: bytes, start: int, end: int) -> bool:
    """``chunk[start:end]`` is text the slow path's JSON parse reads as the fast path does
    (no ``\\u`` escape, no control byte, valid UTF-8): else that reasoning event goes the
    slow way."""
    if _AS_IS.fullmatch(chunk, start, end) is None:
        return False
    text = chunk[start:end]
    if text.isascii():
        return True
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class _Template:
    """A token event's bytes without its text: ``head`` (its lines up to the text's first
    byte, from the last event's end) and ``tail`` (from the text's closing quote to the
    blank line), and the texts that must take the slow path."""

    head: bytes
    tail: bytes
    spans: frozenset[bytes]
    text_at: int = 0
    tail_len: int = 0
    reasoning: bool = False
    """The template's event carries reasoning text: so does every event that fits it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "text_at", len(self.head))
        object.__setattr__(self, "tail_len", len(self.tail))


@dataclass(frozen=True, slots=True)
class _FastSpec:
    """What the fast path needs of a dialect's ``interesting`` pattern: its matches (a
    finite set, each with a quote), as the proof in the module docstring reads them."""

    token: Callable[[bytes], re.Match[bytes] | None]
    matches: frozenset[bytes]
    spans: frozenset[bytes]
    """The texts between two consecutive quotes of a match: a token's text equal to one of
    them could complete a match across the template's quotes."""

    def safe(self, before: bytes, after: bytes) -> bool:
        """No match can begin in ``before`` and end in the text, or begin in the text and
        end in ``after``, whatever the text (free of quotes) is."""
        for m in self.matches:
            first, last = m.index(b'"'), m.rindex(b'"')
            if last + 1 < len(m) and before.endswith(m[: last + 1]):
                return False
            if first > 0 and after.startswith(m[first:]):
                return False
        return True


@lru_cache(maxsize=32)
def _fast_spec(
    token: re.Pattern[bytes],
    interesting: re.Pattern[bytes],
    end_data: bytes | None,
    reasoning: re.Pattern[bytes] | None,
) -> _FastSpec | None:
    """The fast path's reading of a dialect's patterns, or None when the argument does not
    hold for them: ``token`` must end with ``[^"]`` (the text's first byte), and
    ``interesting`` and ``reasoning`` match a finite set of strings, each holding a quote
    (a token's text must not complete a reasoning match either)."""
    if not token.pattern.endswith(b'[^"]') or (end_data is not None and b'"' in end_data):
        return None
    matches = _language(interesting.pattern)
    if matches is not None and reasoning is not None:  # its match must not span a text either
        more = _language(reasoning.pattern)
        matches = None if more is None else matches | more
    if matches is None or not matches or any(b'"' not in m for m in matches):
        return None
    spans = frozenset(part for m in matches for part in m.split(b'"')[1:-1])
    return _FastSpec(token.search, frozenset(matches), spans)


_LANGUAGE_LIMIT = 4096


def _language(pattern: bytes) -> set[bytes] | None:
    """Every string ``pattern`` matches, when they are few (literals, groups, alternatives,
    bounded repeats, classes of literals); None otherwise. Reads the pattern with the
    ``re`` module's own parser."""
    parser: Any = getattr(re, "_parser", None)  # imported by ``re`` itself (Python 3.11+)
    if parser is None:
        return None
    try:
        return _sequence(parser, parser.parse(pattern))
    except (AttributeError, TypeError, ValueError, re.error):
        return None


def _sequence(parser: Any, items: Iterable[tuple[Any, Any]]) -> set[bytes] | None:
    out = {b""}
    for op, av in items:
        alternatives = _node(parser, op, av)
        if alternatives is None:
            return None
        out = {a + b for a in out for b in alternatives}
        if len(out) > _LANGUAGE_LIMIT:
            return None
    return out


def _node(parser: Any, op: Any, av: Any) -> set[bytes] | None:
    if op == parser.LITERAL:
        return {bytes([av])}
    if op == parser.SUBPATTERN:
        _group, add_flags, del_flags, items = av
        return _sequence(parser, items) if not (add_flags or del_flags) else None
    if op == parser.BRANCH:
        out: set[bytes] = set()
        for items in av[1]:
            branch = _sequence(parser, items)
            if branch is None:
                return None
            out |= branch
        return out
    if op == parser.MAX_REPEAT or op == parser.MIN_REPEAT:
        low, high, items = av
        if high > 8:
            return None
        return _sequence(
            parser,
            [(parser.SUBPATTERN, (None, 0, 0, items))] * low
            + [(parser.BRANCH, (None, [[], items]))] * (high - low),
        )
    if op == parser.IN and all(kind == parser.LITERAL for kind, _ in av):
        return {bytes([c]) for _, c in av}
    return None


def _later(earlier: ServerTimings, later: ServerTimings) -> ServerTimings:
    """The counts of ``later`` where it knows them, else those of ``earlier``."""
    known = {
        f.name: v for f in dataclasses.fields(later) if (v := getattr(later, f.name)) is not None
    }
    return dataclasses.replace(earlier, **known)
