"""An Anthropic Messages request as llama-server reads it. Pure.

What the schema accounting and the image accounting need of a request: the request cut to
its system turn, its ``image`` blocks in the order the rendered prompt holds them, and the
Chat Completions body llama-server's converter makes of it (``/apply-template`` takes only
that form).
"""

from __future__ import annotations

import json
from typing import Any

from proxy.core.dialects.base import PLACEHOLDER_TURN, ImagePart, chat_image_part

__all__ = ["chat_form", "image_parts", "system_turn"]


def system_turn(body: dict[str, Any]) -> dict[str, Any]:
    """The body with a placeholder turn as its ``messages`` (``system`` is a field)."""
    return {**body, "messages": [PLACEHOLDER_TURN]}


def _system_text(system: Any) -> str | None:
    """``system`` as one string: ``text`` blocks joined with no separator."""
    if isinstance(system, list):
        return "".join(
            str(block.get("text", ""))
            for block in system
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return system if isinstance(system, str) else None


def _block_text(content: Any) -> str:
    """A ``tool_result``'s content as text: a string, or its text blocks joined."""
    if isinstance(content, list):
        return "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return content if isinstance(content, str) else ""


def _image_url(block: Any) -> str | None:
    """An ``image`` block's source as the URL llama-server makes of it: a ``base64`` source as
    a data URL (``image/jpeg`` when no media type is given), a ``url`` source as it is;
    None for any other block."""
    if not (isinstance(block, dict) and block.get("type") == "image"):
        return None
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        media_type = source.get("media_type")
        media_type = media_type if isinstance(media_type, str) else "image/jpeg"
        data = source.get("data")
        return f"data:{media_type};base64,{data if isinstance(data, str) else ''}"
    url = source.get("url")
    return url if source.get("type") == "url" and isinstance(url, str) else None


def _chat_part(block: dict[str, Any]) -> dict[str, Any] | None:
    """A ``text`` block as a chat ``text`` part, an ``image`` block as an ``image_url`` part."""
    if block.get("type") == "text":
        return {"type": "text", "text": block.get("text")}
    url = _image_url(block)
    return chat_image_part(url) if url is not None else None


def _result_content(content: Any) -> Any:
    """A ``tool_result``'s content as llama-server passes it on: text alone as one string,
    text and images as chat parts."""
    if not isinstance(content, list) or not any(_image_url(b) is not None for b in content):
        return _block_text(content)
    return [part for b in content if isinstance(b, dict) and (part := _chat_part(b)) is not None]


def image_parts(body: dict[str, Any]) -> list[ImagePart]:
    """``image`` blocks of each message, in the order llama-server converts them: those of
    its ``tool_result`` blocks first (each becomes a tool message before the rest), then its
    own."""
    messages = body.get("messages")
    out: list[ImagePart] = []
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        own: list[ImagePart] = []
        for j, block in enumerate(content):
            if (url := _image_url(block)) is not None:
                own.append(ImagePart(("messages", i, "content", j), url, "text"))
            elif isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                for k, part in enumerate(inner if isinstance(inner, list) else ()):
                    if (url := _image_url(part)) is not None:
                        path = ("messages", i, "content", j, "content", k)
                        out.append(ImagePart(path, url, "text"))
        out += own
    return out


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` block as a chat tool call (arguments: the compact JSON of ``input``)."""
    arguments = json.dumps(block.get("input", {}), separators=(",", ":"))
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


def _chat_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One message as chat messages: text and image blocks as chat parts, ``thinking`` as
    ``reasoning_content``, ``tool_use`` as tool calls, each ``tool_result`` a tool message
    of its own, before the rest."""
    content = message.get("content")
    role = message.get("role")
    if not isinstance(content, list):
        return [{"role": role, "content": content}]
    blocks = [b for b in content if isinstance(b, dict)]
    out: list[dict[str, Any]] = [
        {
            "role": "tool",
            "tool_call_id": b.get("tool_use_id"),
            "content": _result_content(b.get("content")),
        }
        for b in blocks
        if b.get("type") == "tool_result"
    ]
    texts = [part for b in blocks if (part := _chat_part(b)) is not None]
    calls = [_tool_call(b) for b in blocks if b.get("type") == "tool_use"]
    reasoning = "".join(str(b.get("thinking", "")) for b in blocks if b.get("type") == "thinking")
    if texts or calls or reasoning or not out:
        chat: dict[str, Any] = {"role": role, "content": texts or ""}
        if calls:
            chat["tool_calls"] = calls
        if reasoning:
            chat["reasoning_content"] = reasoning
        out.append(chat)
    return out


_TOOL_CHOICE = {"auto": "auto", "any": "required", "tool": "required"}


def chat_form(turn: dict[str, Any]) -> dict[str, Any]:
    """What llama-server's converter makes of a request (or its system turn): ``system`` as
    the first message, the messages' blocks as chat messages,
    each tool as a function whose parameters are its ``input_schema``, ``tool_choice``
    ``auto``/``any``/``tool`` as ``auto``/``required`` (the rest dropped)."""
    messages: list[Any] = []
    if (system := _system_text(turn.get("system"))) is not None:
        messages.append({"role": "system", "content": system})
    for message in turn.get("messages") or ():
        if isinstance(message, dict):
            messages.extend(_chat_messages(message))
    out: dict[str, Any] = {k: turn[k] for k in ("model", "chat_template_kwargs") if k in turn}
    tools = turn.get("tools")
    if isinstance(tools, list):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
            for t in tools
            if isinstance(t, dict)
        ]
    choice = turn.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in _TOOL_CHOICE:
        out["tool_choice"] = _TOOL_CHOICE[choice["type"]]
    return {**out, "messages": messages}
