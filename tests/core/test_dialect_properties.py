"""Property tests of the four dialects against the official SDKs.

Hypothesis draws one model turn (reasoning and text pieces, 0-3 tool calls whose argument JSON
is split at random points, the final counts and ``timings``), renders it in each API's exact
llama-server shapes (protocol doc §1-3, §8), splits the bytes into random chunks and delivers
each at a random nondecreasing clock time, through the assembly path the relay uses
(``analyse_request`` → ``StreamTracker`` → ``build_record``). The record must then:

- put ``ttft_ms`` between ``ttfb_ms`` and ``e2e_ms``, at the arrival of the first event that
  carries a token (content, reasoning or tool-call text), and count the token events;
- hold the tool calls the SDK's own stream accumulator (``tests/sdk_reference.py``) assembles
  from the same bytes, and, for whole bodies, those the SDK's parse of the body finds; and
  the turn's final token counts.

The completion endpoints carry no calls: one token event per non-empty piece. The openai SDK
cannot accumulate llama-server's Responses stream as sent (its events lack ``output_index``:
two items give "Duplicate response output index None"), so the SDK reads the same turn with
OpenAI's indices, and the tracker reads both shapes. A stream of events no dialect knows has
no ttft, and null ``token_events`` and ``tool_calls``.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.assemble import Exchange, build_record
from proxy.core.record import Outcome, Record, ms
from proxy.core.request import analyse_request
from proxy.core.tracker import StreamTracker
from tests import sdk_reference as sdk
from tests.fakes import FakeClock, sse_json, typed_event
from tests.profiles import examples

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
MODEL = "gemma3"
PING = b":\n\n"

PROPERTY = settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PER_PATH = settings(PROPERTY, max_examples=examples(50))


# --------------------------------------------------------------------------------------------
# What is generated: a turn, rendered as events; a delivery of the bytes


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call: its full argument text and that text split into streamed fragments."""

    id: str
    name: str
    arguments: str
    fragments: tuple[str, ...]
    streamed: int
    """Responses: how many fragments go out as deltas (llama-server sends the rest only in
    the call's ``.done`` item)."""

    @property
    def input(self) -> Any:
        return json.loads(self.arguments)


@dataclass(frozen=True, slots=True)
class Turn:
    """One model turn, independent of the API that carries it."""

    reasoning: tuple[str, ...]
    text: tuple[str, ...]
    calls: tuple[Call, ...]
    prompt_n: int
    cache_n: int
    predicted_n: int
    prompt_ms: float
    predicted_ms: float
    cut: bool
    """Stopped by the token limit."""
    usage_chunk: bool
    """Chat Completions: ``stream_options.include_usage`` (a last ``choices: []`` chunk)."""
    held_back: bool
    """Responses: the last call was parsed only at the end (no ``added`` item, no delta)."""
    progress: int
    """``return_progress``: prompt-progress events before the first token (§1.7, §8.3)."""
    per_token: bool
    """``timings_per_token``: live ``timings`` on every token event (§1.6)."""
    pings: tuple[int, ...]

    def timings(self, predicted_n: int | None = None) -> dict[str, Any]:
        """The ``timings`` object; ``predicted_n`` for a live one mid-stream."""
        n = self.predicted_n if predicted_n is None else predicted_n
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n,
            "prompt_per_second": 1000.0 * self.prompt_n / self.prompt_ms,
            "predicted_n": n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / max(n - 1, 1),
            "predicted_per_second": 1000.0 * max(n - 1, 0) / self.predicted_ms,
        }

    def live(self, n: int) -> dict[str, Any]:
        """What a token event carries besides its delta: live timings, when asked for."""
        return {"timings": self.timings(min(n, self.predicted_n))} if self.per_token else {}

    def progress_steps(self) -> list[dict[str, Any]]:
        """The ``prompt_progress`` objects, from the cached part to the whole prompt."""
        total = self.prompt_n + self.cache_n
        steps = [self.cache_n + self.prompt_n * i // self.progress for i in range(self.progress)]
        return [
            {"total": total, "cache": self.cache_n, "processed": done, "time_ms": float(i)}
            for i, done in enumerate(steps)
        ]

    def tool_names(self) -> list[str]:
        return sorted({c.name for c in self.calls} | {"stop_robot"})


@dataclass(slots=True)
class Stream:
    """A rendered response: its events in order and which of them carry a token."""

    events: list[bytes] = field(default_factory=list)
    tokens: list[bool] = field(default_factory=list)

    def add(self, data: bytes, *, token: bool = False) -> None:
        self.events.append(data)
        self.tokens.append(token)

    def with_pings(self, positions: tuple[int, ...]) -> Stream:
        """The same stream with a keep-alive comment before each of the given events."""
        out = Stream()
        for i, (data, token) in enumerate(zip(self.events, self.tokens, strict=True)):
            for _ in range(positions.count(i)):
                out.add(PING)
            out.add(data, token=token)
        return out

    @property
    def raw(self) -> bytes:
        return b"".join(self.events)

    def token_ends(self) -> list[int]:
        """The offset of the last byte of each token-bearing event."""
        ends = list(itertools.accumulate(len(e) for e in self.events))
        return [end - 1 for end, token in zip(ends, self.tokens, strict=True) if token]


@dataclass(frozen=True, slots=True)
class Delivery:
    """How the bytes reach the proxy: chunk boundaries and each chunk's clock time."""

    t0: float
    cuts: tuple[int, ...]
    times: tuple[float, ...]
    end: float

    def chunks(self, raw: bytes) -> list[bytes]:
        bounds = [0, *self.cuts, len(raw)]
        return [raw[a:b] for a, b in itertools.pairwise(bounds)]

    def seen_at(self, offset: int) -> float:
        """The clock time of the chunk that holds byte ``offset``."""
        return self.times[bisect.bisect_right(self.cuts, offset)]


ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=10)
"""A piece of generated text: llama-server never streams an empty one."""
KEYS = st.text(st.characters(codec="utf-8"), max_size=6)
SCALARS = st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.text(max_size=8)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)


@st.composite
def splits(draw: st.DrawFn, text: str) -> tuple[str, ...]:
    """``text`` cut into non-empty fragments at random points, often ``{`` first (llama-server's
    placeholder while no argument text is parsed)."""
    cuts = draw(st.sets(st.integers(1, len(text) - 1), max_size=8)) if len(text) > 1 else set()
    if draw(st.booleans()):
        cuts.add(1)
    bounds = [0, *sorted(c for c in cuts if c < len(text)), len(text)]
    return tuple(text[a:b] for a, b in itertools.pairwise(bounds))


@st.composite
def tool_call(draw: st.DrawFn, index: int) -> Call:
    """One call with object arguments as a model writes them: spaced or compact, raw UTF-8
    or escaped."""
    args = draw(st.dictionaries(KEYS, VALUES, max_size=4))
    spaced = draw(st.booleans())
    text = json.dumps(
        args,
        ensure_ascii=draw(st.booleans()),
        separators=(", ", ": ") if spaced else (",", ":"),
    )
    fragments = draw(splits(text))
    return Call(
        id=f"pQ7x{index:028d}",
        name=draw(NAMES),
        arguments=text,
        fragments=fragments,
        streamed=draw(st.integers(0, len(fragments))),
    )


@st.composite
def turns(draw: st.DrawFn, *, truncate: bool = False) -> Turn:
    """A model turn: 0-3 reasoning and text pieces, 0-3 calls, the final counts. With
    ``truncate``, a turn cut by the token limit may end inside its last call's arguments
    (the streamed fragments stay as they were: Chat Completions)."""
    n_calls = draw(st.integers(0, 3))
    calls = [draw(tool_call(i)) for i in range(n_calls)]
    cut = draw(st.booleans())
    if truncate and cut and calls and len(calls[-1].arguments) > 1 and draw(st.booleans()):
        last = calls[-1]
        prefix = last.arguments[: draw(st.integers(1, len(last.arguments) - 1))]
        fragments = draw(splits(prefix))
        calls[-1] = Call(last.id, last.name, prefix, fragments, len(fragments))
    return Turn(
        reasoning=tuple(draw(st.lists(TEXT, max_size=3))),
        text=tuple(draw(st.lists(TEXT, max_size=3))),
        calls=tuple(calls),
        prompt_n=draw(st.integers(1, 5000)),
        cache_n=draw(st.integers(0, 5000)),
        predicted_n=draw(st.integers(1, 500)),
        prompt_ms=draw(st.floats(0.5, 1e5)),
        predicted_ms=draw(st.floats(0.001, 1e5)),
        cut=cut,
        usage_chunk=draw(st.booleans()),
        held_back=n_calls > 0 and draw(st.booleans()),
        progress=draw(st.integers(0, 3)),
        per_token=draw(st.booleans()),
        pings=tuple(draw(st.lists(st.integers(0, 40), max_size=3))),
    )


@st.composite
def deliveries(draw: st.DrawFn, size: int) -> Delivery:
    """Chunk boundaries in ``size`` bytes (random ones, or every ``stride`` bytes down to
    one byte a chunk), and nondecreasing times from a random t0 (a repeated pattern of gaps,
    zero included)."""
    if size > 1 and draw(st.booleans()):
        stride = draw(st.integers(1, 64))
        cuts = list(range(stride, size, stride))
    else:
        cuts = sorted(draw(st.sets(st.integers(1, size - 1), max_size=40))) if size > 1 else []
    t0 = draw(st.floats(0.0, 1e5))
    pattern = draw(st.lists(st.floats(0.0, 3.0), min_size=1, max_size=16))
    gaps = [pattern[i % len(pattern)] for i in range(len(cuts) + 2)]
    times = list(itertools.accumulate(gaps, initial=t0))[1:]
    return Delivery(t0=t0, cuts=tuple(cuts), times=tuple(times[:-1]), end=times[-1])


# --------------------------------------------------------------------------------------------
# The relay's assembly path, with a fake clock


def relay(
    path: str, request: dict[str, Any], raw: bytes, d: Delivery, *, sse: bool = True
) -> tuple[Record, list[tuple[str, str]]]:
    """The record the relay would write for ``raw``, delivered as ``d`` says, and the
    (name, arguments) of the calls in the tracker's observation."""
    body = orjson.dumps(request)
    facts = analyse_request("POST", path, body)
    clock = FakeClock(d.t0)
    tracker = StreamTracker(d.t0, sse=sse, clock=clock, dialect=facts.dialect)
    for chunk, t in zip(d.chunks(raw), d.times, strict=True):
        clock.now = t
        tracker.feed(chunk)
    clock.now = d.end
    obs = tracker.finish()
    exchange = Exchange(
        id="req-1",
        ts="2025-01-01T00:00:00Z",
        method="POST",
        path=path,
        status=200,
        outcome=Outcome.COMPLETED,
        end_s=clock() - d.t0,
        request_bytes=len(body),
    )
    calls = [(c.name, c.arguments) for c in obs.tool_calls]
    return build_record(exchange, facts, obs), calls


def check_times(record: Record, stream: Stream, d: Delivery) -> None:
    """ttfb <= ttft <= e2e; ttft is the arrival of the first token event, and the token
    events and the decode wall time are those of the stream."""
    assert record.ttfb_ms is not None
    assert record.e2e_ms is not None
    assert record.ttfb_ms <= record.e2e_ms
    if record.ttft_ms is not None:
        assert record.ttfb_ms <= record.ttft_ms <= record.e2e_ms
    seen = [d.seen_at(end) - d.t0 for end in stream.token_ends()]
    assert record.token_events == len(seen)
    assert record.ttft_ms == (ms(seen[0]) if seen else None)
    assert record.decode_wall_ms == (ms(seen[-1] - seen[0]) if seen else None)


def is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def check_calls(record: Record, turn: Turn) -> None:
    """The record counts the calls and finds them valid exactly when every call's arguments
    are a JSON object (the names are all declared)."""
    assert record.tool_calls == len(turn.calls)
    valid = all(is_object(c.arguments) for c in turn.calls) if turn.calls else None
    assert record.tool_call_valid is valid


def check_counts(record: Record, turn: Turn) -> None:
    """The record's token counts are the turn's final ones (a live ``timings`` mid-stream
    and a ``usage`` placeholder do not stay)."""
    assert (record.prompt_n, record.cache_n) == (turn.prompt_n, turn.cache_n)
    assert record.predicted_n == turn.predicted_n


# --------------------------------------------------------------------------------------------
# Chat Completions (§1.3, §2)

ENVELOPE = {
    "created": 1764471600,
    "id": "chatcmpl-Qm3" + "x" * 29,
    "model": MODEL,
    "system_fingerprint": "b1234-abcdef0",
    "object": "chat.completion.chunk",
}


def chat_usage(turn: Turn) -> dict[str, Any]:
    prompt = turn.prompt_n + turn.cache_n
    return {
        "completion_tokens": turn.predicted_n,
        "prompt_tokens": prompt,
        "total_tokens": prompt + turn.predicted_n,
        "prompt_tokens_details": {"cached_tokens": turn.cache_n},
    }


def chat_finish(turn: Turn) -> str:
    return "length" if turn.cut else "tool_calls" if turn.calls else "stop"


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"finish_reason": finish, "index": 0, "delta": delta}
    return sse_json({"choices": [choice], **ENVELOPE, **extra})


def chat_stream(turn: Turn) -> Stream:
    """Role chunk, reasoning, content, each call's first delta (id, type, name, first
    fragment) and its later fragments, the finish chunk, the optional usage chunk, [DONE]."""
    s = Stream()
    role = {"role": "assistant", "content": None}
    for step in turn.progress_steps():
        s.add(chat_chunk(role, **turn.live(0), prompt_progress=step))
    s.add(chat_chunk(role))
    deltas: list[dict[str, Any]] = [{"reasoning_content": p} for p in turn.reasoning]
    deltas += [{"content": p} for p in turn.text]
    for i, call in enumerate(turn.calls):
        first, *rest = call.fragments
        fn = {"name": call.name, "arguments": first}
        deltas.append(
            {"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": fn}]}
        )
        deltas += [{"tool_calls": [{"index": i, "function": {"arguments": f}}]} for f in rest]
    for n, delta in enumerate(deltas, 1):
        s.add(chat_chunk(delta, **turn.live(n)), token=True)
    if turn.usage_chunk:
        s.add(chat_chunk({}, chat_finish(turn)))
        last = {"choices": [], **ENVELOPE, "usage": chat_usage(turn), "timings": turn.timings()}
        s.add(sse_json(last))
    else:
        s.add(chat_chunk({}, chat_finish(turn), timings=turn.timings()))
    s.add(b"data: [DONE]\n\n")
    return s.with_pings(turn.pings)


def chat_body(turn: Turn) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(turn.text)}
    if turn.reasoning:
        message["reasoning_content"] = "".join(turn.reasoning)
    if turn.calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}, "id": c.id}
            for c in turn.calls
        ]
    choice = {"finish_reason": chat_finish(turn), "index": 0, "message": message}
    body = {**ENVELOPE, "object": "chat.completion", "usage": chat_usage(turn)}
    return orjson.dumps({"choices": [choice], **body, "timings": turn.timings()})


def chat_request(turn: Turn, *, stream: bool) -> dict[str, Any]:
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {}}} for n in turn.tool_names()
    ]
    messages = [{"role": "user", "content": "hi"}]
    return {
        "model": MODEL,
        "stream": stream,
        "max_tokens": 48,
        "messages": messages,
        "tools": tools,
    }


# --------------------------------------------------------------------------------------------
# Responses (§8.3, §8.4)

RESP = {"id": "resp_0VKb" + "x" * 28, "object": "response", "status": "in_progress"}
REASONING_ID = "rs_4fTq"
MESSAGE_ID = "msg_88Lc"


def responses_usage(turn: Turn) -> dict[str, Any]:
    prompt = turn.prompt_n + turn.cache_n
    return {
        "input_tokens": prompt,
        "output_tokens": turn.predicted_n,
        "total_tokens": prompt + turn.predicted_n,
        "input_tokens_details": {"cached_tokens": turn.cache_n},
    }


def call_item(call: Call, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": "fc_" + call.id,
        "arguments": arguments,
        "call_id": "call_" + call.id,
        "name": call.name,
        "type": "function_call",
        "status": status,
    }


def responses_output(turn: Turn) -> list[dict[str, Any]]:
    """The completed ``output`` items, in llama-server's order: reasoning, message, calls."""
    out: list[dict[str, Any]] = []
    if turn.reasoning:
        content = [{"text": "".join(turn.reasoning), "type": "reasoning_text"}]
        out.append(
            {"id": REASONING_ID, "summary": [], "type": "reasoning", "content": content}
            | {"encrypted_content": "", "status": "completed"}
        )
    if turn.text:
        part = {
            "type": "output_text",
            "annotations": [],
            "logprobs": [],
            "text": "".join(turn.text),
        }
        out.append(
            {"content": [part], "id": MESSAGE_ID, "role": "assistant", "status": "completed"}
            | {"type": "message"}
        )
    out.extend(call_item(c, c.arguments, "completed") for c in turn.calls)
    return out


class ResponsesWriter:
    """Writes Responses events; ``indexed`` adds OpenAI's ``output_index``,
    ``content_index``, ``sequence_number`` and ``logprobs``, which llama-server omits and
    the openai SDK's accumulator needs."""

    def __init__(self, indexed: bool) -> None:
        self.indexed = indexed
        self.sequence = itertools.count()
        self.stream = Stream()

    def add(self, obj: dict[str, Any], at: int | None = None, *, token: bool = False) -> None:
        if self.indexed:
            obj = {**obj, "sequence_number": next(self.sequence)}
            if at is not None:
                obj["output_index"] = at
            if obj["type"].startswith("response.output_text."):
                obj |= {"content_index": 0, "logprobs": []}
            elif obj["type"].startswith("response.content_part."):
                obj["content_index"] = 0
        self.stream.add(typed_event(obj), token=token)


def responses_stream(turn: Turn, *, indexed: bool = False) -> Stream:
    """created, in_progress, the reasoning and message items and their deltas, each call's
    ``added`` item and the deltas of its streamed fragments, then the final batch: every
    item's ``.done`` (a call's with its full arguments) and ``response.completed``."""
    w = ResponsesWriter(indexed)
    w.add({"type": "response.created", "response": RESP})
    for step in turn.progress_steps():
        w.add({"type": "response.in_progress", "response": RESP, "prompt_progress": step})
    w.add({"type": "response.in_progress", "response": RESP})
    output = responses_output(turn)
    at = 0
    if turn.reasoning:
        item = {"id": REASONING_ID, "summary": [], "type": "reasoning", "content": []}
        item |= {"encrypted_content": "", "status": "in_progress"}
        w.add({"type": "response.output_item.added", "item": item}, at)
        for n, piece in enumerate(turn.reasoning, 1):
            delta = {"type": "response.reasoning_text.delta", "delta": piece}
            w.add(delta | {"item_id": REASONING_ID} | turn.live(n), at, token=True)
        at += 1
    if turn.text:
        item = {"content": [], "id": MESSAGE_ID, "role": "assistant", "status": "in_progress"}
        w.add({"type": "response.output_item.added", "item": item | {"type": "message"}}, at)
        part = {"type": "output_text", "text": ""}
        w.add({"type": "response.content_part.added", "item_id": MESSAGE_ID, "part": part}, at)
        for n, piece in enumerate(turn.text, 1):
            delta = {"type": "response.output_text.delta", "item_id": MESSAGE_ID, "delta": piece}
            w.add(delta | turn.live(n), at, token=True)
        at += 1
    responses_calls(w, turn, at)
    responses_final(w, turn, output)
    return w.stream.with_pings(turn.pings)


def responses_calls(w: ResponsesWriter, turn: Turn, at: int) -> None:
    for i, call in enumerate(turn.calls):
        if turn.held_back and i == len(turn.calls) - 1:
            return
        item = call_item(call, "", "in_progress")
        w.add({"type": "response.output_item.added", "item": item}, at + i, token=True)
        for n, fragment in enumerate(call.fragments[: call.streamed], 1):
            delta = {"type": "response.function_call_arguments.delta", "delta": fragment}
            w.add(delta | {"item_id": "fc_" + call.id} | turn.live(n), at + i, token=True)


def responses_final(w: ResponsesWriter, turn: Turn, output: list[dict[str, Any]]) -> None:
    """The final batch; a call's ``.done`` carries a token when it adds argument text."""
    text = "".join(turn.text)
    for at, item in enumerate(output):
        if item["type"] == "message":
            w.add({"type": "response.output_text.done", "item_id": MESSAGE_ID, "text": text}, at)
            part = item["content"][0]
            w.add({"type": "response.content_part.done", "item_id": MESSAGE_ID, "part": part}, at)
        adds = False
        if item["type"] == "function_call":
            i = at - (len(output) - len(turn.calls))
            call = turn.calls[i]
            held = turn.held_back and i == len(turn.calls) - 1
            adds = held or "".join(call.fragments[: call.streamed]) != call.arguments
        w.add({"type": "response.output_item.done", "item": item}, at, token=adds)
    response = {**RESP, "created_at": 1764471600, "status": "completed", "model": MODEL}
    response |= {"output": output, "usage": responses_usage(turn)}
    w.add({"type": "response.completed", "response": response, "timings": turn.timings()})


def responses_body(turn: Turn) -> bytes:
    return orjson.dumps(
        {
            "completed_at": 1764471601,
            "created_at": 1764471600,
            "id": RESP["id"],
            "model": MODEL,
            "object": "response",
            "output": responses_output(turn),
            "status": "completed",
            "usage": responses_usage(turn),
        }
    )


def responses_request(turn: Turn, *, stream: bool) -> dict[str, Any]:
    tools = [{"type": "function", "name": n, "parameters": {}} for n in turn.tool_names()]
    return {"model": MODEL, "stream": stream, "input": "hi", "tools": tools}


# --------------------------------------------------------------------------------------------
# Messages (§8.6, §8.7)


def stop_reason(turn: Turn) -> str:
    return "max_tokens" if turn.cut else "tool_use" if turn.calls else "end_turn"


def block_delta(index: int, kind: str, key: str, value: str) -> bytes:
    delta = {"type": kind, key: value}
    return typed_event({"type": "content_block_delta", "index": index, "delta": delta})


def block_start(index: int, block: dict[str, Any]) -> bytes:
    event = {"type": "content_block_start", "index": index, "content_block": block}
    return typed_event(event)


def messages_stream(turn: Turn) -> Stream:
    """message_start, a thinking block, a text block and one tool_use block per call with
    their deltas, then the final batch: the signature, every block's stop, message_delta,
    message_stop."""
    s = Stream()
    usage = {"cache_read_input_tokens": turn.cache_n, "input_tokens": turn.prompt_n}
    message = {"id": ENVELOPE["id"], "type": "message", "role": "assistant", "content": []}
    message |= {"model": MODEL, "stop_reason": None, "stop_sequence": None}
    message["usage"] = usage | {"output_tokens": 0}
    s.add(typed_event({"type": "message_start", "message": message}))
    blocks = 0
    if turn.reasoning:
        s.add(block_start(blocks, {"type": "thinking", "thinking": ""}))
        for piece in turn.reasoning:
            s.add(block_delta(blocks, "thinking_delta", "thinking", piece), token=True)
        blocks += 1
    if turn.text:
        s.add(block_start(blocks, {"type": "text", "text": ""}))
        for piece in turn.text:
            s.add(block_delta(blocks, "text_delta", "text", piece), token=True)
        blocks += 1
    for call in turn.calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name}
        s.add(block_start(blocks, block), token=True)
        for fragment in call.fragments:
            s.add(block_delta(blocks, "input_json_delta", "partial_json", fragment), token=True)
        blocks += 1
    if turn.reasoning:
        s.add(block_delta(0, "signature_delta", "signature", ""))
    for index in range(blocks):
        s.add(typed_event({"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": stop_reason(turn), "stop_sequence": None}
    end = {"type": "message_delta", "delta": delta, "usage": {"output_tokens": turn.predicted_n}}
    s.add(typed_event(end))
    s.add(typed_event({"type": "message_stop"}))
    return s.with_pings(turn.pings)


def messages_body(turn: Turn) -> bytes:
    content: list[dict[str, Any]] = []
    if turn.reasoning:
        content.append({"type": "thinking", "thinking": "".join(turn.reasoning), "signature": ""})
    if turn.text:
        content.append({"type": "text", "text": "".join(turn.text)})
    content.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in turn.calls
    )
    usage = {"cache_read_input_tokens": turn.cache_n, "input_tokens": turn.prompt_n}
    body = {"id": ENVELOPE["id"], "type": "message", "role": "assistant", "content": content}
    body |= {"model": MODEL, "stop_reason": stop_reason(turn), "stop_sequence": None}
    return orjson.dumps(body | {"usage": usage | {"output_tokens": turn.predicted_n}})


def messages_request(turn: Turn, *, stream: bool) -> dict[str, Any]:
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in turn.tool_names()]
    messages = [{"role": "user", "content": "hi"}]
    return {
        "model": MODEL,
        "max_tokens": 48,
        "stream": stream,
        "messages": messages,
        "tools": tools,
    }


# --------------------------------------------------------------------------------------------
# The completion endpoints (§4.7, §8.8)


@dataclass(frozen=True, slots=True)
class Completion:
    """A completion: its pieces (a native partial may carry an empty one), its shape."""

    pieces: tuple[str, ...]
    native: bool
    turn: Turn


@st.composite
def completions(draw: st.DrawFn) -> Completion:
    pieces = draw(st.lists(st.text(st.characters(codec="utf-8"), max_size=6), max_size=10))
    return Completion(tuple(pieces), draw(st.booleans()), draw(turns()))


def completion_stream(c: Completion) -> Stream:
    """Native: one event per token and the ``stop: true`` final object. Legacy: ``choices``
    chunks, the final one with ``finish_reason``, ``usage`` and ``timings``, then [DONE]."""
    s = Stream()
    turn = c.turn
    for n, piece in enumerate(c.pieces, 1):
        if c.native:
            partial = {"index": 0, "content": piece, "tokens": [236000 + n], "stop": False}
            partial |= {"id_slot": -1, "tokens_predicted": n, "tokens_evaluated": turn.prompt_n}
            s.add(sse_json(partial), token=bool(piece))
        else:
            choice = {"text": piece, "index": 0, "logprobs": None, "finish_reason": None}
            chunk = {"choices": [choice], **ENVELOPE, "object": "text_completion"}
            s.add(sse_json(chunk), token=bool(piece))
    if c.native:
        final = {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True}
        final |= {"model": MODEL, "tokens_predicted": turn.predicted_n}
        final |= {"tokens_evaluated": turn.prompt_n + turn.cache_n, "truncated": False}
        final |= {"stop_type": "limit" if turn.cut else "eos", "stopping_word": ""}
        final |= {"tokens_cached": turn.prompt_n + turn.predicted_n, "timings": turn.timings()}
        s.add(sse_json(final))
    else:
        choice = {"text": "", "index": 0, "logprobs": None}
        choice["finish_reason"] = "length" if turn.cut else "stop"
        chunk = {"choices": [choice], **ENVELOPE, "object": "text_completion"}
        s.add(sse_json(chunk | {"usage": chat_usage(turn), "timings": turn.timings()}))
        s.add(b"data: [DONE]\n\n")
    return s.with_pings(turn.pings)


# --------------------------------------------------------------------------------------------
# The properties


@st.composite
def delivered(
    draw: st.DrawFn, render: Callable[[Turn], Stream], *, truncate: bool = False
) -> tuple[Turn, Stream, Delivery]:
    """A turn, its rendering, and a delivery of the rendered bytes."""
    turn = draw(turns(truncate=truncate))
    stream = render(turn)
    return turn, stream, draw(deliveries(len(stream.raw)))


class TestChatCompletions:
    @PROPERTY
    @given(delivered(chat_stream, truncate=True))
    def test_stream_times_and_calls_agree_with_the_sdk(
        self, case: tuple[Turn, Stream, Delivery]
    ) -> None:
        """Any Chat Completions stream, in any chunks at any times: ttft between ttfb and
        e2e at the first token event, and the tool calls (names, argument text) those the
        openai SDK's ChatCompletionStreamState assembles from the same bytes."""
        turn, stream, d = case
        raw = stream.raw
        record, calls = relay(CHAT, chat_request(turn, stream=True), raw, d)
        check_times(record, stream, d)
        assert calls == sdk.chat_stream_calls(d.chunks(raw))
        check_calls(record, turn)
        check_counts(record, turn)

    @PROPERTY
    @given(turns(), st.data())
    def test_body_calls_agree_with_the_sdk(self, turn: Turn, data: st.DataObject) -> None:
        """A whole Chat Completions body in any chunks: the calls are ChatCompletion's, and
        a body has no ttft."""
        body = chat_body(turn)
        d = data.draw(deliveries(len(body)))
        record, calls = relay(CHAT, chat_request(turn, stream=False), body, d, sse=False)
        assert calls == sdk.chat_body_calls(body)
        check_calls(record, turn)
        check_counts(record, turn)
        assert record.ttft_ms is None
        assert record.ttfb_ms is not None and record.e2e_ms is not None
        assert record.ttfb_ms <= record.e2e_ms


class TestResponses:
    @PROPERTY
    @given(delivered(lambda t: responses_stream(t, indexed=True)))
    def test_stream_times_and_calls_agree_with_the_sdk(
        self, case: tuple[Turn, Stream, Delivery]
    ) -> None:
        """Any Responses stream (with OpenAI's indices, which the SDK needs), in any chunks:
        ttft at the first token event, and the calls those of the response the openai SDK's
        ResponseStreamState assembles, including arguments only the ``.done`` items carry."""
        turn, stream, d = case
        raw = stream.raw
        record, calls = relay(RESPONSES, responses_request(turn, stream=True), raw, d)
        check_times(record, stream, d)
        assert calls == sdk.responses_stream_calls(d.chunks(raw))
        check_calls(record, turn)
        check_counts(record, turn)

    @PROPERTY
    @given(delivered(responses_stream))
    def test_llama_server_shape_reads_as_the_indexed_one(
        self, case: tuple[Turn, Stream, Delivery]
    ) -> None:
        """llama-server's own shape (no output_index, content_index, sequence_number) gives
        the same times, and the calls the SDK assembles from the indexed rendering of the
        same turn."""
        turn, stream, d = case
        record, calls = relay(RESPONSES, responses_request(turn, stream=True), stream.raw, d)
        check_times(record, stream, d)
        indexed = responses_stream(turn, indexed=True).raw
        assert calls == sdk.responses_stream_calls([indexed])
        check_calls(record, turn)
        check_counts(record, turn)

    @PROPERTY
    @given(turns(), st.data())
    def test_body_calls_agree_with_the_sdk(self, turn: Turn, data: st.DataObject) -> None:
        """A whole Responses body in any chunks: the calls are the openai client's parse of
        it, and a body has no ttft."""
        body = responses_body(turn)
        d = data.draw(deliveries(len(body)))
        record, calls = relay(RESPONSES, responses_request(turn, stream=False), body, d, sse=False)
        assert calls == sdk.responses_body_calls(body)
        check_calls(record, turn)
        check_counts(record, turn)
        assert record.ttft_ms is None


def parsed(observed: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    """(name, parsed arguments) of each call."""
    return [(name, json.loads(arguments)) for name, arguments in observed]


class TestMessages:
    @PROPERTY
    @given(delivered(messages_stream))
    def test_stream_times_and_calls_agree_with_the_sdk(
        self, case: tuple[Turn, Stream, Delivery]
    ) -> None:
        """Any Messages stream, in any chunks at any times: ttft at the first token event,
        and the calls (names, arguments) those the anthropic SDK's accumulate_event
        assembles (its ``input`` is the parse of the fragments the tracker joins)."""
        turn, stream, d = case
        raw = stream.raw
        record, calls = relay(MESSAGES, messages_request(turn, stream=True), raw, d)
        check_times(record, stream, d)
        assert parsed(calls) == sdk.messages_stream_calls(d.chunks(raw))
        check_calls(record, turn)
        check_counts(record, turn)

    @PROPERTY
    @given(turns(), st.data())
    def test_body_calls_agree_with_the_sdk(self, turn: Turn, data: st.DataObject) -> None:
        """A whole Messages body in any chunks: the calls (arguments re-serialised from
        ``input``) are anthropic's Message's, and a body has no ttft."""
        body = messages_body(turn)
        d = data.draw(deliveries(len(body)))
        record, calls = relay(MESSAGES, messages_request(turn, stream=False), body, d, sse=False)
        assert parsed(calls) == sdk.messages_body_calls(body)
        check_calls(record, turn)
        check_counts(record, turn)
        assert record.ttft_ms is None


class TestCompletions:
    @PROPERTY
    @given(completions(), st.data())
    def test_stream_times_and_token_count(self, c: Completion, data: st.DataObject) -> None:
        """Any native or legacy completion stream, in any chunks at any times: ttft between
        ttfb and e2e at the first non-empty piece, one token event per non-empty piece, and
        no tool call."""
        stream = completion_stream(c)
        d = data.draw(deliveries(len(stream.raw)))
        path = "/completion" if c.native else "/v1/completions"
        request = {"prompt": "Hello", "n_predict": 8, "stream": True}
        record, calls = relay(path, request, stream.raw, d)
        check_times(record, stream, d)
        assert record.token_events == sum(1 for p in c.pieces if p)
        assert record.tool_calls == 0
        check_counts(record, c.turn)
        assert calls == []


# --------------------------------------------------------------------------------------------
# Streams no dialect recognises

UNKNOWN_TEXT = TEXT | st.sampled_from(
    [
        '"content":"a"',
        '"type":"response.output_text.delta"',
        '"text_delta","text":"a"',
        '"tool_calls":[{"index":0}]',
        "data: x\n\n",
    ]
)
UNKNOWN_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | UNKNOWN_TEXT
    | st.lists(UNKNOWN_TEXT, max_size=2)
)


@st.composite
def unknown_event(draw: st.DrawFn) -> bytes:
    """An event of a type no dialect knows (named by an ``event:`` line or not), with keys
    no dialect reads; or data that is no JSON object; or a ping."""
    kind = draw(st.none() | st.from_regex(r"x\.[a-z_.]{1,10}", fullmatch=True))
    keys = st.from_regex(r"x_[a-z]{1,6}", fullmatch=True)
    obj: dict[str, Any] = draw(st.dictionaries(keys, UNKNOWN_VALUES, min_size=1, max_size=4))
    if kind is not None:
        obj = {"type": kind, **obj}
    other = [b"data: x\n\n", b"data: [1, 2]\n\n", b"data: \n\n", PING]
    return draw(st.just(sse_json(obj, kind)) | st.sampled_from(other))


PATHS = pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES, "/completion"])


@st.composite
def unknown_streams(draw: st.DrawFn) -> tuple[bytes, Delivery]:
    raw = b"".join(draw(st.lists(unknown_event(), min_size=1, max_size=8)))
    return raw, draw(deliveries(len(raw)))


def unknown_record(path: str, case: tuple[bytes, Delivery]) -> Record:
    raw, d = case
    return relay(path, {"model": MODEL, "stream": True, "max_tokens": 48}, raw, d)[0]


class TestUnrecognisedStreams:
    @PATHS
    @PER_PATH
    @given(unknown_streams())
    def test_no_token_time(self, path: str, case: tuple[bytes, Delivery]) -> None:
        """A stream of events the dialect does not recognise (unknown types and keys, whose
        strings quote the dialects' own keys) has no ttft and no decode wall time."""
        record = unknown_record(path, case)
        assert record.ttfb_ms is not None
        assert record.ttft_ms is None
        assert record.decode_wall_ms is None

    @PATHS
    @given(unknown_streams())
    def test_token_events_stay_null(self, path: str, case: tuple[bytes, Delivery]) -> None:
        """Such a stream leaves token_events and tool_calls null: nothing in it was
        understood, so the counts are unknown, not zero."""
        record = unknown_record(path, case)
        assert (record.token_events, record.tool_calls) == (None, None)
