"""Anthropic Messages (``POST /v1/messages``): content blocks in events and in a body.

A stream is ``event: <name>`` + ``data: {...}`` pairs whose ``type`` repeats the name, with
no ``[DONE]``: ``message_start`` (the prompt counts in ``message.usage``),
``content_block_start`` (a ``thinking``, ``text`` or ``tool_use`` block; the last names a
call), ``content_block_delta`` (``thinking_delta``, ``text_delta``, or ``input_json_delta``:
an argument fragment of the block's call), ``content_block_stop``, ``message_delta``
(``stop_reason`` and ``usage.output_tokens``) and ``message_stop``. A body has ``content[]``
blocks, ``stop_reason`` and ``usage``. llama-server sends no ``timings`` on this API, so the
server's prefill and decode times stay unknown.

The counts: ``usage.input_tokens`` is already the uncached part of the prompt and
``cache_read_input_tokens`` the cached part. The ``output_tokens: 0`` of ``message_start``
is a placeholder, not a count, so it is not read: a stream cut off before ``message_delta``
has an unknown output count, not zero.

A streamed call is keyed by its content block's ``index`` (thinking, then text, then one
block per call): the index of a call's ``content_block_start`` and of its ``input_json_delta``
fragments. Readers see one event at a time, so a call after a text block keeps that block
index (1, 2, ...) rather than a call number; the calls' order is the same. A body's calls are
numbered 0, 1, 2 in order. A body's ``tool_use`` blocks carry ``input`` as parsed JSON, so
their arguments are re-serialised (compact JSON of ``input``), not the model's own text: their
length can differ from the same call's streamed fragments, and arguments llama-server could
not parse come back as ``{}``. A call cut by ``max_tokens`` inside its arguments is such a
``{}``: a body whose ``stop_reason`` is ``max_tokens`` and whose last call's ``input`` is
``{}`` shows its last call cut (:func:`_body_call_cut`), as the same stream's fragments do.

The request side (system turn, images, the Chat Completions form) is
:mod:`proxy.core.dialects.messages_form`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.core.dialects.base import Dialect, ToolDelta, stateless, top_level_error
from proxy.core.dialects.messages_form import chat_form, image_parts, system_turn
from proxy.core.record import ServerTimings, valid_count

__all__ = ["MESSAGES"]

_PATH = "/v1/messages"

_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
"""Anthropic's ``stop_reason`` in Chat Completions' words; others are not translated."""


def _is_messages(path: str) -> bool:
    return path.rstrip("/").endswith(_PATH)


def _tool_request(method: str, path: str) -> bool:
    return method == "POST" and _is_messages(path)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _index(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _finish_reasons(obj: dict[str, Any]) -> list[str]:
    """``message_delta``'s ``delta.stop_reason``, or a body's ``stop_reason``."""
    if obj.get("type") == "message_delta":
        reason = _dict(obj.get("delta")).get("stop_reason")
    else:
        reason = obj.get("stop_reason")
    mapped = _STOP_REASONS.get(reason) if isinstance(reason, str) else None
    return [mapped] if mapped is not None else []


def _stream_tool_deltas(obj: dict[str, Any]) -> list[ToolDelta] | None:
    """A ``tool_use`` block's start (its name) or an ``input_json_delta`` (an argument
    fragment), keyed by the block index; any other event carries no call."""
    kind = obj.get("type")
    if kind == "content_block_start":
        block = _dict(obj.get("content_block"))
        if block.get("type") != "tool_use":
            return None
        name = block.get("name")
        return [(_index(obj.get("index")), name if isinstance(name, str) and name else None, None)]
    if kind == "content_block_delta":
        delta = _dict(obj.get("delta"))
        if delta.get("type") != "input_json_delta":
            return None
        part = delta.get("partial_json")
        return [(_index(obj.get("index")), None, part if isinstance(part, str) else None)]
    return None


def _arguments(block: dict[str, Any]) -> str | None:
    """The compact JSON of a ``tool_use`` block's ``input`` (re-serialised), if it has one."""
    if "input" not in block:
        return None
    try:
        return orjson.dumps(block["input"]).decode()
    except orjson.JSONEncodeError:
        return None


def _body_tool_calls(obj: dict[str, Any]) -> list[ToolDelta] | None:
    """``content[]`` blocks of type ``tool_use``, numbered 0, 1, 2 in order."""
    content = obj.get("content")
    if not isinstance(content, list):
        return None
    uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    if not uses:
        return None
    out: list[ToolDelta] = []
    for i, block in enumerate(uses):
        name = block.get("name")
        out.append((i, name if isinstance(name, str) and name else None, _arguments(block)))
    return out


def _body_call_cut(obj: dict[str, Any]) -> bool:
    """A body ended by ``max_tokens`` whose last ``tool_use`` block has ``input: {}``: what
    llama-server writes for the arguments of a call the limit cut (they do not parse)."""
    if obj.get("stop_reason") != "max_tokens":
        return False
    content = obj.get("content")
    uses = [
        b
        for b in (content if isinstance(content, list) else ())
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    return bool(uses) and uses[-1].get("input") == {}


def _prompt_counts(usage: dict[str, Any]) -> tuple[int | None, int | None]:
    """(uncached, cached) prompt tokens: ``input_tokens`` (plus any
    ``cache_creation_input_tokens``, also uncached) and ``cache_read_input_tokens``."""
    uncached = valid_count(usage.get("input_tokens"))
    created = usage.get("cache_creation_input_tokens")
    if uncached is not None and created is not None:
        more = valid_count(created)
        uncached = None if more is None else uncached + more
    return uncached, valid_count(usage.get("cache_read_input_tokens"))


def _usage(obj: dict[str, Any]) -> ServerTimings | None:
    """``message_start``'s prompt counts (its ``output_tokens`` placeholder is skipped),
    ``message_delta``'s ``output_tokens``, or a body's three counts; None without ``usage``."""
    if obj.get("type") == "message_start":
        usage = _dict(obj.get("message")).get("usage")
        if not isinstance(usage, dict):
            return None
        prompt, cached = _prompt_counts(usage)
        return ServerTimings(prompt_n=prompt, cache_n=cached)
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, cached = _prompt_counts(usage)
    return ServerTimings(
        prompt_n=prompt, cache_n=cached, predicted_n=valid_count(usage.get("output_tokens"))
    )


def _tool_names(tools: Any) -> frozenset[str]:
    """``tools[].name`` (client tools ``{name, description, input_schema}`` and server tools
    alike: llama-server renders both as functions)."""
    if not isinstance(tools, list):
        return frozenset()
    return frozenset(
        name
        for tool in tools
        if isinstance(tool, dict) and isinstance(name := tool.get("name"), str)
    )


def _ends(obj: dict[str, Any]) -> bool:
    """``message_stop``: the last event of a complete stream."""
    return obj.get("type") == "message_stop"


def _model(obj: dict[str, Any]) -> str | None:
    """``model`` of a body, or of the ``message`` that ``message_start`` carries."""
    message = obj.get("message")
    model = (message if isinstance(message, dict) else obj).get("model")
    return model if isinstance(model, str) else None


def _response_id(obj: dict[str, Any]) -> str | None:
    """``id`` of a body, or of the ``message`` that ``message_start`` carries."""
    message = obj.get("message")
    found = (message if isinstance(message, dict) else obj).get("id")
    return found if isinstance(found, str) else None


def _error(obj: dict[str, Any]) -> str | None:
    """A mid-stream ``event: error`` (unwrapped ``{"code", "message", "type"}``) or an HTTP
    error body (``{"error": {...}}``), as ``type:code``."""
    if "code" in obj and "message" in obj and isinstance(obj.get("type"), str):
        return f"{obj['type']}:{obj['code']}"
    return top_level_error(obj)


def _thinking_text(obj: dict[str, Any]) -> str | None:
    """A ``thinking_delta``'s text (an event), or the ``thinking`` blocks' text (a body)."""
    delta = obj.get("delta")
    if isinstance(delta, dict) and delta.get("type") == "thinking_delta":
        text = delta.get("thinking")
        return text if isinstance(text, str) else None
    content = obj.get("content")
    parts = [
        block["thinking"]
        for block in (content if isinstance(content, list) else ())
        if isinstance(block, dict)
        and block.get("type") == "thinking"
        and isinstance(block.get("thinking"), str)
    ]
    return "".join(parts) if parts else None


MESSAGES = Dialect(
    name="messages",
    handles=_is_messages,
    # compact JSON: these keys cannot occur unescaped inside a string; empty deltas are no token
    token=re.compile(
        rb'"(?:text_delta", ?"text|(?P<reasoning>thinking_delta", ?"thinking))": ?"[^"]'
    ),
    interesting=re.compile(
        rb'"(?:(?:usage|stop_reason|error|code)":|(?:tool_use|input_json_delta|message_stop)")'
    ),
    finish_reasons=_finish_reasons,
    tool_reader=stateless(_stream_tool_deltas),
    body_tool_calls=_body_tool_calls,
    body_call_cut=_body_call_cut,
    tool_names=_tool_names,
    tool_request=_tool_request,
    usage=_usage,
    end_data=None,
    ends=_ends,
    model=_model,
    response_id=_response_id,
    error=_error,
    count_path="/v1/messages/count_tokens",
    system_turn=system_turn,
    chat_form=chat_form,
    image_parts=image_parts,
    reasoning_text=_thinking_text,
)
