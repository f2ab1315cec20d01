"""What the proxy reads of a request body: kind, model, stream flag and tool names. Pure.

The body is forwarded unchanged whatever this finds; a body that is not a JSON object is
simply not analysed, and the record says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from proxy.core.dialects import CHAT_COMPLETIONS, Dialect, dialect_for
from proxy.core.record import Kind

__all__ = ["RequestFacts", "analyse_request", "not_streamed"]


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The facts of one request body; ``body`` is the parsed object for accounting, and
    ``dialect`` the API whose responses the tracker reads."""

    kind: Kind
    model: str | None = None
    stream: bool | None = None
    tool_names: frozenset[str] = frozenset()
    body: dict[str, Any] | None = None
    error: str | None = None
    dialect: Dialect = CHAT_COMPLETIONS
    api: str = "other"
    """The dialect's name when the path is its API's, else ``other``."""


def analyse_request(method: str, path: str, body: bytes) -> RequestFacts:
    """Classify a request: ``tool`` (a model turn with a non-empty ``tools``), ``chat`` (one
    without) or ``other``."""
    if not body:
        return _bodiless(method, path)
    dialect = dialect_for(path)
    api = dialect.name if dialect.handles(path) else "other"
    turn = dialect.tool_request(method, path)
    bare = Kind.CHAT if turn else Kind.OTHER
    if method != "POST" or not body:
        return RequestFacts(kind=bare, dialect=dialect, api=api)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return RequestFacts(kind=bare, error="request_body_not_json", dialect=dialect, api=api)
    if not isinstance(obj, dict):
        return RequestFacts(kind=bare, error="request_body_not_an_object", dialect=dialect, api=api)
    model = obj.get("model")
    stream = obj.get("stream")
    tools = obj.get("tools")
    kind = Kind.TOOL if turn and isinstance(tools, list) and tools else bare
    return RequestFacts(
        kind=kind,
        model=model if isinstance(model, str) else None,
        stream=stream if isinstance(stream, bool) else False,
        tool_names=dialect.tool_names(tools),
        body=obj,
        dialect=dialect,
        api=api,
    )


_STREAM_KEY = b'"stream"'
_STREAM_FALSE = re.compile(rb'"stream"[ \t\n\r]*:[ \t\n\r]*false')


def not_streamed(body: bytes) -> bool:
    """True when ``body``, read as JSON, does not ask for a stream (``stream`` absent or
    false), found without parsing it: without ``\\u`` escapes a key ``stream`` can only be
    written ``"stream"``, and here each of those bytes is followed by ``: false``. False
    whenever that cannot be told so (``"stream": true``, an escape anywhere, ``"stream"``
    as a value): the relay then parses the body before sending it, as it always did."""
    if b"\\u" in body:
        return False
    at = body.find(_STREAM_KEY)
    while at >= 0:
        if _STREAM_FALSE.match(body, at) is None:
            return False
        at = body.find(_STREAM_KEY, at + len(_STREAM_KEY))
    return True


@lru_cache(maxsize=256)
def _bodiless(method: str, path: str) -> RequestFacts:
    """The facts of a request without a body: they depend on the method and path alone
    (and are frozen), so each pair is worked out once; every request starts with them."""
    dialect = dialect_for(path)
    api = dialect.name if dialect.handles(path) else "other"
    bare = Kind.CHAT if dialect.tool_request(method, path) else Kind.OTHER
    return RequestFacts(kind=bare, dialect=dialect, api=api)
