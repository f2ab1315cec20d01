"""Where prompt-cache diagnostics are asked for and where the answer goes, per API. Pure.

A Messages request asks with ``diagnostics: {"previous_message_id": ID}``, a Responses
request with ``prompt_cache_options: {"comparison_response_id": ID}`` (the shapes of the
``anthropic`` and ``openai`` SDKs); a Chat Completions request with the Responses option
(no standard: langchain4j's OpenAI client sends it there). The answer
(:mod:`proxy.core.diagnostics`) goes into the response the API defines for it: Messages'
``diagnostics`` in the body, or in the ``message`` of a stream's ``message_start``;
Responses' ``prompt_cache_diagnostics`` in the body, or in the ``response`` of a stream's
``response.completed``; Chat Completions' ``prompt_cache_diagnostics`` in the body, or in
the chunk that carries the counts (:class:`ChatSplitter`). It is appended as the object's
last member; every other byte of the body or the event stays as llama-server wrote it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.diagnostics import (
    UNAVAILABLE,
    Diagnosis,
    anthropic_diagnostics,
    openai_diagnostics,
)
from proxy.core.request import RequestFacts

__all__ = [
    "ANCHOR_EVENTS",
    "UNAVAILABLE_DIAGNOSIS",
    "Asked",
    "ChatSplitter",
    "answer",
    "asked",
    "chat_anchor",
    "with_member",
    "with_member_in_event",
]


@dataclass(frozen=True, slots=True)
class Where:
    """One API's request option and answer: the option (``option.key``), the answer's field,
    the stream event that carries it and the object in that event it goes into."""

    option: str
    key: str
    field: str
    event: bytes | None
    """None: no named event (Chat Completions: :class:`ChatSplitter` finds the chunk)."""
    inner: str | None
    """None: the member goes at the event data's top level."""


_WHERE = {
    "messages": Where(
        "diagnostics", "previous_message_id", "diagnostics", b"event: message_start\n", "message"
    ),
    "responses": Where(
        "prompt_cache_options",
        "comparison_response_id",
        "prompt_cache_diagnostics",
        b"event: response.completed\n",
        "response",
    ),
    "chat_completions": Where(
        "prompt_cache_options", "comparison_response_id", "prompt_cache_diagnostics", None, None
    ),
}

ANCHOR_EVENTS = {api: where.event for api, where in _WHERE.items() if where.event is not None}
"""The first bytes of the stream event each API's answer goes into."""


@dataclass(frozen=True, slots=True)
class Asked:
    """A request that asks for prompt-cache diagnostics: its API, and the response it names
    (None: the agent opts in with no earlier response to compare, as on a first turn)."""

    api: str
    previous: str | None
    usage_chunk: bool = False
    """A Chat Completions stream that asked ``stream_options.include_usage``: the answer goes
    in the usage chunk, not in the chunk with the ``finish_reason``."""


def asked(facts: RequestFacts) -> Asked | None:
    """What the request asks, or None when it asks nothing (it then stays untouched)."""
    where = _WHERE.get(facts.api)
    body = facts.body
    if where is None or body is None:
        return None
    option = body.get(where.option)
    if not isinstance(option, dict) or where.key not in option:
        return None
    previous = option[where.key]
    stream_options = body.get("stream_options")
    usage_chunk = (
        facts.api == "chat_completions"
        and isinstance(stream_options, dict)
        and stream_options.get("include_usage") is True
    )
    named = previous if isinstance(previous, str) and previous else None
    return Asked(facts.api, named, usage_chunk)


def answer(api: str, diagnosis: Diagnosis | None) -> tuple[str, Any]:
    """The answer's field and value (None: nothing to compare with: JSON null). A diagnosis
    that could not be made in time is ``unavailable``."""
    where = _WHERE[api]
    if diagnosis is None:
        return where.field, None
    if api == "messages":
        return where.field, anthropic_diagnostics(diagnosis)
    return where.field, openai_diagnostics(diagnosis)  # Responses and Chat Completions


UNAVAILABLE_DIAGNOSIS = Diagnosis(UNAVAILABLE)


def _members(text: str, start: int) -> dict[str, tuple[int, int]]:
    """The members of the JSON object at ``text[start]``: each key's value span."""
    decode = json.JSONDecoder().raw_decode
    spans: dict[str, tuple[int, int]] = {}
    at = _skip(text, start + 1)
    if text[at] == "}":
        return spans
    while True:
        key, at = decode(text, at)
        at = _skip(text, at)
        if text[at] != ":":
            raise ValueError("no colon after a key")
        begin = _skip(text, at + 1)
        _, at = decode(text, begin)
        spans[str(key)] = (begin, at)
        at = _skip(text, at)
        if text[at] == "}":
            return spans
        at = _skip(text, at + 1)


def _skip(text: str, at: int) -> int:
    while text[at] in " \t\r\n":
        at += 1
    return at


def _appended(text: str, span: tuple[int, int], key: str, value: Any) -> str:
    """``text`` with ``key: value`` the last member of the object at ``span``."""
    begin, end = span
    close = text.rindex("}", begin, end)
    empty = text[begin + 1 : close].strip() == ""
    member = ("" if empty else ",") + json.dumps(key) + ":" + orjson.dumps(value).decode()
    return text[:close] + member + text[close:]


def with_member(body: bytes, key: str, value: Any, inner: str | None = None) -> bytes | None:
    """``body`` (one JSON object) with ``key: value`` appended to it, or to its member
    ``inner``; None when it is not such an object (it then goes as it is)."""
    try:
        text = body.decode()
        start = _skip(text, 0)
        if text[start] != "{":
            return None
        _, end = json.JSONDecoder().raw_decode(text, start)
        span = (start, end)
        if inner is not None:
            span = _members(text, start)[inner]
            if text[span[0]] != "{":
                return None
        return _appended(text, span, key, value).encode()
    except (ValueError, IndexError, KeyError):
        return None


def with_member_in_event(event: bytes, api: str, key: str, value: Any) -> bytes:
    """The anchor event (``event:`` and ``data:`` lines, a blank line) with ``key: value``
    in its data's inner object (Chat Completions: the data's own object); as it is when its
    data is not the expected JSON."""
    inner = _WHERE[api].inner
    lines = event.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"data:"):
            data = line[5:]
            changed = with_member(data, key, value, inner)
            if changed is not None:
                lines[i] = b"data:" + changed
            break
    return b"\n".join(lines)


_FINISH = re.compile(rb'"finish_reason" *: *"')
_USAGE = re.compile(rb'"usage" *: *\{')


def chat_anchor(data: Any, usage_chunk: bool) -> bool:
    """Whether the Chat Completions chunk ``data`` gets the answer: the usage chunk (a
    ``usage`` object) when the request asked for it, else the chunk with a ``finish_reason``
    (llama-server sends one choice, so one such chunk; it carries the ``timings``)."""
    if not isinstance(data, dict):
        return False
    if usage_chunk:
        return isinstance(data.get("usage"), dict)
    choices = data.get("choices")
    if not isinstance(choices, list):
        return False
    return any(isinstance(c, dict) and isinstance(c.get("finish_reason"), str) for c in choices)


class ChatSplitter:
    """Finds the Chat Completions chunk that gets the answer (:func:`chat_anchor`), fed the
    upstream's chunks in order; the same calls as :class:`proxy.core.annotate.Splitter`.

    Whole events go on at once; only an event not yet ended (no blank line seen) is held,
    since whether it is the one is known only from its whole data.
    """

    __slots__ = ("_held", "_usage_chunk", "found")

    def __init__(self, usage_chunk: bool) -> None:
        self._usage_chunk = usage_chunk
        self._held = b""
        self.found = False

    def split(self, chunk: bytes) -> tuple[bytes, bytes | None]:
        """``(now, None)``: write ``now``, the chunk is not in it; ``(before, rest)``:
        ``rest`` begins with the whole event that gets the answer."""
        buf = self._held + chunk if self._held else chunk
        at = 0
        while (end := buf.find(b"\n\n", at)) >= 0:
            if self._is_anchor(buf[at:end]):
                self._held, self.found = b"", True
                return buf[:at], buf[at:]
            at = end + 2
        self._held = buf[at:]
        return buf[:at], None

    def end(self) -> tuple[bytes, bool]:
        """The stream ended: the bytes still held (to write as they came)."""
        held, self._held = self._held, b""
        return held, not held

    def _is_anchor(self, event: bytes) -> bool:
        needle = _USAGE if self._usage_chunk else _FINISH
        for line in event.split(b"\n"):
            if line.startswith(b"data:") and needle.search(line):
                try:
                    return chat_anchor(orjson.loads(line[5:]), self._usage_chunk)
                except orjson.JSONDecodeError:
                    return False
        return False
