"""A Responses API request as llama-server reads it. Pure.

What the schema accounting and the image accounting need of a request: the request cut to
its system turn, its ``input_image`` parts in the order the rendered prompt holds them, and
the Chat Completions body llama-server's converter makes of it (``/apply-template`` takes
only that form).
"""

from __future__ import annotations

from typing import Any

from proxy.core.dialects.base import PLACEHOLDER_TURN, ImagePart, chat_image_part

__all__ = ["chat_form", "image_parts", "system_turn"]


def system_turn(body: dict[str, Any]) -> dict[str, Any]:
    """The body with ``input`` cut to its leading system/developer messages and a placeholder
    turn (``instructions`` stays: it becomes the first system message)."""
    items = body.get("input")
    leading: list[Any] = []
    for item in items if isinstance(items, list) else ():
        if not (
            isinstance(item, dict)
            and item.get("role") in ("system", "developer")
            and item.get("type", "message") == "message"
        ):
            break
        leading.append(item)
    return {**body, "input": [*leading, PLACEHOLDER_TURN]}


def _chat_content(content: Any) -> Any:
    """``input_text``/``output_text`` parts as chat ``text`` parts, ``input_image`` parts as
    ``image_url`` parts, in order; a string as it is."""
    if not isinstance(content, list):
        return content
    out: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") in ("input_text", "output_text"):
            out.append({"type": "text", "text": part.get("text")})
        elif (url := _image_url(part)) is not None:
            out.append(chat_image_part(url))
    return out


def _image_url(part: Any) -> str | None:
    """The ``image_url`` of an ``input_image`` part (None: not one)."""
    if not (isinstance(part, dict) and part.get("type") == "input_image"):
        return None
    url = part.get("image_url")
    return url if isinstance(url, str) else None


def _image_lists(items: list[Any]) -> list[tuple[int, str]]:
    """The input items' part lists that can hold images: (item index, key)."""
    out: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in ("user", "system", "developer"):
            out.append((i, "content"))
        elif kind == "function_call_output":
            out.append((i, "output"))
    return out


def image_parts(body: dict[str, Any]) -> list[ImagePart]:
    """``input_image`` parts of the input messages and of function call outputs, in order."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    out: list[ImagePart] = []
    for i, key in _image_lists(items):
        parts = items[i].get(key)
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if (url := _image_url(part)) is not None:
                out.append(ImagePart(("input", i, key, j), url, "input_text"))
    return out


def _chat_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages: messages as they are, a ``function_call`` joined to the
    assistant message before it (or opening one), a ``function_call_output`` a tool
    message. Other items (reasoning) are left out: a form that then counts otherwise than
    llama-server's is not trusted by its users."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(
                {"role": item.get("role"), "content": _chat_content(item.get("content"))}
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            if not (messages and messages[-1].get("role") == "assistant"):
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _chat_content(output) if isinstance(output, list) else output,
                }
            )
    return messages


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A flat function tool as llama-server nests it, ``strict`` true unless given."""
    function = {k: v for k, v in tool.items() if k != "type"}
    function.setdefault("strict", True)
    return {"type": "function", "function": function}


def chat_form(turn: dict[str, Any]) -> dict[str, Any]:
    """What llama-server's converter makes of a request (or its system turn):
    ``instructions`` then the input items as chat messages, flat function tools nested
    (other tool types dropped), a string ``tool_choice`` kept (other forms act as ``auto``)."""
    messages: list[Any] = []
    if isinstance(instructions := turn.get("instructions"), str):
        messages.append({"role": "system", "content": instructions})
    items = turn.get("input")
    if isinstance(items, str):  # one user message
        items = [{"role": "user", "content": items}]
    messages += _chat_messages(items if isinstance(items, list) else [])
    out: dict[str, Any] = {
        k: turn[k] for k in ("model", "parallel_tool_calls", "chat_template_kwargs") if k in turn
    }
    tools = turn.get("tools")
    if isinstance(tools, list):
        out["tools"] = [
            _chat_tool(t) for t in tools if isinstance(t, dict) and t.get("type") == "function"
        ]
    if isinstance(choice := turn.get("tool_choice"), str):
        out["tool_choice"] = choice
    return {**out, "messages": messages}
