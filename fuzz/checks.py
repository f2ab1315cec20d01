"""The invariants the fuzzers check, shared by ``tests/core/test_fuzz.py`` and the atheris
harnesses.

Each ``check_*`` function takes one input, runs the pure code under test on it and raises
:class:`FuzzFailure` when an invariant breaks:

* SSE framer: never raises; events and counters do not depend on how the bytes are chunked;
  ``buffered`` never exceeds ``max_event_bytes`` (2 bytes of an undecided BOM aside); no event
  is larger than the cap; below the cap the events are the spec-literal interpretation.
* Tracker: ``feed``/``finish`` never raise and the analysis never fails internally
  (``analysis_error`` stays ``None``); ``bytes_seen`` and ``response_bytes`` equal the input
  length; on a constant clock the observation does not depend on the chunking; every
  observation field has its declared type; the record built from it serialises to a log line
  and a ``/stats`` document and feeds the metrics.
* Request analysis: never raises; fields have their declared types; the accounting's pure
  steps on a tool request (render key, schema hash) never raise.

Known bugs (see :data:`KNOWN_BUGS`) are detected at import by running their reproducer; while
one is present, inputs that hit exactly it are tolerated and counted in :data:`TOLERATED`, so
the fuzzers keep looking for new failures. ``TIMING_PROXY_FUZZ_STRICT=1`` turns the
tolerance off. Once a bug is fixed its reproducer stops firing and the tolerance vanishes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import Any

import orjson

from proxy.core.assemble import Exchange, build_record
from proxy.core.dialects import CHAT_COMPLETIONS, DIALECTS, Dialect
from proxy.core.record import Kind, Outcome, Record, ServerTimings
from proxy.core.request import RequestFacts, analyse_request
from proxy.core.schema import for_counting, render_key, schema_hash, strip_tools
from proxy.core.sse import SSEEvent, SSEFramer
from proxy.core.stats import Stats
from proxy.core.tracker import Observation, StreamTracker, ToolCall
from proxy.serve.metrics import Metrics

__all__ = [
    "BOM",
    "DEFAULT_CAP",
    "KNOWN_BUGS",
    "TOLERATED",
    "FuzzFailure",
    "check_framer",
    "check_observation",
    "check_record",
    "check_request",
    "check_tracker",
    "decode_request_input",
    "decode_sse_input",
    "decode_tracker_input",
    "frame",
    "oracle",
    "split_at",
    "track",
]

BOM = b"\xef\xbb\xbf"
DEFAULT_CAP = 8 * 1024 * 1024
DEFAULT_BODY_CAP = 32 * 1024 * 1024
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_I64_MIN, _U64_MAX = -(2**63), 2**64 - 1


class FuzzFailure(AssertionError):
    """An invariant broke (raised explicitly, so ``python -O`` does not skip checks)."""


def require(ok: object, message: str | Callable[[], str]) -> None:
    """Raise :class:`FuzzFailure` with ``message`` unless ``ok``."""
    if not ok:
        raise FuzzFailure(message() if callable(message) else message)


def split_at(stream: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``stream`` cut at the given offsets (clamped, any order, duplicates give empty chunks)."""
    points = sorted(min(max(c, 0), len(stream)) for c in cuts)
    return [stream[a:b] for a, b in pairwise([0, *points, len(stream)])]


# --------------------------------------------------------------------------------------------
# Known bugs: reproducer, tolerance predicate


STRICT = os.environ.get("TIMING_PROXY_FUZZ_STRICT") == "1"
TOLERATED: Counter[str] = Counter()
"""How many inputs hit each known bug (and were let through) in this process."""


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _bug_bool_tool_index() -> bool:
    tracker = StreamTracker(0.0, sse=True, clock=lambda: 1.0)
    tracker.feed(
        _event(
            {
                "choices": [
                    {
                        "delta": {
                            "tool_calls": [
                                {"index": True, "function": {"name": "f", "arguments": "{}"}}
                            ]
                        }
                    }
                ]
            }
        )
    )
    return any(type(c.index) is not int for c in tracker.finish().tool_calls)


def _bug_nonstream_tool_call_not_object() -> bool:
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(orjson.dumps({"choices": [{"message": {"tool_calls": ["x"]}}]}))
    return tracker.finish().analysis_error is not None


def _bug_counts_beyond_64_bits() -> bool:
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(orjson.dumps({"timings": {"prompt_n": _U64_MAX, "cache_n": _U64_MAX}}))
    record = _build(tracker.finish(), sse=False)
    try:
        orjson.dumps(record.to_dict())
    except orjson.JSONEncodeError:
        return True
    return False


def _bug_metrics_negative_counts() -> bool:
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(orjson.dumps({"timings": {"prompt_n": -5, "cache_n": 1}}))
    record = _build(tracker.finish(), sse=False)
    try:
        Metrics().observe(record)
    except ValueError:
        return True
    return False


def _bug_sse_data_line_breaks_uncounted() -> bool:
    framer = SSEFramer(max_event_bytes=10)
    events = framer.feed(b"data:\n" * 100 + b"\n")
    return any(len(e.data) > 10 for e in events)


def _bug_nonfinite_ratio() -> bool:
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(b'{"timings":{"prompt_n":10,"prompt_ms":1e-306}}')
    rate = _build(tracker.finish(), sse=False).prefill_tok_s
    return rate is not None and not math.isfinite(rate)


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _bug_deep_tools_render_key() -> bool:
    body = orjson.loads(
        b'{"tools":[{"type":"function","function":{"name":"f","parameters":' + _deep(300) + b"}}]}"
    )
    try:
        render_key(body)
    except orjson.JSONEncodeError:
        return True
    return False


# --------------------------------------------------------------------------------------------
# SSE framer


def oracle(stream: bytes) -> tuple[list[SSEEvent], int]:
    """Spec-literal, whole-stream, uncapped interpretation: the events and the comment count."""
    stream = stream.removeprefix(BOM)
    lines = _LINE_BREAK.split(stream)[:-1]  # an unterminated tail never dispatches
    out: list[SSEEvent] = []
    data, etype, last_id, retry, comments = b"", b"", None, None, 0
    for line in lines:
        if not line:
            if data:
                event = etype.decode("utf-8", "replace") or "message"
                out.append(SSEEvent(data.removesuffix(b"\n"), event, last_id, retry))
            data, etype, retry = b"", b"", None
            continue
        if line.startswith(b":"):
            comments += 1
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data += value + b"\n"
        elif name == b"event":
            etype = value
        elif name == b"id" and b"\x00" not in value:
            last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            with contextlib.suppress(ValueError):  # beyond sys.get_int_max_str_digits()
                retry = int(value)
    return out, comments


Counters = tuple[int, int, int, bool]


def frame(chunks: Iterable[bytes], cap: int = DEFAULT_CAP) -> tuple[list[SSEEvent], Counters, int]:
    """Feed ``chunks`` then flush: events, counters and the largest ``buffered`` seen."""
    framer = SSEFramer(max_event_bytes=cap)
    events: list[SSEEvent] = []
    peak = 0
    for chunk in chunks:
        events += framer.feed(chunk)
        peak = max(peak, framer.buffered)
    events += framer.flush()
    require(framer.buffered == 0, "flush() left bytes buffered")
    counters = (framer.events, framer.comments, framer.oversized, framer.incomplete_at_eof)
    return events, counters, peak


def check_framer(stream: bytes, cuts: Sequence[int], cap: int = DEFAULT_CAP) -> None:
    """Whole vs split: same events and counters; memory capped; oracle below the cap."""
    whole, c_whole, peak_whole = frame([stream], cap)
    split, c_split, peak_split = frame(split_at(stream, cuts), cap)
    require(split == whole, lambda: f"events depend on chunking (cap={cap}, cuts={cuts})")
    require(c_split == c_whole, lambda: f"counters depend on chunking: {c_whole} vs {c_split}")
    bound = max(cap, len(BOM) - 1)  # a lone BOM prefix is held until it is decided
    require(
        max(peak_whole, peak_split) <= bound,
        lambda: f"buffered {max(peak_whole, peak_split)} > cap {cap}",
    )
    big = [e for e in whole if len(e.data) > cap]
    if big:  # known bug: the LF joining two data lines is not counted against the cap
        require(
            all(len(e.data) - e.data.count(b"\n") <= cap for e in big)
            and _tolerate("sse_data_line_breaks_uncounted"),
            lambda: f"an event of {len(big[0].data)} bytes > cap {cap} dispatched",
        )
    require(c_whole[0] == len(whole), "the events counter disagrees with the events returned")
    if len(stream) <= cap:
        expected, comments = oracle(stream)
        require(whole == expected, "events differ from the spec-literal oracle")
        require(c_whole[1] == comments, "comment count differs from the oracle")
        require(c_whole[2] == 0, "an event under the cap counted as oversized")


# --------------------------------------------------------------------------------------------
# Tracker


def track(
    chunks: Iterable[bytes],
    sse: bool,
    *,
    clock: Callable[[], float] = lambda: 1.0,
    max_event_bytes: int = DEFAULT_CAP,
    max_body_bytes: int = DEFAULT_BODY_CAP,
    dialect: Dialect = CHAT_COMPLETIONS,
) -> tuple[Observation, int]:
    """Feed ``chunks`` to a tracker (t0 = 0) and finish it: the observation and bytes_seen."""
    tracker = StreamTracker(
        0.0,
        sse=sse,
        clock=clock,
        max_event_bytes=max_event_bytes,
        max_body_bytes=max_body_bytes,
        dialect=dialect,
    )
    for chunk in chunks:
        tracker.feed(chunk)
    seen = tracker.bytes_seen
    return tracker.finish(), seen


def check_tracker(
    stream: bytes,
    cuts: Sequence[int],
    sse: bool,
    *,
    max_event_bytes: int = DEFAULT_CAP,
    dialect: Dialect = CHAT_COMPLETIONS,
) -> Observation:
    """Whole vs split on a constant clock: equal observations, exact byte counts, sound types
    (the events read through ``dialect``)."""
    whole, seen_whole = track([stream], sse, max_event_bytes=max_event_bytes, dialect=dialect)
    split, seen_split = track(
        split_at(stream, cuts), sse, max_event_bytes=max_event_bytes, dialect=dialect
    )
    n = len(stream)
    require(seen_whole == seen_split == n, lambda: f"bytes_seen {seen_whole}/{seen_split} != {n}")
    require(whole.response_bytes == split.response_bytes == n, "response_bytes != input length")
    require(whole == split, lambda: f"observation depends on chunking:\n{whole}\n{split}")
    check_observation(whole, stream, sse)
    check_record(whole, sse=sse)
    return whole


def _opt(value: object, kind: type) -> bool:
    return value is None or type(value) is kind


def _nonobject_message_tool_call(body: bytes) -> bool:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    choices = obj.get("choices") if isinstance(obj, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list) and any(not isinstance(c, dict) for c in calls):
            return True
    return False


def _tolerate(bug: str) -> bool:
    if STRICT or not KNOWN_BUGS.get(bug):
        return False
    TOLERATED[bug] += 1
    return True


def _check_timings(t: ServerTimings) -> None:
    require(type(t) is ServerTimings, f"timings = {t!r}")
    for name in ("prompt_n", "cache_n", "predicted_n"):
        require(_opt(getattr(t, name), int), f"timings.{name} = {getattr(t, name)!r}")
    for name in ("prompt_ms", "predicted_ms"):
        v = getattr(t, name)
        require(_opt(v, float) and (v is None or math.isfinite(v)), f"timings.{name} = {v!r}")


def check_observation(obs: Observation, stream: bytes, sse: bool) -> None:
    """Every field has its declared type; counts are consistent; no internal analysis error."""
    for name in (
        "first_byte_s",
        "first_event_s",
        "first_token_s",
        "last_token_s",
        "last_byte_s",
        "tool_call_s",
    ):
        value = getattr(obs, name)
        require(
            _opt(value, float) and (value is None or math.isfinite(value)), f"{name} = {value!r}"
        )
    for name in ("events", "token_events", "response_bytes", "oversized_events"):
        require(
            type(getattr(obs, name)) is int and getattr(obs, name) >= 0,
            f"{name} = {getattr(obs, name)!r}",
        )
    require(obs.token_events <= obs.events, "more token events than events")
    require(type(obs.done) is bool, f"done = {obs.done!r}")
    for name in ("model", "finish_reason", "upstream_error", "analysis_error"):
        require(_opt(getattr(obs, name), str), f"{name} = {getattr(obs, name)!r}")
    if obs.timings is not None:
        _check_timings(obs.timings)
    require(type(obs.tool_calls) is tuple, "tool_calls is not a tuple")
    indexes = [c.index for c in obs.tool_calls]
    require(len(set(indexes)) == len(indexes), f"duplicate tool call indexes {indexes}")
    for call in obs.tool_calls:
        require(
            type(call) is ToolCall and type(call.name) is str and type(call.arguments) is str,
            f"tool call {call!r}",
        )
        if type(call.index) is not int:
            require(
                type(call.index) is bool and _tolerate("bool_tool_index"),
                f"tool call index {call.index!r} is a {type(call.index).__name__}",
            )
    if obs.analysis_error is not None:
        known = (
            not sse
            and obs.analysis_error == "tracker: TypeError"
            and _nonobject_message_tool_call(stream)
            and _tolerate("nonstream_tool_call_not_object")
        )
        require(known, f"the analysis failed: {obs.analysis_error}")
    if not sse:
        require(
            obs.events == obs.token_events == obs.oversized_events == 0 and not obs.done,
            "a JSON body produced SSE counts",
        )


def _ints(obj: Any) -> Iterable[int]:
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _ints(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _ints(v)
    elif type(obj) is int:
        yield obj


def _beyond_64_bits(doc: Any) -> bool:
    return any(not _I64_MIN <= v <= _U64_MAX for v in _ints(doc))


_EXCHANGE = Exchange(
    id="0123456789abcdef",
    ts="2026-01-01T00:00:00.000Z",
    method="POST",
    path="/v1/chat/completions",
    status=200,
    outcome=Outcome.COMPLETED,
    end_s=2.0,
    request_bytes=10,
)
_METRICS = Metrics()


def _build(obs: Observation | None, facts: RequestFacts | None = None, sse: bool = True) -> Record:
    facts = facts or RequestFacts(kind=Kind.CHAT, stream=sse)
    return build_record(_EXCHANGE, facts, obs)


def check_record(
    obs: Observation | None, facts: RequestFacts | None = None, sse: bool = True
) -> Record:
    """The record of ``obs`` builds, logs as JSON (and reads back), counts, and renders /stats."""
    record = _build(obs, facts, sse)
    doc = record.to_dict()
    try:
        line = orjson.dumps(doc)
    except orjson.JSONEncodeError as exc:
        require(
            _beyond_64_bits(doc) and _tolerate("counts_beyond_64_bits"),
            f"the log line does not serialise: {exc}",
        )
        return record
    nonfinite: dict[str, Any] = {
        k: None for k, v in doc.items() if isinstance(v, float) and not math.isfinite(v)
    }
    if nonfinite:  # JSON has no inf: the line says null
        require(_tolerate("nonfinite_ratio"), lambda: f"non-finite record fields {nonfinite}")
    require(
        Record.from_dict(orjson.loads(line)) == dataclasses.replace(record, **nonfinite),
        "the log line does not read back",
    )
    stats = Stats(since="now", recent=2, window=4)
    stats.add(record)
    try:
        orjson.dumps(stats.snapshot())
    except orjson.JSONEncodeError as exc:
        raise FuzzFailure(f"/stats does not serialise: {exc}") from exc
    try:
        _METRICS.observe(record)
    except ValueError as exc:
        negative = any(v is not None and v < 0 for v in (record.prompt_n, record.cache_n))
        require(
            negative and _tolerate("metrics_negative_counts"), f"the metrics sink failed: {exc}"
        )
    return record


# --------------------------------------------------------------------------------------------
# Request analysis


def _depth(obj: Any, limit: int = 10_000) -> int:
    """Nesting depth of a JSON value (iterative: deep input must not blow the stack here)."""
    best, stack = 0, [(obj, 1)]
    while stack and best < limit:
        item, d = stack.pop()
        if isinstance(item, dict | list):
            best = max(best, d)
            stack.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return best


def check_request(method: str, path: str, body: bytes) -> RequestFacts:
    """analyse_request never raises, types hold, and the accounting's pure steps work."""
    facts = analyse_request(method, path, body)
    require(type(facts.kind) is Kind, f"kind = {facts.kind!r}")
    require(_opt(facts.model, str), f"model = {facts.model!r}")
    require(_opt(facts.stream, bool), f"stream = {facts.stream!r}")
    require(
        type(facts.tool_names) is frozenset and all(type(n) is str for n in facts.tool_names),
        "tool_names",
    )
    require(facts.body is None or type(facts.body) is dict, "body is not a dict")
    require(_opt(facts.error, str), f"error = {facts.error!r}")
    is_chat = method == "POST" and path.rstrip("/").endswith("/chat/completions")
    require(facts.kind is Kind.OTHER or is_chat, "a non-chat request classified as chat/tool")
    if facts.body is not None:
        require(facts.error is None, "a parsed body with an error")
        require(facts.body == orjson.loads(body), "body is not the parsed request")
    if facts.kind is Kind.TOOL:
        body_obj = facts.body
        require(
            body_obj is not None and isinstance(body_obj.get("tools"), list) and body_obj["tools"],
            "a tool request without tools",
        )
        assert body_obj is not None
        try:  # what Accounting.begin() and _schema() do on every tool request
            render_key(body_obj)
            schema_hash(body_obj["tools"])
            for_counting(body_obj)
            strip_tools(body_obj)
        except orjson.JSONEncodeError as exc:
            require(
                _depth(body_obj) > 250 and _tolerate("deep_tools_render_key"),
                f"accounting cannot key the request: {exc}",
            )
    check_record(None, facts)
    return facts


# --------------------------------------------------------------------------------------------
# Byte layouts of the coverage-guided harnesses (the fuzzer's bytes -> one check's arguments)


def _cuts(data: bytes, count: int, length: int) -> list[int]:
    return [int.from_bytes(data[2 * i : 2 * i + 2], "little") % (length + 1) for i in range(count)]


def decode_sse_input(data: bytes) -> tuple[bytes, list[int], int]:
    """``[cap selector][n cuts][2 bytes per cut][stream]``: a byte >= 128 selects a cap 1..128."""
    if len(data) < 2:
        return data, [], DEFAULT_CAP
    cap = DEFAULT_CAP if data[0] < 128 else 1 + (data[0] & 0x7F)
    count = data[1] % 9
    stream = data[2 + 2 * count :]
    return stream, _cuts(data[2:], count, len(stream)), cap


def decode_tracker_input(data: bytes) -> tuple[bytes, list[int], bool, int, Dialect]:
    """``[flags][n cuts and dialect][cuts][stream]``: flags bit 0 = SSE, bit 1 = a small
    event cap (64..2048); the second byte mod 9 is the number of cuts, divided by 9 it picks
    the dialect (Chat Completions for the small values the seeds use)."""
    if len(data) < 2:
        return data, [], True, DEFAULT_CAP, CHAT_COMPLETIONS
    flags = data[0]
    cap = 64 + 32 * (flags >> 2) if flags & 2 else DEFAULT_CAP
    count = data[1] % 9
    dialect = DIALECTS[data[1] // 9 % len(DIALECTS)]
    stream = data[2 + 2 * count :]
    return stream, _cuts(data[2:], count, len(stream)), bool(flags & 1), cap, dialect


METHODS = ("POST", "GET", "PUT", "HEAD", "OPTIONS", "DELETE", "post", "PATCH")
PATHS = (
    "/v1/chat/completions",
    "/v1/chat/completions/",
    "/chat/completions",
    "/v1/completions",
    "/completion",
    "/",
    "/v1/chat/completionsx",
    "//v1/chat/completions//",
)


def decode_request_input(data: bytes) -> tuple[str, str, bytes]:
    """``[method][path][body]``: the first two bytes pick a method and a path."""
    if len(data) < 2:
        return "POST", PATHS[0], data
    return METHODS[data[0] % len(METHODS)], PATHS[data[1] % len(PATHS)], data[2:]


KNOWN_BUGS: dict[str, bool] = {
    "sse_data_line_breaks_uncounted": _bug_sse_data_line_breaks_uncounted(),
    "bool_tool_index": _bug_bool_tool_index(),
    "nonstream_tool_call_not_object": _bug_nonstream_tool_call_not_object(),
    "counts_beyond_64_bits": _bug_counts_beyond_64_bits(),
    "metrics_negative_counts": _bug_metrics_negative_counts(),
    "deep_tools_render_key": _bug_deep_tools_render_key(),
    "nonfinite_ratio": _bug_nonfinite_ratio(),
}
"""Known bugs, each ``True`` while its reproducer still reproduces it."""
