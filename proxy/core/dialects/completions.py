"""The completion endpoints: native ``/completion`` (= ``/completions``), ``/infill`` and the
OpenAI legacy ``/v1/completions``. Pure.

Two shapes, one dialect. The native one streams one event per token,
``{"index":0,"content":" the","tokens":[506],"stop":false,...}``, and ends with an object
that has ``stop:true``, ``stop_type`` (``eos``, ``word``, ``limit``, ``none``),
``tokens_predicted`` and ``timings``, with no ``[DONE]`` after it. The legacy one streams
``{"choices":[{"text":...,"finish_reason":null}],...}`` chunks, the last with a
``finish_reason``, ``usage`` and ``timings``, then ``[DONE]``. A body without ``stream`` is the
final object of either shape, with the whole text.

These endpoints take a prompt, not a conversation with tools: they carry no tool calls.
A legacy stream ends with ``[DONE]`` (``end_data``), a native one with its final object
(``stop: true``, read by ``ends``: that object carries ``stop_type`` and ``timings``, so it is
parsed).
"""

from __future__ import annotations

import re
from typing import Any

from proxy.core.dialects.base import Dialect, ToolDelta, stateless
from proxy.core.dialects.chat import CHAT_COMPLETIONS
from proxy.core.record import ServerTimings, valid_count

__all__ = ["COMPLETIONS"]

_PATHS = frozenset({"/completion", "/completions", "/v1/completions", "/infill"})

_STOP_TYPES = {"eos": "stop", "word": "stop", "limit": "length"}
"""Native ``stop_type`` in Chat Completions' words (llama-server's own mapping for
``/v1/completions``); ``none`` states no reason and is left out."""


def _handles(path: str) -> bool:
    return path.rstrip("/") in _PATHS


def _no_tool_request(method: str, path: str) -> bool:
    return False


def _no_tool_deltas(obj: dict[str, Any]) -> list[ToolDelta] | None:
    return None


def _no_tool_names(tools: Any) -> frozenset[str]:
    return frozenset()


def _finish_reasons(obj: dict[str, Any]) -> list[str]:
    """The native final object's ``stop_type``, mapped; else ``choices[].finish_reason``."""
    stop_type = obj.get("stop_type")
    if isinstance(stop_type, str):
        reason = _STOP_TYPES.get(stop_type)
        return [] if reason is None else [reason]
    return CHAT_COMPLETIONS.finish_reasons(obj)


def _ends(obj: dict[str, Any]) -> bool:
    """The native final object."""
    return obj.get("stop") is True


def _usage(obj: dict[str, Any]) -> ServerTimings | None:
    """The legacy ``usage`` as Chat Completions reads it (its ``completion_tokens`` alone when
    the cached share is not stated); the native final object's ``tokens_predicted``.

    ``tokens_evaluated`` is the whole prompt, cached or not, and ``tokens_cached`` the slot's
    length afterwards, not the reused prefix: neither gives ``prompt_n`` or ``cache_n``
    (the final object's ``timings`` does)."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        full = CHAT_COMPLETIONS.usage(obj)
        if full is not None:
            return full
        predicted = valid_count(usage.get("completion_tokens"))
    elif obj.get("stop") is True:
        predicted = valid_count(obj.get("tokens_predicted"))
    else:  # a native partial counts the tokens so far: the final object states the total
        return None
    return None if predicted is None else ServerTimings(predicted_n=predicted)


COMPLETIONS = Dialect(
    name="completions",
    handles=_handles,
    # compact JSON: a key cannot occur unescaped in a string; an empty piece is no token
    token=re.compile(rb'"(?:content|text)": ?"[^"]'),
    interesting=re.compile(rb'"(?:timings"|usage"|error"|stop_type"|finish_reason": ?")'),
    finish_reasons=_finish_reasons,
    tool_reader=stateless(_no_tool_deltas),
    body_tool_calls=_no_tool_deltas,
    tool_names=_no_tool_names,
    tool_request=_no_tool_request,
    usage=_usage,
    end_data=b"[DONE]",  # the legacy shape's end
    ends=_ends,  # the native shape's
)
