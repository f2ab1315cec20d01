"""Chat Completions: ``choices[].delta`` in streamed events, ``choices[].message`` in a body.

It is also the reading of a path no dialect claims (``/v1/embeddings``, say): its keys are
not found in bodies of another shape, so such responses stay unanalysed.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.core.dialects.base import PLACEHOLDER_TURN, Dialect, ImagePart, ToolDelta, stateless
from proxy.core.record import ServerTimings, valid_count

__all__ = ["CHAT_COMPLETIONS"]

_SUFFIX = "/chat/completions"


def _is_chat(path: str) -> bool:
    return path.rstrip("/").endswith(_SUFFIX)


def _tool_request(method: str, path: str) -> bool:
    return method == "POST" and _is_chat(path)


def _choices(obj: dict[str, Any]) -> list[dict[str, Any]]:
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return []
    return [c for c in choices if isinstance(c, dict)]


def _finish_reasons(obj: dict[str, Any]) -> list[str]:
    return [r for c in _choices(obj) if isinstance(r := c.get("finish_reason"), str)]


def _fragments(deltas: list[Any]) -> list[ToolDelta]:
    out: list[ToolDelta] = []
    for d in deltas:
        if not isinstance(d, dict):
            continue
        idx = d.get("index", 0)
        fn = d.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        out.append(
            (
                idx if isinstance(idx, int) and not isinstance(idx, bool) else 0,
                name if isinstance(name, str) and name else None,
                args if isinstance(args, str) else None,
            )
        )
    return out


def _stream_tool_deltas(obj: dict[str, Any]) -> list[ToolDelta] | None:
    """``choices[].delta.tool_calls``: a non-empty list is a tool-call event, even when none
    of its items is readable."""
    found: list[ToolDelta] | None = None
    for choice in _choices(obj):
        delta = choice.get("delta")
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if isinstance(calls, list) and calls:
            found = (found or []) + _fragments(calls)
    return found


def _body_tool_calls(obj: dict[str, Any]) -> list[ToolDelta] | None:
    """``choices[].message.tool_calls``; a call's position is its index unless it names one."""
    found: list[ToolDelta] | None = None
    for choice in _choices(obj):
        message = choice.get("message")
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            continue
        indexed = [{"index": i, **c} for i, c in enumerate(calls) if isinstance(c, dict)]
        if indexed:
            found = (found or []) + _fragments(indexed)
    return found


def _usage(obj: dict[str, Any]) -> ServerTimings | None:
    """``usage.prompt_tokens`` less ``prompt_tokens_details.cached_tokens``, the cached ones
    and ``completion_tokens``; None unless both prompt counts are known and consistent."""
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = valid_count(details.get("cached_tokens") if isinstance(details, dict) else None)
    prompt = valid_count(usage.get("prompt_tokens"))
    if prompt is None or cached is None or cached > prompt:
        return None
    return ServerTimings(
        prompt_n=prompt - cached,
        cache_n=cached,
        predicted_n=valid_count(usage.get("completion_tokens")),
    )


def _tool_names(tools: Any) -> frozenset[str]:
    """``tools[].function.name``."""
    if not isinstance(tools, list):
        return frozenset()
    names = set()
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


def _system_turn(body: dict[str, Any]) -> dict[str, Any]:
    """The body with its leading system (or developer) messages and a placeholder turn."""
    messages = body.get("messages")
    leading: list[Any] = []
    for message in messages if isinstance(messages, list) else ():
        if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
            break
        leading.append(message)
    return {**body, "messages": [*leading, PLACEHOLDER_TURN]}


def _image_url(part: Any) -> str | None:
    """The URL of a Chat Completions ``image_url`` content part (None: not one)."""
    if not (isinstance(part, dict) and part.get("type") == "image_url"):
        return None
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    return url if isinstance(url, str) else None


def _image_parts(body: dict[str, Any]) -> list[ImagePart]:
    """``image_url`` parts of every message's ``content`` list, in order."""
    messages = body.get("messages")
    out: list[ImagePart] = []
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if (url := _image_url(part)) is not None:
                out.append(ImagePart(("messages", i, "content", j), url, "text"))
    return out


def _reasoning_text(obj: dict[str, Any]) -> str | None:
    """``choices[].delta.reasoning_content`` (an event) or ``.message.reasoning_content``
    (a body), joined."""
    choices = obj.get("choices")
    parts = []
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        for key in ("delta", "message"):
            inner = choice.get(key)
            text = inner.get("reasoning_content") if isinstance(inner, dict) else None
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts) if parts else None


CHAT_COMPLETIONS = Dialect(
    name="chat_completions",
    handles=_is_chat,
    # llama-server writes compact JSON, in which a key cannot occur unescaped in a string
    token=re.compile(rb'"(?:(?P<reasoning>reasoning_content)|content|text)": ?"[^"]'),
    # one leading quote for every branch: the search tries the branches only at a quote
    interesting=re.compile(rb'"(?:timings"|usage"|tool_calls"|error"|finish_reason": ?")'),
    finish_reasons=_finish_reasons,
    tool_reader=stateless(_stream_tool_deltas),
    body_tool_calls=_body_tool_calls,
    tool_names=_tool_names,
    tool_request=_tool_request,
    usage=_usage,
    end_data=b"[DONE]",
    count_path="/v1/chat/completions/input_tokens",
    system_turn=_system_turn,
    chat_form=lambda turn: turn,
    image_parts=_image_parts,
    reasoning_text=_reasoning_text,
)
