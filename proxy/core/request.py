"""What the proxy reads of a request body: kind, model, stream flag and tool names. Pure.

The body is forwarded unchanged whatever this finds; a body that is not a JSON object is
simply not analysed, and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.record import Kind

__all__ = ["RequestFacts", "analyse_request"]

_CHAT_SUFFIX = "/chat/completions"


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The facts of one request body; ``body`` is the parsed object for accounting."""

    kind: Kind
    model: str | None = None
    stream: bool | None = None
    tool_names: frozenset[str] = frozenset()
    body: dict[str, Any] | None = None
    error: str | None = None


def analyse_request(method: str, path: str, body: bytes) -> RequestFacts:
    """Classify a request: ``tool`` (chat with a non-empty ``tools``), ``chat`` or ``other``."""
    is_chat = method == "POST" and path.rstrip("/").endswith(_CHAT_SUFFIX)
    if method != "POST" or not body:
        return RequestFacts(kind=Kind.CHAT if is_chat else Kind.OTHER)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return RequestFacts(
            kind=Kind.CHAT if is_chat else Kind.OTHER, error="request_body_not_json"
        )
    if not isinstance(obj, dict):
        return RequestFacts(
            kind=Kind.CHAT if is_chat else Kind.OTHER, error="request_body_not_an_object"
        )
    model = obj.get("model")
    stream = obj.get("stream")
    tools = obj.get("tools")
    names: set[str] = set()
    if isinstance(tools, list):
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if isinstance(name, str):
                names.add(name)
    kind = Kind.OTHER
    if is_chat:
        kind = Kind.TOOL if isinstance(tools, list) and tools else Kind.CHAT
    return RequestFacts(
        kind=kind,
        model=model if isinstance(model, str) else None,
        stream=stream if isinstance(stream, bool) else False,
        tool_names=frozenset(names),
        body=obj,
    )
