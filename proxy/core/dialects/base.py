"""What a dialect provides: byte patterns matched in every event, readers for parsed JSON."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.core.record import ServerTimings

__all__ = [
    "PLACEHOLDER_TURN",
    "REASONING",
    "Dialect",
    "ImagePart",
    "StreamReader",
    "ToolDelta",
    "chat_image_part",
    "never",
    "stateless",
    "top_level_error",
    "top_level_id",
    "top_level_model",
]

REASONING = "reasoning"
"""The name of the group of :attr:`Dialect.token` that matches where an event's text is
reasoning (thinking): the pattern's only group, so the match's ``lastgroup`` says it; an
API without reasoning has none."""

PLACEHOLDER_TURN: dict[str, str] = {"role": "user", "content": "."}
"""The one user turn a :attr:`Dialect.system_turn` keeps: templates render nothing without one."""

ToolDelta = tuple[int, str | None, str | None]
"""One tool-call fragment: (call index, name or None, argument text or None)."""


StreamReader = Callable[[dict[str, Any]], "list[ToolDelta] | None"]
"""Reads the tool-call fragments of one response's events, in order: for each event, the
fragments it carries, or None when it is no tool-call event."""


@dataclass(frozen=True, slots=True)
class ImagePart:
    """One image in a request body: where it sits, and the image as llama-server loads it."""

    path: tuple[str | int, ...]
    """Keys and indices from the body down to the part; the last is its index in a list."""
    url: str
    """The ``image_url.url`` of the Chat Completions part llama-server converts it to."""
    text_type: str
    """The type of a text part in that list (``text``, ``input_text``): an empty one takes
    the place of the last image removed from a list, which would otherwise be empty."""


def chat_image_part(url: str) -> dict[str, Any]:
    """The Chat Completions ``image_url`` content part of ``url``."""
    return {"type": "image_url", "image_url": {"url": url}}


def stateless(reader: StreamReader) -> Callable[[], StreamReader]:
    """``tool_reader`` for an API whose events number their calls themselves: the same
    reader for every response."""
    return lambda: reader


def top_level_model(obj: dict[str, Any]) -> str | None:
    """``model`` at the top of an event or body."""
    model = obj.get("model")
    return model if isinstance(model, str) else None


def top_level_id(obj: dict[str, Any]) -> str | None:
    """``id`` at the top of an event or body."""
    found = obj.get("id")
    return found if isinstance(found, str) else None


def top_level_error(obj: dict[str, Any]) -> str | None:
    """llama-server's ``{"error": {"type", "code", ...}}`` as ``type:code``."""
    error = obj.get("error")
    if isinstance(error, dict):
        return f"{error.get('type', 'error')}:{error.get('code', '')}"
    return "error" if isinstance(error, str) else None


def never(obj: dict[str, Any]) -> bool:
    """No: no parsed event ends the stream (the end, if any, is :attr:`Dialect.end_data`),
    no body shows a cut call its arguments do not."""
    return False


@dataclass(frozen=True, slots=True)
class Dialect:
    """One API's shape, as the tracker and the request analysis need it.

    ``token`` and ``interesting`` are searched in every event's raw bytes: an event
    matching ``token`` carries generated text, reasoning (thinking) when the match took the
    pattern's group named :data:`REASONING` (each event carries one kind of text, and the
    token pattern finds it); only events matching ``interesting`` (and the first) are parsed.
    The readers take parsed JSON objects.
    """

    name: str
    handles: Callable[[str], bool]
    """Whether a request path belongs to this API."""
    token: re.Pattern[bytes]
    interesting: re.Pattern[bytes]
    finish_reasons: Callable[[dict[str, Any]], list[str]]
    """The finish reasons an event or body states."""
    tool_reader: Callable[[], StreamReader]
    """A reader of the tool-call fragments of one response's streamed events, made once per
    response: :func:`stateless` where events carry their call's index, a fresh one where
    calls are numbered by what came before (the Responses API keys them by item id)."""
    body_tool_calls: Callable[[dict[str, Any]], list[ToolDelta] | None]
    """The tool calls of a whole (non-streamed) response body (None: it has none)."""
    tool_names: Callable[[Any], frozenset[str]]
    """The tool names a request's ``tools`` value declares."""
    tool_request: Callable[[str, str], bool]
    """Whether a request (method, path) is a model turn that can carry tools."""
    usage: Callable[[dict[str, Any]], ServerTimings | None]
    """The token counts an event or body's ``usage`` states (``prompt_n`` uncached), or None;
    the tracker keeps the counts a later event states over earlier ones, field by field, and
    uses them when llama-server sent no ``timings``."""
    end_data: bytes | None
    """The data of the event that ends a complete stream (``[DONE]``), or None."""
    ends: Callable[[dict[str, Any]], bool] = never
    """Whether a parsed event ends a complete stream (``message_stop``, a final object with
    ``stop: true``): for APIs without an end marker. Such events must match ``interesting``."""
    model: Callable[[dict[str, Any]], str | None] = top_level_model
    """The served model's name an event or body states."""
    response_id: Callable[[dict[str, Any]], str | None] = top_level_id
    """The response's id an event or body states (what an agent names its previous turn by)."""
    error: Callable[[dict[str, Any]], str | None] = top_level_error
    """The upstream error an event or body states, as ``type:code``."""
    count_path: str | None = None
    """llama-server's endpoint that counts a request's prompt tokens in this API's own shape
    (``{"input_tokens": N}``), or None: the schema's tokens are counted through it."""
    system_turn: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """The request in this API's shape cut to what renders before the conversation (system
    text, tools, template options) with one :data:`PLACEHOLDER_TURN` as its conversation:
    all that decides where the tools block sits, so the key of the look-ups' cache."""
    chat_form: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """A :attr:`system_turn` as the Chat Completions body llama-server converts it to before
    its template runs: ``/apply-template``, which finds where the tools block sits, takes
    only that form."""
    image_parts: Callable[[dict[str, Any]], list[ImagePart]] | None = None
    """The image parts of a request body, in the order its rendered prompt holds them (None:
    the API carries no images the proxy accounts for)."""
    reasoning_text: Callable[[dict[str, Any]], str | None] | None = None
    """The reasoning text a parsed event (a delta) or a whole body states, or None."""
    body_call_cut: Callable[[dict[str, Any]], bool] = never
    """Whether a whole (non-streamed) body shows its last call cut by the token limit where
    the call's arguments cannot show it (llama-server's Messages body writes ``input: {}``
    for arguments that do not parse)."""
    states_limit: bool = True
    """The finish reason read is the server's own word, a cut by the token limit included.
    False where a server ends a turn at the request's limit without saying so (llama-server's
    Responses API says ``status: "completed"``, and ``tool_calls`` is read from the output
    items): a turn whose output count reached the request's limit then finished by
    ``length`` (the record's finish reason), whatever the response said."""
