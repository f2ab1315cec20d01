"""The OpenAI Responses API (``/v1/responses``, ``/responses``): typed events, ``output[]`` items.

A streamed reply is a series of ``event: <name>`` / ``data: {"type": "<name>", …}`` events
with no ``[DONE]``. Generated text arrives in ``response.output_text.delta`` and
``response.reasoning_text.delta`` events; a tool call is announced by a
``response.output_item.added`` whose item is a ``function_call`` (it bears the name) and its
arguments stream in ``response.function_call_arguments.delta`` events keyed by ``item_id``.
Everything else (``created``, ``in_progress``, ``content_part.*``, every ``.done``) is
lifecycle and never a token: the final batch repeats the whole text in ``.done`` events, and
taking one of those as the first token is the bug this dialect exists to avoid. The turn ends
with ``response.completed``, whose ``response`` holds the ``output`` items and the ``usage``
(``input_tokens`` is the whole prompt, ``input_tokens_details.cached_tokens`` its cached part)
and whose sibling ``timings`` the tracker reads itself. A whole (non-streamed) body is that
same response object at the top level, without ``timings``.

Tool calls are numbered by the order their ``function_call`` items were added (the events
carry no ``output_index``): that needs state per response, which :func:`new_call_reader`
keeps; it is the dialect's ``tool_reader``, made anew for each response. It also reconciles
each call with its final ``.done`` item, which carries the full ``arguments``: llama-server
puts text that only its final re-parse produced there and never in a delta, so when the
streamed fragments are a prefix of the full text the missing suffix is returned as one more
fragment (the ``.done`` event is then a tool-call event, as the re-parse diff chunk is on
Chat Completions); when they agree, ``.done`` is no tool-call event.

Finish reason: llama-server's ``status`` is ``"completed"`` even after a ``max_output_tokens``
cut (and so is every ``function_call`` item's, a call cut inside its arguments included), so
the response alone cannot tell a natural end from a cut. The dialect reads ``"tool_calls"``
when the completed response's ``output`` holds ``function_call`` items, ``"length"`` (or
``"content_filter"``) when the response says ``status: "incomplete"`` with that
``incomplete_details.reason`` (OpenAI's own servers do; llama-server never does), and
otherwise nothing: ``"stop"`` would be a guess. The dialect does not state cuts
(``states_limit`` false): the record's finish reason is ``"length"`` whenever the response's
``usage.output_tokens`` (or ``timings.predicted_n``) reached the request's
``max_output_tokens`` (:func:`proxy.core.assemble.finish_reason`), as Chat Completions says
for the same generation; a call cut there is then ``tool_call_truncated``.

The request side (system turn, images, the Chat Completions form) is
:mod:`proxy.core.dialects.responses_form`.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.core.dialects.base import Dialect, StreamReader, ToolDelta
from proxy.core.dialects.responses_form import chat_form, image_parts, system_turn
from proxy.core.record import ServerTimings, valid_count

__all__ = ["RESPONSES", "new_call_reader"]

_SUFFIX = "/responses"
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_ADDED = "response.output_item.added"
_ARGS_DELTA = "response.function_call_arguments.delta"
_ITEM_DONE = "response.output_item.done"
_ARGS_DONE = "response.function_call_arguments.done"
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def _is_responses(path: str) -> bool:
    """``/v1/responses`` and ``/responses``, not the counting ``…/responses/input_tokens``."""
    return path.rstrip("/").endswith(_SUFFIX)


def _tool_request(method: str, path: str) -> bool:
    return method == "POST" and _is_responses(path)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _response(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The response object a final event carries, or a whole body itself."""
    if obj.get("type") in _ENDS:
        inner = obj.get("response")
        return inner if isinstance(inner, dict) else None
    return obj if obj.get("object") == "response" else None


def _function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    output = response.get("output")
    if not isinstance(output, list):
        return []
    return [i for i in output if isinstance(i, dict) and i.get("type") == "function_call"]


def _finish_reasons(obj: dict[str, Any]) -> list[str]:
    """``tool_calls`` for a completed response with calls, the mapped
    ``incomplete_details.reason`` of an incomplete one, else none (see the module doc)."""
    response = _response(obj)
    if response is None:
        return []
    status = response.get("status")
    if status == "completed":
        return ["tool_calls"] if _function_calls(response) else []
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if status == "incomplete" and isinstance(reason, str) and reason in _INCOMPLETE:
        return [_INCOMPLETE[reason]]
    return []


def _usage(obj: dict[str, Any]) -> ServerTimings | None:
    """``usage.input_tokens`` less ``input_tokens_details.cached_tokens``, the cached ones and
    ``output_tokens``; a prompt count is None unless both are known and consistent."""
    response = _response(obj)
    usage = response.get("usage") if response is not None else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    cached = valid_count(details.get("cached_tokens") if isinstance(details, dict) else None)
    prompt = valid_count(usage.get("input_tokens"))
    output = valid_count(usage.get("output_tokens"))
    if prompt is None or cached is None or cached > prompt:
        prompt = cached = None
    if prompt is None and output is None:
        return None
    return ServerTimings(
        prompt_n=None if prompt is None or cached is None else prompt - cached,
        cache_n=cached,
        predicted_n=output,
    )


def _call_item(obj: dict[str, Any]) -> dict[str, Any] | None:
    item = obj.get("item")
    return item if isinstance(item, dict) and item.get("type") == "function_call" else None


class _CallReader:
    """One response's calls: item id to index in order of appearance, and the argument text
    streamed so far, to compare with the full text of a call's ``.done`` item."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._sent: dict[int, str] = {}

    def __call__(self, obj: dict[str, Any]) -> list[ToolDelta] | None:
        kind = obj.get("type")
        if kind == _ADDED:
            return self._added(obj)
        if kind == _ARGS_DELTA:
            return [self._fragment(obj.get("item_id"), None, _text(obj.get("delta")))]
        if kind == _ITEM_DONE:
            item = _call_item(obj)
            return None if item is None else self._done(item.get("id"), item)
        if kind == _ARGS_DONE:
            return self._done(obj.get("item_id"), obj)
        return None

    def _at(self, item_id: Any) -> int:
        """The index of a call; an unknown id (or none) opens the next one."""
        key = item_id if isinstance(item_id, str) else ""
        if key not in self._index:
            self._index[key] = len(self._index)
        return self._index[key]

    def _fragment(self, item_id: Any, name: str | None, args: str | None) -> ToolDelta:
        index = self._at(item_id)
        if name:
            self._names[index] = name
        if args:
            self._sent[index] = self._sent.get(index, "") + args
        return (index, name or None, args or None)

    def _added(self, obj: dict[str, Any]) -> list[ToolDelta] | None:
        item = _call_item(obj)
        if item is None:
            return None
        return [
            self._fragment(item.get("id"), _text(item.get("name")), _text(item.get("arguments")))
        ]

    def _done(self, item_id: Any, item: dict[str, Any]) -> list[ToolDelta] | None:
        """What a call's final item adds: a new or changed name, and the rest of the full
        arguments when the streamed text is a prefix of them (an append-only fragment cannot
        correct a text the re-parse rewrote: then the streamed text stays)."""
        known = isinstance(item_id, str) and item_id in self._index
        index = self._at(item_id)
        name = _text(item.get("name"))
        new_name = name if name and name != self._names.get(index) else None
        full = _text(item.get("arguments")) or ""
        sent = self._sent.get(index, "")
        rest = full[len(sent) :] if full.startswith(sent) else ""
        if known and new_name is None and not rest:
            return None
        return [self._fragment(item_id, new_name, rest)]


def new_call_reader() -> StreamReader:
    """A reader of one response's tool calls, numbering them 0, 1, … in the order they were
    added and completing them from their ``.done`` items."""
    return _CallReader()


def _body_tool_calls(obj: dict[str, Any]) -> list[ToolDelta] | None:
    """``output[]`` items of type ``function_call``, numbered in order."""
    response = _response(obj)
    calls = _function_calls(response) if response is not None else []
    if not calls:
        return None
    return [
        (i, _text(c.get("name")) or None, _text(c.get("arguments"))) for i, c in enumerate(calls)
    ]


def _tool_names(tools: Any) -> frozenset[str]:
    """Flat ``{"type": "function", "name": …}`` tools (other types llama-server drops)."""
    if not isinstance(tools, list):
        return frozenset()
    return frozenset(
        name
        for tool in tools
        if isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(name := tool.get("name"), str)
    )


def _ends(obj: dict[str, Any]) -> bool:
    """``response.completed`` (or OpenAI's ``incomplete``/``failed``): the last event."""
    return obj.get("type") in _ENDS


def _model(obj: dict[str, Any]) -> str | None:
    """``model`` of a body, or of the ``response`` a stream's final event carries."""
    response = _response(obj)
    model = (response or obj).get("model")
    return model if isinstance(model, str) else None


def _response_id(obj: dict[str, Any]) -> str | None:
    """``id`` of a body, or of the ``response`` an event carries (``response.created`` is
    the first)."""
    inner = obj.get("response")
    if isinstance(inner, dict):
        found = inner.get("id")
    else:
        found = obj.get("id") if obj.get("object") == "response" else None
    return found if isinstance(found, str) else None


_REASONING_DELTAS = frozenset(
    {"response.reasoning_text.delta", "response.reasoning_summary_text.delta"}
)


def _reasoning_text(obj: dict[str, Any]) -> str | None:
    """A reasoning delta's text (an event), or the reasoning items' text (a body)."""
    if obj.get("type") in _REASONING_DELTAS:
        delta = obj.get("delta")
        return delta if isinstance(delta, str) else None
    output = obj.get("output")
    parts: list[str] = []
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            continue
        content = item.get("content")
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    return "".join(parts) if parts else None


RESPONSES = Dialect(
    name="responses",
    handles=_is_responses,
    # compact JSON: a key or an unescaped ``"type":"…"`` cannot occur inside a string
    token=re.compile(
        rb'"type": ?"response\.(?:output_text|(?P<reasoning>reasoning_text|'
        rb'reasoning_summary_text)|refusal)\.delta"'
    ),
    interesting=re.compile(
        rb'"(?:(?:usage|timings|error)": ?|type": ?"(?:function_call"|response\.(?:'
        rb'function_call_arguments\.(?:delta|done)|completed|incomplete|failed)"))'
    ),
    finish_reasons=_finish_reasons,
    tool_reader=new_call_reader,
    body_tool_calls=_body_tool_calls,
    tool_names=_tool_names,
    tool_request=_tool_request,
    usage=_usage,
    end_data=None,
    ends=_ends,
    model=_model,
    response_id=_response_id,
    count_path="/v1/responses/input_tokens",
    system_turn=system_turn,
    chat_form=chat_form,
    image_parts=image_parts,
    reasoning_text=_reasoning_text,
    states_limit=False,
)
"""The Responses API; each response's calls are read by a :func:`new_call_reader` of its own."""
