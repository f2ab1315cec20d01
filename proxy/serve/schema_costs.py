"""What a tool request's schema costs: its tokens looked up beside the relay (cached by the
rendering they change), where its block sits in the prompt, each tool's share, and the
request's price of it once its timings are known (``docs/accounting.md``).

The count is the request's own API's counting endpoint with and without the tools; the
block's position comes from the system turn rendered in the Chat Completions form and
tokenized with pieces. When the upstream cannot count, the tokens are tiktoken's
``cl100k_base`` estimate. A failed look-up is not cached: the next request with that
schema tries again. The totals of ``/stats`` are kept per schema hash, and per model on a
router.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from proxy.core.bounded import Bounded
from proxy.core.dialects import CHAT_COMPLETIONS, Dialect
from proxy.core.dialects.base import ImagePart
from proxy.core.images import without_images
from proxy.core.partials import AttributionFields, SchemaFields
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.schema import (
    SchemaLayout,
    context_held,
    differing_region,
    for_counting,
    layout_bodies,
    render_key,
    schema_cost,
    schema_hash,
    strip_tools,
    token_span,
)
from proxy.core.setup import tools_counted
from proxy.serve.lookups import Lookups, Unsupported, estimate_tokens, model_of, reusable
from proxy.serve.tasks import spawn

__all__ = ["SchemaCosts", "SchemaInfo", "SchemaTotals"]


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """What the tools of one rendering cost in tokens, and where their block ends."""

    hash: str
    tools: int
    tokens: int
    source: str
    layout: SchemaLayout | None = None


@dataclass(slots=True)
class SchemaTotals:
    """One schema's totals over the completed requests that carried it (``/stats``)."""

    tokens: int
    tools: int
    source: str
    calls: int = 0
    cached: int = 0
    paid_ms: float = 0.0
    saved_ms: float = 0.0
    prefilled_again: int = 0


def _tool_name(tool: Any, index: int) -> str:
    """A tool's name: nested (Chat Completions) or flat (Responses, Messages)."""
    if not isinstance(tool, dict):
        return f"#{index}"
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return name if isinstance(name, str) else f"#{index}"


class SchemaCosts:
    """Looks up and caches schema costs, prices each tool record's, keeps the totals."""

    def __init__(
        self,
        lookups: Lookups,
        *,
        cache_entries: int = 1024,
        schema_entries: int = 256,
        on_event: Callable[..., None] | None = None,
    ) -> None:
        self._lookups = lookups
        self._max = cache_entries
        self._on_event = on_event or (lambda *a, **k: None)
        self._cache: OrderedDict[str, asyncio.Task[SchemaInfo]] = OrderedDict()
        self._background: set[asyncio.Future[None]] = set()
        self.schemas: Bounded[tuple[str | None, str], SchemaTotals] = Bounded(schema_entries)
        """Totals per (model, schema hash); the model is ``None`` unless the upstream is a
        router."""
        self.per_tool: Bounded[tuple[str | None, str, int], dict[str, int]] = Bounded(
            schema_entries
        )
        """Leave-one-out counts per (the request's model, schema hash, schema tokens): the
        tokens of the rendering they were counted on, so ``/stats`` shows them beside the
        total they belong to."""
        self.prefilled_again = 0

    def close(self) -> None:
        """Cancel the look-ups in flight."""
        for task in self._cache.values():
            task.cancel()
        for future in self._background:
            future.cancel()

    # -- look-ups -----------------------------------------------------------------------------

    def begin(self, facts: RequestFacts, parts: list[ImagePart]) -> asyncio.Task[SchemaInfo] | None:
        """Start (or join) the schema look-up of a tool request of an API llama-server can
        count; ``None`` for any other request. ``parts`` are its image parts."""
        body = facts.body
        dialect = facts.dialect
        if facts.kind is not Kind.TOOL or body is None:
            return None
        if dialect.count_path is None or dialect.system_turn is None or dialect.chat_form is None:
            return None
        tools = body["tools"]
        key = render_key(dialect.chat_form(dialect.system_turn(body)))
        task = self._cache.get(key)
        if task is not None and reusable(task):
            self._cache.move_to_end(key)
        else:
            # the images do not change what the tools cost: counted without them (cheaper)
            body = without_images(body, parts) if parts else body
            task = spawn(self._schema(dialect, body, tools), self._background)
            self._cache[key] = task
            task.add_done_callback(lambda t: self._learn_per_tool(t, dialect, body, tools))
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return task

    async def _schema(self, dialect: Dialect, body: dict[str, Any], tools: list[Any]) -> SchemaInfo:
        assert dialect.count_path is not None
        count = self._lookups.count
        name = schema_hash(tools)
        counted = for_counting(body)
        try:
            full, without = await asyncio.gather(
                count(dialect.count_path, counted),
                count(dialect.count_path, strip_tools(counted)),
            )
        except Unsupported:
            text = orjson.dumps(tools).decode()
            tokens = await asyncio.to_thread(estimate_tokens, text)
            return SchemaInfo(name, len(tools), tokens, "estimate")
        layout = None
        # the layout is a refinement: without it the count stands, the position unknown
        with contextlib.suppress(
            Unsupported, aiohttp.ClientError, TimeoutError, KeyError, ValueError, TypeError
        ):
            layout = await self._layout(dialect, body, full - without)
        return SchemaInfo(name, len(tools), full - without, "server", layout)

    async def _layout(
        self, dialect: Dialect, body: dict[str, Any], schema_tokens: int
    ) -> SchemaLayout | None:
        """Where the tools block sits, in the prompt's tokens: the system turn rendered in the
        Chat Completions form with and without the tools, the differing text moved onto the
        token boundaries of the first rendering. For another API the form is trusted only
        when it counts as the API's own endpoint does, whole and without the tools."""
        assert dialect.system_turn is not None and dialect.chat_form is not None
        assert dialect.count_path is not None
        lookups = self._lookups
        turn = for_counting(dialect.system_turn(body))
        chat = dialect.chat_form(turn)
        with_tools, bare = layout_bodies(chat)
        chat_path = CHAT_COMPLETIONS.count_path
        assert chat_path is not None
        counts = await asyncio.gather(
            lookups.count(chat_path, with_tools),
            lookups.count(chat_path, strip_tools(with_tools)),
            *(() if dialect is CHAT_COMPLETIONS else (lookups.count(dialect.count_path, turn),)),
        )
        if counts[0] - counts[1] != schema_tokens or (len(counts) > 2 and counts[2] != counts[0]):
            return None
        rendered = await asyncio.gather(
            lookups.post("/apply-template", with_tools), lookups.post("/apply-template", bare)
        )
        text, other = str(rendered[0]["prompt"]), str(rendered[1]["prompt"])
        pieces = await lookups.pieces(text, model_of(with_tools))
        start, end = differing_region(text, other)
        span = token_span(
            pieces,
            len(text[:start].encode()),
            len(text[:end].encode()),
            offset=counts[0] - len(pieces),
        )
        if span is None or b"".join(pieces) != text.encode():
            return None
        return SchemaLayout(*span)

    async def _per_tool(
        self, dialect: Dialect, body: dict[str, Any], tools: list[Any], info: SchemaInfo
    ) -> dict[str, int]:
        assert dialect.count_path is not None
        path = dialect.count_path
        count = self._lookups.count
        # tool_choice may name the tool left out: the counts do not depend on it
        counted = {k: v for k, v in for_counting(body).items() if k != "tool_choice"}
        if len(tools) == 1:
            return {_tool_name(tools[0], 0): info.tokens}
        # a background refinement: never the reason a router loads a model again
        full = await count(path, counted, loaded_only=True)
        out: dict[str, int] = {}
        for i, tool in enumerate(tools):
            others = {**counted, "tools": tools[:i] + tools[i + 1 :]}
            out[_tool_name(tool, i)] = full - await count(path, others, loaded_only=True)
        return out

    def _learn_per_tool(
        self,
        task: asyncio.Task[SchemaInfo],
        dialect: Dialect,
        body: dict[str, Any],
        tools: list[Any],
    ) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        info = task.result()
        if info.source != "server":
            return

        async def run() -> None:
            try:
                per_tool = await self._per_tool(dialect, body, tools, info)
            except Exception:
                return
            self.per_tool.put((model_of(body), info.hash, info.tokens), per_tool)

        _ = spawn(run(), self._background)

    # -- pricing ------------------------------------------------------------------------------

    def price(
        self,
        record: Record,
        info: SchemaInfo,
        model: str | None,
        reference: float | None,
        attribution: AttributionFields | None = None,
    ) -> SchemaFields:
        """The schema fields of ``record``, counted in the totals of ``model``'s schema
        (``model`` None: the upstream serves one model). ``reference`` is the prefill ms per
        token of a large uncached batch, the price of the tokens the cache saved. A schema
        seen before is "prefilled again" unless the prompt's ``attribution`` says no earlier
        prompt held it in this place (:func:`~proxy.core.schema.context_held`)."""
        totals = self.schemas.get((model, info.hash))
        if totals is None:
            totals = SchemaTotals(info.tokens, info.tools, info.source)
            self.schemas.put((model, info.hash), totals)
        seen_before = totals.calls > 0
        cost = schema_cost(
            info.tokens, info.layout, record.cache_n, record.prompt_n, record.prefill_ms, reference
        )
        again: bool | None = None
        if record.outcome == Outcome.COMPLETED:
            totals.calls += 1
            if cost.prefilled_tokens is not None:
                totals.cached += 1 if cost.cached else 0
                totals.paid_ms += cost.prefill_ms or 0.0
                totals.saved_ms += cost.saved_ms or 0.0
                held = context_held(attribution, info.layout) is not False
                again = seen_before and held and cost.prefilled_tokens > 0
        if again:
            totals.prefilled_again += 1
            self.prefilled_again += 1
            self._on_event(
                "schema_prefilled_again",
                id=record.id,
                **({} if model is None else {"model": model}),
                schema_hash=info.hash,
                schema_tokens=info.tokens,
                schema_prefill_ms=cost.prefill_ms,
                cache_n=record.cache_n,
            )
        return SchemaFields(
            schema_hash=info.hash,
            schema_tools=info.tools,
            schema_tokens=info.tokens,
            schema_tokens_source=info.source,
            schema_cached=cost.cached,
            schema_prefill_ms=cost.prefill_ms,
            schema_saved_ms=cost.saved_ms,
            schema_prefilled_again=again,
            tools_in_prompt=tools_counted(record.kind, info.source, info.tokens),
        )

    # -- /stats -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The ``/stats`` ``schemas`` section: per schema hash, or on a router per model and
        hash (keyed ``model/hash``, with both named in the entry)."""
        by_hash: dict[str, Any] = {}
        for (model, h), t in self.schemas.items():
            entry = {
                "tokens": t.tokens,
                "tools": t.tools,
                "source": t.source,
                "calls": t.calls,
                "cached": t.cached,
                "paid_ms": round(t.paid_ms, 3),
                "saved_ms": round(t.saved_ms, 3),
                "prefilled_again": t.prefilled_again,
                "per_tool_tokens": self._per_tool_of(model, h, t.tokens),
            }
            if model is None:
                by_hash[h] = entry
            else:
                by_hash[f"{model}/{h}"] = {"model": model, "hash": h, **entry}
        return {
            "prefilled_again": self.prefilled_again,
            "by_hash": by_hash,
            "evicted": self.schemas.evicted,
        }

    def _per_tool_of(self, model: str | None, h: str, tokens: int) -> dict[str, int] | None:
        """The per-tool counts taken on a rendering whose schema cost ``tokens`` (the same
        tools cost more without a system message: the template's own system turn then
        carries them), of ``model`` (None: of any name the requests gave the one model)."""
        if model is not None:
            return self.per_tool.get((model, h, tokens))
        return next((v for (_, h2, n), v in self.per_tool.items() if h2 == h and n == tokens), None)
