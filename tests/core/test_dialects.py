"""Tests for proxy.core.dialects: one module per API, chosen once per request from its path."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from proxy.core.dialects import CHAT_COMPLETIONS, DIALECTS, REASONING, dialect_for
from proxy.core.record import ServerTimings
from proxy.core.request import analyse_request
from proxy.core.tracker import StreamTracker
from tests.fakes import sse_frame


def sse(*payloads: bytes) -> bytes:
    """The payloads as consecutive unnamed SSE events."""
    return b"".join(sse_frame(p) for p in payloads)


class TestChoice:
    def test_chat_completions_path(self) -> None:
        """/v1/chat/completions (with or without a trailing slash) is Chat Completions."""
        assert dialect_for("/v1/chat/completions") is CHAT_COMPLETIONS
        assert CHAT_COMPLETIONS.handles("/chat/completions/")

    def test_every_dialect_has_a_distinct_name(self) -> None:
        """Dialect names are unique: they name the room a response was read in."""
        names = [d.name for d in DIALECTS]
        assert len(names) == len(set(names))

    def test_the_request_carries_its_dialect(self) -> None:
        """analyse_request records the dialect the tracker must read the response with."""
        facts = analyse_request("POST", "/v1/chat/completions", b'{"model":"m"}')
        assert facts.dialect is CHAT_COMPLETIONS


class TestChatCompletions:
    def test_tool_names_from_function_entries(self) -> None:
        """Tool names come from tools[].function.name; malformed entries are skipped."""
        tools = [{"type": "function", "function": {"name": "a"}}, {"function": {}}, 3]
        assert CHAT_COMPLETIONS.tool_names(tools) == frozenset({"a"})
        assert CHAT_COMPLETIONS.tool_names(None) == frozenset()

    def test_stream_fragments(self) -> None:
        """A delta's tool_calls become (index, name, arguments) fragments; an empty list is
        no tool-call event, a list of unreadable items still is one."""
        read = CHAT_COMPLETIONS.tool_reader()
        call = {"index": 1, "function": {"name": "go", "arguments": "{"}}
        assert read({"choices": [{"delta": {"tool_calls": [call]}}]}) == [(1, "go", "{")]
        assert read({"choices": [{"delta": {"tool_calls": []}}]}) is None
        assert read({"choices": [{"delta": {"tool_calls": [7]}}]}) == []

    def test_body_calls_take_their_position_as_index(self) -> None:
        """In a whole body, a call without an index is numbered by its position."""
        body = {"choices": [{"message": {"tool_calls": [{"function": {"name": "x"}}] * 2}}]}
        assert CHAT_COMPLETIONS.body_tool_calls(body) == [(0, "x", None), (1, "x", None)]


def test_the_tracker_reads_with_the_dialect_it_is_given() -> None:
    """A dialect whose token key is ``piece`` makes the tracker count ``piece`` events as
    tokens and no longer ``content`` events: the tracker holds no API's keys itself."""
    other = dataclasses.replace(CHAT_COMPLETIONS, name="other", token=re.compile(rb'"piece":"'))
    body = sse(b'{"piece":"a"}', b'{"piece":"b"}', b'{"content":"c"}')
    default = StreamTracker(0.0, sse=True, clock=lambda: 1.0)
    custom = StreamTracker(0.0, sse=True, clock=lambda: 1.0, dialect=other)
    default.feed(body)
    custom.feed(body)
    assert default.finish().token_events == 1
    assert custom.finish().token_events == 2


def test_usage_counts_from_several_events_are_joined() -> None:
    """A dialect that states the prompt counts at the start and the output count at the end
    (as Anthropic Messages does) gets all three in the observation; a later count wins."""

    def usage(obj: dict[str, Any]) -> ServerTimings | None:
        u = obj.get("u")
        return ServerTimings(**u) if isinstance(u, dict) else None

    start = re.compile(rb'"u"')
    other = dataclasses.replace(CHAT_COMPLETIONS, interesting=start, usage=usage)
    tracker = StreamTracker(0.0, sse=True, clock=lambda: 1.0, dialect=other)
    tracker.feed(
        sse(
            b'{"u":{"prompt_n":5,"cache_n":216,"predicted_n":0}}',
            b'{"content":"x"}',
            b'{"u":{"predicted_n":64}}',
        )
    )
    assert tracker.finish().timings == ServerTimings(prompt_n=5, cache_n=216, predicted_n=64)


def test_the_end_of_a_stream_is_the_dialects() -> None:
    """``[DONE]`` ends a Chat Completions stream; a dialect without it never reads it as
    the end."""
    body = sse(b'{"content":"a"}', b"[DONE]")
    chat = StreamTracker(0.0, sse=True, clock=lambda: 1.0)
    other = StreamTracker(
        0.0,
        sse=True,
        clock=lambda: 1.0,
        dialect=dataclasses.replace(CHAT_COMPLETIONS, end_data=None),
    )
    chat.feed(body)
    other.feed(body)
    assert chat.finish().done and not other.finish().done


def test_a_parsed_event_can_end_the_stream() -> None:
    """A dialect without an end marker names its last event (here ``{"stop": true}``);
    the tracker is done once it has read it, and not before."""
    other = dataclasses.replace(
        CHAT_COMPLETIONS,
        end_data=None,
        interesting=re.compile(rb'"stop"'),
        ends=lambda obj: obj.get("stop") is True,
    )
    tracker = StreamTracker(0.0, sse=True, clock=lambda: 1.0, dialect=other)
    tracker.feed(sse(b'{"content":"a","stop":false}'))
    assert not tracker.done
    tracker.feed(sse(b'{"content":"","stop":true}'))
    assert tracker.done


def test_a_token_pattern_has_no_group_but_the_reasoning_one() -> None:
    """The tracker tells reasoning from text by the token match's ``lastgroup``: each
    dialect's token pattern has no group but :data:`REASONING`, which every API with
    reasoning has (the completion endpoints have none)."""
    for dialect in DIALECTS:
        named = set(dialect.token.groupindex)
        assert dialect.token.groups == len(named), dialect.name
        expected = {REASONING} if dialect.reasoning_text is not None else set()
        assert named == expected, dialect.name
