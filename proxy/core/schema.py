"""Tool-schema accounting arithmetic. Pure: the look-ups live in :mod:`proxy.serve.schema_costs`.

Two hashes:

* ``schema_hash`` names the tools themselves (canonical JSON of the ``tools`` array): what a
  user calls "my schema", the key of ``/stats`` ``schemas``.
* the *render key* covers everything that changes how the template renders the tools and
  where their block ends, taken from the request's Chat Completions form (a dialect's
  ``chat_form``): ``model`` (a router may serve several), ``tools``, ``tool_choice``,
  ``parallel_tool_calls``, ``chat_template_kwargs`` and the leading system messages. Chat
  templates put the tools block in the system turn, before the first user message (Qwen
  2.5/3, Hermes, Llama 3.x JSON tools, Gemma 4), so later messages do not move it. Look-up
  results are cached by this key: a schema seen before costs no upstream call.

The block's position is found in text (:func:`differing_region`) and then moved onto the
prompt's own token boundaries (:func:`token_span`): a prefix cache reaches a whole number of
tokens, so only a block in tokens can be compared with ``cache_n``.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.findings import Cause
from proxy.core.partials import AttributionFields
from proxy.core.turns import PrefixKind

__all__ = [
    "SchemaCost",
    "SchemaLayout",
    "context_held",
    "differing_region",
    "digest",
    "layout_bodies",
    "render_key",
    "schema_cost",
    "schema_hash",
    "strip_tools",
    "token_span",
]

_RENDER_KEYS = ("model", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")
_NOT_FOR_COUNTING = ("stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls")


def _digest(obj: Any) -> str:
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (254): walk it ourselves
        data = _canonical(obj)
    return hashlib.sha256(data).hexdigest()


def _canonical(obj: Any) -> bytes:
    """A stable serialisation of parsed JSON of any depth (iterative, keys sorted)."""
    out: list[bytes] = []
    stack: list[Any] = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [b"{"]
            for key in sorted(item, key=str):
                parts += [repr(str(key)).encode(), b":", item[key], b","]
            stack.extend(reversed([*parts, b"}"]))
        elif isinstance(item, list):
            stack.extend(reversed([b"[", *[x for v in item for x in (v, b",")], b"]"]))
        else:
            out.append(repr(item).encode())
    return b"".join(out)


def digest(obj: Any) -> str:
    """The SHA-256 of parsed JSON's canonical form (keys sorted, any depth)."""
    return _digest(obj)


def schema_hash(tools: list[Any]) -> str:
    """Short stable name of a ``tools`` array (key order inside objects does not matter)."""
    return _digest(tools)[:12]


def render_key(body: dict[str, Any]) -> str:
    """Hash of everything in ``body`` that changes the rendering of the tools block."""
    messages = body.get("messages")
    leading: list[Any] = []
    if isinstance(messages, list):
        for m in messages:
            if not (isinstance(m, dict) and m.get("role") in ("system", "developer")):
                break
            leading.append(m)
    return _digest({**{k: body.get(k) for k in _RENDER_KEYS}, "system": leading})


def for_counting(body: dict[str, Any]) -> dict[str, Any]:
    """The body as sent to ``input_tokens``/``apply-template`` (no streaming options)."""
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


def strip_tools(body: dict[str, Any]) -> dict[str, Any]:
    """The same body without ``tools`` and what only makes sense with them."""
    return {k: v for k, v in body.items() if k not in _NOT_FOR_COUNTING}


def differing_region(with_tools: str, without: str) -> tuple[int, int]:
    """``(start, end)`` character offsets in ``with_tools`` of the text the tools added.

    The longest common prefix and, of the rest, the longest common suffix of the two
    renderings bound the tools block, template wrapper text included. When the block can
    slide (it starts with text that also follows it, such as a turn marker shared by the
    tools' system turn and the next turn), it is placed as early as it can go: the block
    then ends where the tools' turn ends, not inside the next turn's marker.
    """
    limit = min(len(with_tools), len(without))
    start = 0
    while start < limit and with_tools[start] == without[start]:
        start += 1
    suffix = 0
    while (
        suffix < limit - start
        and with_tools[len(with_tools) - 1 - suffix] == without[len(without) - 1 - suffix]
    ):
        suffix += 1
    end = len(with_tools) - suffix
    while start > 0 and end > start and with_tools[start - 1] == with_tools[end - 1]:
        start -= 1
        end -= 1
    return start, end


def token_span(
    pieces: Sequence[bytes], start: int, end: int, offset: int = 0
) -> tuple[int, int] | None:
    """The token positions ``[first, stop)`` of the tokens that hold any byte of the byte range
    ``[start, end)``, given the prompt's tokens as the byte pieces they stand for.

    A token that straddles a bound belongs to the block: its bytes changed with the tools, so
    a cache that ends before it did not hold it. ``offset`` counts tokens the tokenizer adds
    before the text (BOS). ``None`` when the pieces do not cover ``end`` bytes.
    """
    bounds = [0]
    for piece in pieces:
        bounds.append(bounds[-1] + len(piece))
    if not 0 <= start <= end <= bounds[-1]:
        return None
    first = bisect.bisect_right(bounds, start) - 1
    stop = max(first, bisect.bisect_left(bounds, end, hi=len(pieces)))
    return offset + first, offset + stop


def layout_bodies(chat_body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two Chat Completions bodies whose renderings bound the tools block: the body, and
    the body without tools. When the body has no leading system message the second one gets an
    empty one, so the region holds the tools' own text rather than the whole system turn
    that only exists to carry them: a cache that stops at that turn's last marker (a context
    checkpoint at the first user message) still holds every tool."""
    counted = for_counting(chat_body)
    bare = strip_tools(counted)
    messages = bare.get("messages")
    if isinstance(messages, list) and not (
        messages
        and isinstance(messages[0], dict)
        and messages[0].get("role") in ("system", "developer")
    ):
        bare = {**bare, "messages": [{"role": "system", "content": ""}, *messages]}
    return counted, bare


@dataclass(frozen=True, slots=True)
class SchemaLayout:
    """Where the tools block sits in the prompt, in tokens: ``[start, end)`` positions."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class SchemaCost:
    """What the schema cost one request."""

    cached: bool | None
    prefilled_tokens: float | None
    prefill_ms: float | None
    saved_ms: float | None


def schema_cost(
    schema_tokens: int,
    layout: SchemaLayout | None,
    cache_n: int | None,
    prompt_n: int | None,
    prefill_ms: float | None,
    reference_ms_per_token: float | None = None,
) -> SchemaCost:
    """Price the schema for one request from the prompt cache's reach (``cache_n``).

    The schema tokens at positions ``>= cache_n`` were prefilled this time and cost this
    request's ``prefill_ms / prompt_n`` each; the others were served from the cache.
    ``saved_ms`` prices the cached ones at ``reference_ms_per_token``, a prefill rate
    measured on a large uncached batch: this request's own rate would be wrong when only a
    few tokens were prefilled, since ``prompt_ms`` includes the first token's sampling.
    Without a reference, ``saved_ms`` is unknown unless nothing was saved. Without a
    layout the position is unknown and the cost is known only when nothing was cached.
    Without this request's prefill time (the Messages API sends no ``timings``) the split
    in tokens still stands, and the cost is known only when nothing was paid: 0 ms. A schema
    of 0 tokens (a template that drops tools) costs 0 ms and is neither cached nor not.
    """
    rate = prefill_ms / prompt_n if prefill_ms is not None and prompt_n else None
    if schema_tokens == 0:  # the template rendered no tools: nothing paid, nothing to cache
        return SchemaCost(None, 0.0, 0.0, 0.0)
    if cache_n is None:
        return SchemaCost(None, None, None, None)
    if layout is None:
        if cache_n > 0:
            return SchemaCost(None, None, None, None)
        paid = float(schema_tokens)
    else:
        span = layout.end - layout.start
        uncached = max(0, layout.end - max(layout.start, cache_n))
        paid = schema_tokens * (uncached / span) if span > 0 else 0.0
    saved_tokens = schema_tokens - paid
    if saved_tokens <= 0:
        saved: float | None = 0.0
    elif reference_ms_per_token is not None:
        saved = round(saved_tokens * reference_ms_per_token, 3)
    else:
        saved = None
    if paid == 0:
        prefill: float | None = 0.0
    else:
        prefill = round(paid * rate, 3) if rate is not None else None
    return SchemaCost(
        cached=paid == 0 if layout is not None else False,
        prefilled_tokens=round(paid, 3),
        prefill_ms=prefill,
        saved_ms=saved,
    )


def context_held(attribution: AttributionFields | None, layout: SchemaLayout | None) -> bool | None:
    """Whether an earlier prompt held this schema where this one has it, so that a prefix
    cache could have served it: one sharing everything up to the schema's end (a retry, the
    next turn, a new question after the same system prompt and tools), or the agent's own
    earlier prompt changed before the schema (a clock in the system prompt). Not a prompt
    whose match is another agent's (``cold``), nor one that differs from its match inside
    the tools (that prompt held other tools), nor one given another slot because the slot
    holding it was busy (``slot_busy``: that slot never held it). None when the prompt was
    not attributed, or when its match may not be its predecessor and the schema's place is
    unknown."""
    if attribution is None or attribution.prefix_kind is None:
        return None
    if attribution.prefix_kind == PrefixKind.COLD or attribution.prefill_cause == Cause.SLOT_BUSY:
        return False
    reusable = attribution.reusable_tokens
    if layout is not None and reusable is not None and reusable >= layout.end:
        return True
    if attribution.attribution_error == "predecessor_unknown":
        return None if layout is None else False
    if attribution.prefix_kind in (PrefixKind.REWRITE, PrefixKind.COMPACTION):
        return not (attribution.diverged_section or "").startswith("tools[")
    return layout is None  # a retry, the next turn or a branch shares all before its last turn
