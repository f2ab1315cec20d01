"""Where prompt-cache diagnostics are asked for and where the answer goes, per API. Pure.

A Messages request asks with ``diagnostics: {"previous_message_id": ID}``, a Responses
request with ``prompt_cache_options: {"comparison_response_id": ID}`` (the shapes of the
``anthropic`` and ``openai`` SDKs). The answer (:mod:`proxy.core.diagnostics`) goes into the
response the API defines for it: Messages' ``diagnostics`` in the body, or in the
``message`` of a stream's ``message_start``; Responses' ``prompt_cache_diagnostics`` in the
body, or in the ``response`` of a stream's ``response.completed``. It is appended as the
object's last member; every other byte of the body or the event stays as llama-server
wrote it.
"""

from __future__ import annotations

import json
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
    "answer",
    "asked",
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
    event: bytes
    inner: str


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
}

ANCHOR_EVENTS = {api: where.event for api, where in _WHERE.items()}
"""The first bytes of the stream event each API's answer goes into."""


@dataclass(frozen=True, slots=True)
class Asked:
    """A request that asks for prompt-cache diagnostics: its API, and the response it names
    (None: the agent opts in with no earlier response to compare, as on a first turn)."""

    api: str
    previous: str | None


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
    return Asked(facts.api, previous if isinstance(previous, str) and previous else None)


def answer(api: str, diagnosis: Diagnosis | None) -> tuple[str, Any]:
    """The answer's field and value (None: nothing to compare with: JSON null). A diagnosis
    that could not be made in time is ``unavailable``."""
    where = _WHERE[api]
    if diagnosis is None:
        return where.field, None
    if api == "messages":
        return where.field, anthropic_diagnostics(diagnosis)
    return where.field, openai_diagnostics(diagnosis)


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
    in its data's inner object; as it is when its data is not the expected JSON."""
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
