"""The Chat Completions form of a corpus request, as llama-server's own converters make it
(``tools/server/server-chat.cpp`` of the provisioned sdist: Responses ``instructions`` and
input items, Messages ``system`` and blocks), written from that code for the shapes the
corpus holds, not from the proxy's dialects."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["chat_form"]


def _text_parts(content: Any) -> Any:
    """Responses ``input_text``/``output_text`` parts as chat ``text`` parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": part["text"]} for part in content]


def _from_responses(body: dict[str, Any]) -> dict[str, Any]:
    """What ``server_chat_convert_responses_to_chatcmpl`` makes of the items in this corpus:
    messages, ``function_call`` (joined to an assistant message just before it) and
    ``function_call_output``."""
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "tools")}
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": body["instructions"] or ""})
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items:
        after_answer = bool(messages) and messages[-1]["role"] == "assistant"
        kind = item.get("type")
        if kind == "function_call":
            call = {
                "function": {"arguments": item["arguments"], "name": item["name"]},
                "id": item["call_id"],
                "type": "function",
            }
            if after_answer:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"content": item["output"], "role": "tool", "tool_call_id": item["call_id"]}
            )
        elif item.get("role") == "assistant":
            if after_answer:
                messages[-1].setdefault("content", []).extend(_text_parts(item["content"]))
            else:
                messages.append({"role": "assistant", "content": _text_parts(item["content"])})
        else:
            messages.append({"role": item["role"], "content": _text_parts(item["content"])})
    chat["messages"] = messages
    tools = [
        {
            "type": "function",
            "function": {"strict": True, **{k: v for k, v in t.items() if k != "type"}},
        }
        for t in body.get("tools", [])
        if t.get("type") == "function"
    ]
    if tools:
        chat["tools"] = tools
    return chat


def _from_messages(body: dict[str, Any]) -> dict[str, Any]:
    """What ``server_chat_convert_anthropic_to_oai`` makes of the blocks in this corpus:
    ``system``, text, ``tool_use`` (arguments: the input's JSON as nlohmann dumps it, keys
    sorted, compact) and ``tool_result`` (a tool message after the message's own)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(b["text"] for b in system if b.get("type") == "text")
    if system is not None:
        messages.append({"role": "system", "content": system})
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            messages.append(message)
            continue
        texts = [b for b in content if b["type"] == "text"]
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {
                    "name": b["name"],
                    "arguments": json.dumps(b["input"], separators=(",", ":"), sort_keys=True),
                },
            }
            for b in content
            if b["type"] == "tool_use"
        ]
        if texts or calls:
            chat: dict[str, Any] = {"role": message["role"], "content": texts or ""}
            if calls:
                chat["tool_calls"] = calls
            messages.append(chat)
        messages += [
            {"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]}
            for b in content
            if b["type"] == "tool_result"
        ]
    chat_body: dict[str, Any] = {"messages": messages}
    if "tools" in body:
        chat_body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
            for t in body["tools"]
        ]
    for key in ("chat_template_kwargs",):
        if key in body:
            chat_body[key] = body[key]
    return chat_body


def chat_form(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions body llama-server renders for a request to ``path``."""
    if path.endswith("/responses"):
        return _from_responses(body)
    if path.endswith("/messages"):
        return _from_messages(body)
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
