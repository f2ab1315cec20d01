"""API dialects: what the events and bodies of one agent API look like. Pure.

The relay, the tracker and the request analysis are the same for every API; what differs is
where a token, a tool call, the usage and the finish reason sit in the JSON. Each API has a
module here that says so, and :func:`dialect_for` picks one per request, once, from its
path: Chat Completions, the Responses API, Anthropic Messages and the completion endpoints
(native ``/completion``, ``/infill``, legacy ``/v1/completions``).
"""

from __future__ import annotations

from proxy.core.dialects.base import REASONING, Dialect, ToolDelta
from proxy.core.dialects.chat import CHAT_COMPLETIONS
from proxy.core.dialects.completions import COMPLETIONS
from proxy.core.dialects.messages import MESSAGES
from proxy.core.dialects.responses import RESPONSES

__all__ = [
    "CHAT_COMPLETIONS",
    "COMPLETIONS",
    "DIALECTS",
    "MESSAGES",
    "REASONING",
    "RESPONSES",
    "Dialect",
    "ToolDelta",
    "dialect_for",
]

DIALECTS: tuple[Dialect, ...] = (CHAT_COMPLETIONS, RESPONSES, MESSAGES, COMPLETIONS)
"""Every dialect, the first whose ``handles`` accepts a path wins."""


def dialect_for(path: str) -> Dialect:
    """The dialect of a request to ``path`` (Chat Completions when no other claims it: its
    reading finds nothing in a body of another shape, so unknown paths stay unanalysed)."""
    for dialect in DIALECTS:
        if dialect.handles(path):
            return dialect
    return CHAT_COMPLETIONS
