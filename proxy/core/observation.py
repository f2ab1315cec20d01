"""What the tracker saw of one response: the :class:`Observation`. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.core.record import ServerTimings
from proxy.core.tool_calls import ToolCall

__all__ = ["MAX_REASONING_BYTES", "Observation"]

MAX_REASONING_BYTES = 256 * 1024
"""Reasoning text kept per response (to count its tokens); beyond it, the text is dropped
and only its times are kept."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What the tracker saw of one response. Times are seconds since the request arrived."""

    first_byte_s: float | None = None
    first_event_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    last_byte_s: float | None = None
    tool_call_s: float | None = None
    events: int = 0
    token_events: int = 0
    response_bytes: int = 0
    timings: ServerTimings | None = None
    model: str | None = None
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    upstream_error: str | None = None
    analysis_error: str | None = None
    oversized_events: int = 0
    done: bool = False
    analysed: bool = True
    recognised: bool = False
    """Something in the response was the API's own: a token, a tool call, counts, a finish
    reason, an error or an end. Without it the token and call counts are unknown, not 0."""
    reasoning_first_s: float | None = None
    reasoning_last_s: float | None = None
    reasoning_text: str | None = None
    """The reasoning (thinking) the model streamed, joined; ``None`` when there was none or
    it was over :data:`MAX_REASONING_BYTES`. Model output: counted, never logged."""
    call_cut: bool = False
    """A whole body showed its last call cut by the token limit where the call's arguments
    do not (the dialect's ``body_call_cut``)."""
    arguments_dropped: bool = False
    """The calls' arguments were over ``MAX_ARGUMENT_BYTES``: they are empty here."""
    response_id: str | None = None
    """The response's ``id`` (``chatcmpl-…``, ``resp_…``): what an agent names it by when it
    asks for prompt-cache diagnostics."""
