"""Fuzz tests: the SSE framer, the tracker, the request analysis and the relay on hostile input.

Property-based (hypothesis) with adversarial generators, plus a short run of each
coverage-guided atheris harness in ``fuzz/`` (marked ``load``: it fills every core for its
time budget, so the fast inner loop leaves it out). The invariants live in ``fuzz/checks.py`` and
are shared with those harnesses. ``TIMING_PROXY_SOAK=full`` multiplies the examples by 20 and
runs each harness for 120 s; the number of inputs tried per target is printed at the end of
the module (``[fuzz] ...`` lines) and attached to each test as a ``inputs`` property.

Known bugs (``fuzz.checks.KNOWN_BUGS``) have a reproducer test here, marked xfail while the
bug reproduces; the property tests let inputs that hit exactly a known bug through.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import platform
import random
import re
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import checks
from fuzz.checks import BOM, KNOWN_BUGS
from proxy.core.dialects import DIALECTS, Dialect, dialect_for
from proxy.core.record import Outcome
from proxy.core.sse import SSEFramer
from proxy.core.tracker import StreamTracker
from tests.conftest import ProxyFactory
from tests.fakes import DONE, FakeUpstream, all_recordings, load_recording, sse, sse_frame
from tests.profiles import examples
from tests.terminal import terminal_log

FULL = os.environ.get("TIMING_PROXY_SOAK") == "full"
SCALE = 20 if FULL else 1
SLOW = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

#: Inputs tried per fuzz target in this run (printed at the end of the module).
INPUTS: Counter[str] = Counter()


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module", autouse=True)
def _report_inputs(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end of the module, print how many inputs each target was given."""
    yield
    log = terminal_log(request.config, "fuzz")
    for name, count in sorted(INPUTS.items()):
        log(f"{name}: {count} inputs")
    if checks.TOLERATED:
        log(
            "inputs let through on a known bug: "
            + ", ".join(f"{k}={v}" for k, v in sorted(checks.TOLERATED.items()))
        )
    open_bugs = sorted(k for k, present in KNOWN_BUGS.items() if present)
    log(f"known bugs still reproducing: {', '.join(open_bugs) or 'none'}")


@pytest.fixture
def count(
    request: pytest.FixtureRequest, record_property: Callable[[str, object], None]
) -> Iterator[Callable[[], None]]:
    """Count one input of this test's target (named after the test)."""
    name = request.node.originalname.removeprefix("test_")
    before = INPUTS[name]

    def tick() -> None:
        INPUTS[name] += 1

    yield tick
    record_property("inputs", INPUTS[name] - before)


def _settings(full: int) -> settings:
    return settings(
        max_examples=examples(full) * SCALE,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


# --------------------------------------------------------------------------------------------
# Generators

_PIECES = [
    b"data",
    b"data:",
    b"data: ",
    b"event:",
    b"event: e",
    b"id:",
    b"id: 7",
    b"retry:",
    b"retry: 15",
    b":",
    b": ping",
    b" ",
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    b"\r\r",
    b"\r\n\r\n",
    BOM,
    BOM[:1],
    BOM[:2],
    b"\x00",
    b"\xff",
    b"\xfe",
    b"\xc3",
    b"\xc3\xa9",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xe6\xbc",
    b"[DONE]",
    b"{",
    b"}",
    b'"content":"x"',
    b"x",
    b"7",
]
_RUN_UNITS = [
    b"\r",
    b"\n",
    b"\r\n",
    b"x",
    b"\x00",
    BOM,
    b"data: ",
    b"data:\n",
    b":\n",
    b"data: x\n",
    b"\xff",
]

_adversarial_piece = st.one_of(
    st.sampled_from(_PIECES),
    st.binary(max_size=48),
    # huge lines, long runs of CR, of BOMs, of NULs, of empty data lines
    st.builds(lambda unit, n: unit * n, st.sampled_from(_RUN_UNITS), st.integers(1, 3000)),
    # a retry value longer than int() accepts
    st.integers(3990, 5000).map(lambda n: b"retry: " + b"9" * n + b"\n"),
)
#: Bytes built to hit the framer's corners: SSE syntax, line-break soup, invalid UTF-8.
adversarial = st.lists(_adversarial_piece, max_size=30).map(b"".join)
#: Any bytes at all, or adversarial ones.
streams = st.one_of(st.binary(max_size=512), adversarial)


@st.composite
def cuts(draw: st.DrawFn, stream: bytes) -> list[int]:
    """Cut points: arbitrary offsets, or a fixed chunk size (one byte when the input is short)."""
    n = len(stream)
    if draw(st.booleans()):
        return draw(st.lists(st.integers(0, n), max_size=16))
    size = draw(st.integers(max(1, n // 2000), max(1, min(n, 4096))))
    return list(range(size, n, size))


# --------------------------------------------------------------------------------------------
# (a) the SSE framer


class TestFramer:
    @_settings(500)
    @given(streams, st.data())
    def test_framer_chunking_invariant(
        self, count: Any, stream: bytes, data: st.DataObject
    ) -> None:
        """Arbitrary and adversarial bytes never raise, match the oracle and ignore chunking."""
        count()
        checks.check_framer(stream, data.draw(cuts(stream)))

    @_settings(500)
    @given(streams, st.integers(1, 64), st.data())
    def test_framer_small_cap_bounded(
        self, count: Any, stream: bytes, cap: int, data: st.DataObject
    ) -> None:
        """With a cap of 1..64 bytes, `buffered` never exceeds it at any step, whatever the cut."""
        count()
        checks.check_framer(stream, data.draw(cuts(stream)), cap)

    @pytest.mark.parametrize(
        ("name", "unit"),
        [
            ("one endless line", b"z" * 97),
            # the shorter the lines, the longer 2 MiB of them take under tracemalloc (2-3 s)
            pytest.param("endless event of CR-terminated data lines", b"data: z\r", marks=SLOW),
            ("endless event of data lines", b"data: 0123456789\n"),
            pytest.param("endless comment lines", b": keep-alive\n", marks=SLOW),
            pytest.param("endless event of empty data lines", b"data:\n", marks=SLOW),
        ],
    )
    def test_framer_never_ending_event_is_capped(self, count: Any, name: str, unit: bytes) -> None:
        """A never-ending event is capped and flagged: memory stays near the cap, not the input."""
        if unit == b"data:\n" and KNOWN_BUGS["sse_data_line_breaks_uncounted"]:
            pytest.xfail(
                "known bug sse_data_line_breaks_uncounted: empty data lines "
                "are held without being counted against max_event_bytes"
            )
        cap = 16 * 1024
        chunk = unit * (64 * 1024 // len(unit))
        framer = SSEFramer(max_event_bytes=cap)
        framer.feed(b"data: start\n")
        tracemalloc.start()  # slows the line-by-line path: 2 MiB (128 caps) is plenty
        try:
            for _ in range(32 * SCALE):
                count()
                assert framer.feed(chunk) == []
                assert framer.buffered <= cap
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # held data costs more than its bytes for tiny lines (a list of bytes objects), and
        # CR normalisation copies a chunk twice: bounded by the cap, not by what was fed
        assert peak <= 16 * cap + 3 * len(chunk), f"{name}: peak {peak} bytes"
        if unit.startswith(b":"):
            assert framer.comments > 0
        else:
            assert framer.oversized == 1
        assert framer.feed(b"\n\ndata: ok\n\n")[-1].data == b"ok"
        framer.feed(b"data: cut")
        framer.flush()
        assert framer.incomplete_at_eof

    def test_framer_one_huge_chunk_is_capped(self, count: Any) -> None:
        """A single 16 MiB chunk of one unterminated line leaves at most the cap buffered."""
        count()
        framer = SSEFramer(max_event_bytes=1 << 20)
        assert framer.feed(b"data: " + b"y" * (16 << 20)) == []
        assert (framer.buffered, framer.oversized) == (0, 1)


# --------------------------------------------------------------------------------------------
# (b) the tracker

_RECORDINGS = {name: load_recording(name) for name in all_recordings()}
_INTERESTING = [
    b"\n",
    b"\r",
    b"\n\n",
    b"data: ",
    b"[DONE]",
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e308",
    b"18446744073709551615",
    b'"index":',
    b'"tool_calls":',
    b'"timings":',
    b'"choices":',
    b'"usage":',
    b'"error":',
    b"\x00",
    b"\xff",
    b"[" * 300,
]


@st.composite
def mutated_recording(draw: st.DrawFn) -> tuple[bytes, bool, Dialect]:
    """A recorded llama-server body with random flips, insertions, deletions and a truncation,
    and the dialect of its request's path."""
    rec = _RECORDINGS[draw(st.sampled_from(sorted(_RECORDINGS)))]
    sse_body = (rec.header("Content-Type") or "").startswith("text/event-stream")
    buf = bytearray(rec.body)
    for _ in range(draw(st.integers(0, 8))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "duplicate"]))
        pos = draw(st.integers(0, len(buf)))
        if op == "flip" and pos < len(buf):
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            buf[pos:pos] = draw(st.sampled_from(_INTERESTING) | st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[pos : pos + draw(st.integers(1, 200))]
        else:
            buf[pos:pos] = bytes(buf[pos : pos + draw(st.integers(1, 100))])
    if draw(st.booleans()):
        del buf[draw(st.integers(0, len(buf))) :]
    # now and then the wrong framing: SSE read as a JSON body and the other way round
    framing = sse_body if draw(st.integers(0, 9)) else not sse_body
    return bytes(buf), framing, dialect_for(rec.request_path)


class Raw(bytes):
    """JSON text spliced in as is (numbers orjson cannot emit, nesting deeper than it allows)."""


_RAW = [
    b"1e308",
    b"-1e308",
    b"1e-400",
    b"-0",
    b"0.0",
    b"1E2",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"123456789012345678901234567890",
    b"1" * 400,
    b"1e400",
    b"NaN",
    b"Infinity",
]
_KEYS = st.sampled_from(
    [
        "index",
        "id",
        "type",
        "function",
        "name",
        "arguments",
        "tool_calls",
        "delta",
        "message",
        "choices",
        "timings",
        "usage",
        "prompt_n",
        "cache_n",
        "predicted_n",
        "prompt_ms",
        "predicted_ms",
        "prompt_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "cached_tokens",
        "error",
        "code",
        "model",
        "finish_reason",
        "content",
        "reasoning_content",
        "text",
        "role",
    ]
) | st.text(max_size=6)
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(_RAW).map(Raw),
    st.integers(1, 1100).map(lambda d: Raw(b"[" * d + b"]" * d)),
)
#: Any JSON value (hypothesis ``st.recursive``), with raw number and nesting extremes.
json_values = st.recursive(
    _leaf,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_KEYS, kids, max_size=4),
    max_leaves=12,
)


def _opt_dict(fields: dict[str, Any]) -> Any:
    return st.fixed_dictionaries({}, optional=fields)


def _shape(required: dict[str, Any], optional: dict[str, Any]) -> Any:
    """An object with ``required`` keys (often), any of ``optional`` ones, or any JSON value."""
    return st.one_of(
        st.fixed_dictionaries(required, optional=optional),
        _opt_dict(required | optional),
        json_values,
    )


_count_like = st.one_of(st.integers(-5, 10**6), st.integers(-(2**63), 2**64 - 1), json_values)
_timings = _opt_dict(
    {k: _count_like for k in ("prompt_n", "cache_n", "predicted_n")}
    | {
        k: st.floats(allow_nan=False, allow_infinity=False) | json_values
        for k in ("prompt_ms", "predicted_ms")
    }
)
_usage = _opt_dict(
    {
        "prompt_tokens": _count_like,
        "completion_tokens": _count_like,
        "prompt_tokens_details": _opt_dict({"cached_tokens": _count_like}) | json_values,
    }
)
_function = _shape(
    {"name": st.text(max_size=8) | json_values}, {"arguments": st.text(max_size=16) | json_values}
)
_index = st.sampled_from([0, 1, 2, -1, True, False, 1.5, "0", None, 2**64 - 1]) | json_values
_tool_call = _shape(
    {"index": _index, "function": _function}, {"id": json_values, "type": json_values}
)
_tool_calls = st.lists(_tool_call, max_size=3) | json_values
_delta = _shape(
    {"tool_calls": _tool_calls},
    {
        "role": json_values,
        "content": st.text(max_size=8) | json_values,
        "reasoning_content": json_values,
    },
)
_finish = st.sampled_from(["stop", "length", "tool_calls"]) | json_values
_choice = st.one_of(
    _shape({"delta": _delta}, {"index": json_values, "finish_reason": _finish}),
    _shape(
        {"message": _delta}, {"index": json_values, "finish_reason": _finish, "text": json_values}
    ),
)
#: An object shaped like a llama-server chunk or body, every field possibly of a wrong type.
llama_objects = _shape(
    {"choices": st.lists(_choice, max_size=3) | json_values},
    {
        "model": st.text(max_size=8) | json_values,
        "timings": _timings | json_values,
        "usage": _usage | json_values,
        "error": _opt_dict({"type": json_values, "code": json_values, "message": json_values})
        | json_values,
        "object": json_values,
    },
)


def dump(value: Any) -> bytes:
    """Serialise ``value`` as compact JSON, splicing :class:`Raw` text in unchanged."""
    if isinstance(value, Raw):
        return bytes(value)
    if isinstance(value, dict):
        return b"{" + b",".join(orjson.dumps(k) + b":" + dump(v) for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(dump(v) for v in value) + b"]"
    if type(value) is int and not -(2**63) <= value < 2**64:
        return str(value).encode()
    return orjson.dumps(value)


class TestTracker:
    @_settings(400)
    @given(streams, st.booleans(), st.sampled_from(DIALECTS), st.data())
    def test_tracker_arbitrary_bytes(
        self, count: Any, stream: bytes, sse_body: bool, dialect: Dialect, data: st.DataObject
    ) -> None:
        """Arbitrary bytes as SSE or JSON body, read through any dialect: no raise, exact byte
        counts, chunking-invariant."""
        count()
        checks.check_tracker(stream, data.draw(cuts(stream)), sse_body, dialect=dialect)

    @_settings(400)
    @given(mutated_recording(), st.sampled_from([checks.DEFAULT_CAP, 128, 1024]), st.data())
    def test_tracker_mutated_recordings(
        self, count: Any, case: tuple[bytes, bool, Dialect], cap: int, data: st.DataObject
    ) -> None:
        """Real llama-server bodies with random flips, insertions, deletions and truncation,
        read through the dialect of their path."""
        count()
        stream, sse_body, dialect = case
        checks.check_tracker(
            stream, data.draw(cuts(stream)), sse_body, max_event_bytes=cap, dialect=dialect
        )

    @_settings(300)
    @given(st.lists(llama_objects, min_size=1, max_size=4), st.booleans(), st.data())
    def test_tracker_adversarial_json(
        self, count: Any, objs: list[Any], done: bool, data: st.DataObject
    ) -> None:
        """Wrong-typed, deep, huge-number llama JSON: no raise, no wrong-typed Observation field."""
        count()
        events = b"".join(sse_frame(dump(o)) for o in objs) + (DONE if done else b"")
        checks.check_tracker(events, data.draw(cuts(events)), True)
        body = dump(objs[0])
        checks.check_tracker(body, data.draw(cuts(body)), False)

    def test_tracker_never_ending_event_is_flagged(self, count: Any) -> None:
        """A never-ending SSE event is capped by max_event_bytes and flagged as oversized."""
        tracker = StreamTracker(0.0, sse=True, clock=lambda: 1.0, max_event_bytes=1 << 16)
        chunk = b"q" * (1 << 18)
        head = b'data: {"choices":['
        tracemalloc.start()
        try:
            tracker.feed(head)
            for _ in range(64):  # 16 MiB
                count()
                tracker.feed(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        obs = tracker.finish()
        assert peak < (1 << 16) + 2 * len(chunk)
        assert (obs.oversized_events, obs.response_bytes) == (1, len(head) + 64 * len(chunk))
        assert obs.analysis_error is None

    def test_tracker_huge_json_body_is_dropped(self, count: Any) -> None:
        """A JSON body past max_body_bytes is dropped (and flagged), not kept."""
        count()
        tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0, max_body_bytes=1 << 20)
        for _ in range(40):
            tracker.feed(b" " * (1 << 16))
        obs = tracker.finish()
        assert obs.analysis_error == "response_body_too_large"
        assert obs.response_bytes == 40 << 16


# --------------------------------------------------------------------------------------------
# (c) the request analysis

_request_objects = _opt_dict(
    {
        "model": st.text(max_size=8) | json_values,
        "stream": st.booleans() | json_values,
        "messages": st.lists(
            _opt_dict(
                {"role": st.sampled_from(["system", "user"]) | json_values, "content": json_values}
            )
            | json_values,
            max_size=3,
        )
        | json_values,
        "tools": st.lists(
            _opt_dict(
                {
                    "type": json_values,
                    "function": _opt_dict(
                        {"name": st.text(max_size=8) | json_values, "parameters": json_values}
                    )
                    | json_values,
                }
            )
            | json_values,
            max_size=3,
        )
        | json_values,
        "tool_choice": json_values,
        "chat_template_kwargs": json_values,
    }
)


class TestRequest:
    @_settings(500)
    @given(
        st.sampled_from(checks.METHODS),
        st.sampled_from(checks.PATHS) | st.text(max_size=30),
        st.binary(max_size=300) | adversarial,
    )
    def test_request_arbitrary_bytes(self, count: Any, method: str, path: str, body: bytes) -> None:
        """analyse_request on arbitrary bytes never raises and returns well-typed facts."""
        count()
        checks.check_request(method, path, body)

    @_settings(300)
    @given(
        st.sampled_from(checks.METHODS),
        st.sampled_from(checks.PATHS),
        _request_objects | json_values,
    )
    def test_request_arbitrary_json(self, count: Any, method: str, path: str, obj: Any) -> None:
        """analyse_request on arbitrary JSON (st.recursive) never raises; tool requests key fine."""
        count()
        checks.check_request(method, path, dump(obj))


# --------------------------------------------------------------------------------------------
# (d) end to end: bytes through the relay


def _random_stream(rng: random.Random) -> bytes:
    parts: list[bytes] = []
    for _ in range(rng.randint(0, 40)):
        kind = rng.random()
        if kind < 0.45:
            parts.append(rng.choice(_PIECES))
        elif kind < 0.75:
            parts.append(rng.randbytes(rng.randint(0, 64)))
        elif kind < 0.9:
            parts.append(rng.choice(_RUN_UNITS) * rng.randint(1, 2000))
        else:
            rec = _RECORDINGS[rng.choice(sorted(_RECORDINGS))].body
            a = rng.randint(0, len(rec))
            parts.append(rec[a : a + rng.randint(0, 4000)])
    return b"".join(parts)


_CONTENT_TYPES = [
    (("Content-Type", "text/event-stream"),),
    (("Content-Type", "application/json; charset=utf-8"),),
    (("Content-Type", "application/octet-stream"),),
]


async def test_relay_random_streams_byte_identical(
    count: Any,
    fake: tuple[FakeUpstream, TestServer],
    make_proxy: ProxyFactory,
    request: pytest.FixtureRequest,
) -> None:
    """Random byte streams in random write sizes reach the client byte-identical, each recorded."""
    upstream, server = fake
    url = str(server.make_url("")).rstrip("/")
    proxies = [await make_proxy(url), await make_proxy(url, upstream={"max_event_bytes": 256})]
    seed = int(os.environ.get("TIMING_PROXY_FUZZ_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    cases = examples(60) * SCALE  # random streams, as many as a property test's examples
    deadline = time.monotonic() + 30.0 * SCALE
    for i in range(cases):
        if time.monotonic() > deadline:
            break
        count()
        stream = _random_stream(rng)
        headers = rng.choice(_CONTENT_TYPES)
        chunking = rng.choice([None, 1, 7, 512, 65536]) if stream else None
        upstream.script = sse([stream] if stream else [], chunking=chunking, headers=headers)
        proxy = proxies[i % 2]
        before = len(proxy.captured.records)
        resp = await proxy.client.post("/v1/chat/completions", data=b'{"stream":true}')
        got = await resp.read()
        where = f"seed {seed}, case {i}, {len(stream)} bytes, chunking {chunking}"
        assert resp.status == 200, where
        assert got == stream, f"relayed bytes differ ({where})"
        for _ in range(500):
            if len(proxy.captured.records) > before:
                break
            await asyncio.sleep(0.002)
        assert len(proxy.captured.records) == before + 1, f"no record ({where})"
        record = proxy.captured.records[-1]
        assert record.outcome is Outcome.COMPLETED, where
        assert record.response_bytes == len(stream), where
        if headers[0][1] == "text/event-stream":
            cap = proxy.config.upstream.max_event_bytes
            events, _, _ = checks.frame([stream], cap)
            assert record.events == len(events), where
    terminal_log(request.config, "fuzz")(f"relay: seed {seed} (TIMING_PROXY_FUZZ_SEED to replay)")


# --------------------------------------------------------------------------------------------
# Known bugs: each test fails while its bug reproduces (xfail), and passes once it is fixed


def _known(bug: str, reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(KNOWN_BUGS[bug], reason=f"known bug {bug}: {reason}", strict=True)


@_known(
    "sse_data_line_breaks_uncounted",
    "SSEFramer._line adds len(value), not len(value) + 1, to _size for each data line",
)
def test_bug_sse_empty_data_lines_count_against_cap() -> None:
    """`data:` lines without a value are counted against max_event_bytes (memory stays capped)."""
    framer = SSEFramer(max_event_bytes=1000)
    for _ in range(100):
        framer.feed(b"data:\n" * 1000)
        assert framer.buffered <= 1000
    assert framer.oversized == 1
    assert all(len(e.data) <= 1000 for e in framer.feed(b"\n"))


@_known("bool_tool_index", "StreamTracker._merge_tool_deltas accepts a bool index")
def test_bug_tool_call_index_true_is_not_a_bool() -> None:
    """A streamed tool call with `"index": true` gives an int index (0, like any non-int)."""
    tracker = StreamTracker(0.0, sse=True, clock=lambda: 1.0)
    tracker.feed(
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":true,"function":'
        b'{"name":"f","arguments":"{}"}}]}}]}\n\n'
    )
    assert [type(c.index) for c in tracker.finish().tool_calls] == [int]


@_known(
    "nonstream_tool_call_not_object",
    "StreamTracker._read_body spreads **c of a tool_calls item that is not an object",
)
def test_bug_nonstream_tool_call_not_an_object() -> None:
    """A non-object item in message.tool_calls is skipped, not an analysis failure."""
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(
        orjson.dumps(
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": ["junk", {"function": {"name": "f", "arguments": "{}"}}]
                        }
                    }
                ]
            }
        )
    )
    obs = tracker.finish()
    assert obs.analysis_error is None
    assert [c.name for c in obs.tool_calls] == ["f"]


@_known(
    "counts_beyond_64_bits",
    "ServerTimings.from_json / usage accept any int; sums overflow orjson's 64-bit range",
)
def test_bug_huge_counts_still_log() -> None:
    """Counts beyond 64 bits from the upstream do not make the record unloggable."""
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(
        b'{"timings":{"prompt_n":18446744073709551615,"cache_n":18446744073709551615,'
        b'"prompt_ms":1.0}}'
    )
    record = checks._build(tracker.finish(), sse=False)
    orjson.dumps(record.to_dict())


@_known(
    "metrics_negative_counts",
    "Metrics.observe increments a Counter by prompt_n/cache_n, which may be negative",
)
def test_bug_negative_counts_do_not_break_metrics() -> None:
    """Negative token counts from the upstream do not make the metrics sink raise."""
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(
        b'{"usage":{"prompt_tokens":1,"completion_tokens":2,'
        b'"prompt_tokens_details":{"cached_tokens":5}}}'
    )
    from proxy.serve.metrics import Metrics

    Metrics().observe(checks._build(tracker.finish(), sse=False))


@_known(
    "nonfinite_ratio",
    "record.ratio() divides by a tiny positive prompt_ms/predicted_ms and returns inf",
)
def test_bug_tiny_durations_give_finite_rates() -> None:
    """A denormal prompt_ms from the upstream gives an unknown (or finite) rate, never inf."""
    tracker = StreamTracker(0.0, sse=False, clock=lambda: 1.0)
    tracker.feed(
        b'{"timings":{"prompt_n":10,"prompt_ms":1e-306,"predicted_n":9,"predicted_ms":5e-324}}'
    )
    record = checks._build(tracker.finish(), sse=False)
    for value in (record.prefill_tok_s, record.decode_tok_s):
        assert value is None or math.isfinite(value)


@_known(
    "deep_tools_render_key",
    "accounting.begin -> schema.render_key -> orjson.dumps fails past 254 levels: HTTP 500",
)
async def test_bug_deeply_nested_tools_are_relayed(
    fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory
) -> None:
    """A tool request nested 300 deep is relayed (the upstream decides), not answered 500."""
    upstream, server = fake
    upstream.script = sse([b"data: {}\n\n", DONE])
    proxy = await make_proxy(str(server.make_url("")).rstrip("/"), accounting={"enabled": True})
    body = (
        b'{"messages":[{"role":"user","content":"hi"}],"stream":true,"tools":[{"type":'
        b'"function","function":{"name":"f","parameters":' + b"[" * 300 + b"]" * 300 + b"}}]}"
    )
    resp = await proxy.client.post("/v1/chat/completions", data=body)
    assert resp.status == 200, await resp.text()
    # the agent's request reached the upstream once (accounting look-ups may follow it)
    assert [s.path_qs for s in upstream.seen].count("/v1/chat/completions") == 1


# --------------------------------------------------------------------------------------------
# Coverage-guided: a short run of each atheris harness

_HARNESSES = ("sse", "tracker", "request")
_EXECS = re.compile(rb"stat::number_of_executed_units:\s*(\d+)|Done (\d+) runs in")


def _start_harness(name: str, seconds: int, tmp_path: Path, sink: Path) -> subprocess.Popen[bytes]:
    """Start atheris harness ``fuzz/fuzz_{name}.py`` for ``seconds``, its output to ``sink``
    (a file, not a pipe: a full pipe would stall it)."""
    corpus = tmp_path / f"corpus_{name}"
    corpus.mkdir()
    with sink.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                str(REPO / "fuzz" / f"fuzz_{name}.py"),
                f"-max_total_time={seconds}",
                "-timeout=10",
                "-rss_limit_mb=2048",
                "-print_final_stats=1",
                f"-dict={REPO / 'fuzz' / 'llama.dict'}",
                f"-artifact_prefix={tmp_path}/",
                str(corpus),
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _harness_failure(
    name: str, proc: subprocess.Popen[bytes], out: bytes, seconds: int, log: Callable[[str], None]
) -> str | None:
    """Log a finished harness's executions and known-bug hits; why it failed, or None."""
    found = [int(a or b) for a, b in _EXECS.findall(out)]
    execs = max(found) if found else 0
    INPUTS[f"atheris_{name}"] += execs
    log(f"atheris fuzz_{name}: {execs} executions in {seconds} s, exit {proc.returncode}")
    for line in out.splitlines():
        if line.startswith(b"INFO: known bug hit"):
            log(f"  fuzz_{name}: {line.decode(errors='replace')}")
    if proc.returncode != 0 or execs == 0:
        return f"fuzz_{name} exited {proc.returncode}:\n" + out[-4000:].decode(errors="replace")
    return None


def _require_atheris() -> None:
    """Skip without atheris, or fail where CI should have installed it."""
    if importlib.util.find_spec("atheris") is not None:
        return
    # atheris ships wheels for Linux x86_64 only (none for a Jetson's aarch64)
    if _ci() and sys.platform == "linux" and platform.machine() == "x86_64":
        pytest.fail(
            "atheris is not importable but CI is set: add it to the test extras "
            "(atheris>=2.3; sys_platform == 'linux' and platform_machine == "
            "'x86_64')",
            pytrace=False,
        )
    pytest.skip("atheris is not installed (python fuzz/fuzz_sse.py --plain=10 needs none)")


@pytest.mark.load  # a fixed time budget on every core: not for the fast inner loop
def test_atheris_smoke(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Each atheris harness runs its time budget without a crash (all three at once)."""
    _require_atheris()
    seconds = int(os.environ.get("TIMING_PROXY_FUZZ_SECONDS") or (120 if FULL else 10))
    log = terminal_log(request.config, "fuzz")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"fuzz_{name}.log" for name in _HARNESSES}
    try:
        for name in _HARNESSES:
            procs[name] = _start_harness(name, seconds, tmp_path, logs[name])
        deadline = time.monotonic() + seconds + 120
        for proc in procs.values():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failures = [
        failure
        for name, proc in procs.items()
        if (failure := _harness_failure(name, proc, logs[name].read_bytes(), seconds, log))
    ]
    assert not failures, "\n\n".join(failures)


def test_known_bug_reproducers_are_consistent() -> None:
    """Each known bug's flag is a bool and the fuzz module's tolerances name only known bugs."""
    assert all(type(v) is bool for v in KNOWN_BUGS.values())
    assert set(checks.TOLERATED) <= set(KNOWN_BUGS)
