"""Schema, image, tool-call and prefix accounting beside the relay: what the relay calls.

:class:`Accounting` starts a request's look-ups when it arrives (:meth:`Accounting.begin`,
never blocking: they run while the request is forwarded, and nothing waits for them before
the agent's bytes go out) and joins their results to its record once the exchange has
ended (:meth:`Accounting.complete`). The work is in modules of their own:

- :mod:`proxy.serve.lookups`: the look-up client (its own session, the error answers, the
  router question);
- :mod:`proxy.serve.schema_costs`: what the tool schema costs, and the ``/stats`` totals;
- :mod:`proxy.serve.image_lookups`: what the images add and where they sit;
- :mod:`proxy.serve.output_tokens`: the arguments' and the reasoning's tokens;
- :mod:`proxy.serve.attribution`: why the prompt was prefilled again.

Each gives its record fields as a partial (:mod:`proxy.core.partials`), and
:meth:`Accounting.complete` joins them all to the record at once with
:func:`~proxy.core.partials.assemble`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core.bounded import Bounded
from proxy.core.partials import AccountingNote, AttributionFields, SchemaFields, assemble
from proxy.core.prefix import RenderedPrompt
from proxy.core.record import Record
from proxy.core.request import RequestFacts
from proxy.core.tracker import Observation
from proxy.serve.attribution import Attributor
from proxy.serve.image_lookups import ImageInfo, ImageLookups, image_parts_of
from proxy.serve.lookups import (
    LookupFailed,
    Lookups,
    error_message,
    estimate_tokens,
    failure_reason,
    joined,
)
from proxy.serve.output_tokens import OutputCounter
from proxy.serve.schema_costs import SchemaCosts, SchemaInfo, SchemaTotals

__all__ = [
    "REFERENCE_MIN_TOKENS",
    "Accounting",
    "ImageInfo",
    "LookupFailed",
    "Pending",
    "SchemaInfo",
    "accounting_note",
    "error_message",
    "estimate_tokens",
    "failure_reason",
]

REFERENCE_MIN_TOKENS = 64
"""Prefills shorter than this are not used as the reference rate for saved ms."""


@dataclass(slots=True)
class Pending:
    """Accounting started for one request."""

    facts: RequestFacts
    schema: asyncio.Task[SchemaInfo] | None
    prompt: asyncio.Future[RenderedPrompt] | None = None
    conversation: str | None = None
    """The conversation id the agent sent in the configured header."""
    images: asyncio.Task[ImageInfo] | None = None
    image_count: int = 0
    ticket: int | None = None
    """The request's place among those in flight (:class:`~proxy.serve.rivals.Rivals`)."""


def accounting_note(errors: list[str]) -> AccountingNote | None:
    """Why some accounting fields are ``null``, each reason prefixed by what it is about;
    None when nothing failed (the record's ``accounting_error`` is then left as it is)."""
    return AccountingNote("; ".join(errors)) if errors else None


class Accounting:
    """Starts each request's look-ups, and completes its record with their fields."""

    def __init__(
        self,
        upstream: str,
        *,
        timeout_s: float = 10.0,
        cache_entries: int = 1024,
        schema_entries: int = 256,
        attribution_bytes: int = 64 << 20,
        on_event: Callable[..., None] | None = None,
        api_key: str | None = None,
        attribution: bool = False,
        attribution_history: int = 64,
        show_diff_text: bool = False,
        raw_conversation_ids: bool = False,
        conversation_header: str = "",
        context_size: Callable[[str | None], int | None] = lambda _: None,
        slots: Callable[[str | None], int | None] = lambda _: None,
    ) -> None:
        self._timeout = timeout_s
        self._lookups = Lookups(upstream, timeout_s=timeout_s, api_key=api_key)
        self._schemas = SchemaCosts(
            self._lookups,
            cache_entries=cache_entries,
            schema_entries=schema_entries,
            on_event=on_event,
        )
        self._images = ImageLookups(self._lookups, cache_entries=cache_entries)
        self._outputs = OutputCounter(self._lookups)
        self.reference_ms_per_token: float | None = None
        self._conversation_header = conversation_header
        self.attributor = (
            Attributor(
                self._lookups.post,
                history=attribution_history,
                keep_text=show_diff_text,
                raw_conversation_ids=raw_conversation_ids,
                on_event=on_event,
                context_size=context_size,
                slots=slots,
                routed=self._lookups.routed,
                max_bytes=attribution_bytes,
            )
            if attribution
            else None
        )

    @property
    def schemas(self) -> Bounded[tuple[str | None, str], SchemaTotals]:
        """The schema totals per (model, schema hash): see :class:`SchemaCosts`."""
        return self._schemas.schemas

    @property
    def per_tool(self) -> Bounded[tuple[str | None, str, int], dict[str, int]]:
        """Each schema's per-tool counts: see :class:`SchemaCosts`."""
        return self._schemas.per_tool

    @property
    def prefilled_again(self) -> int:
        """Requests whose known schema was prefilled again."""
        return self._schemas.prefilled_again

    def routed(self) -> bool:
        """Whether the upstream is known to be a router (``/props`` answered so)."""
        return self._lookups.routed()

    async def start(self) -> None:
        """Open the look-up session."""
        await self._lookups.start()

    async def close(self) -> None:
        """Cancel look-ups in flight and close the session."""
        self._schemas.close()
        if self.attributor is not None:
            self.attributor.close()
        self._images.close()
        await self._lookups.close()

    def begin(
        self,
        facts: RequestFacts,
        headers: Mapping[str, str] | None = None,
        sent: float | None = None,
    ) -> Pending | None:
        """Start the look-ups of one request: its schema's (a tool request of an API that
        llama-server can count), its images' and its prompt's rendering (a chat or tool
        request, with attribution on); ``None`` when there is none to make. Never blocks.
        ``headers`` are the request's, for the conversation id an agent may send; ``sent``
        when it was sent, on the clock :meth:`complete`'s ``ended`` is on."""
        if facts.body is None or not self._lookups.started:
            return None
        parts = image_parts_of(facts)
        schema = self._schemas.begin(facts, parts)
        prompt = self.attributor.begin(facts) if self.attributor is not None else None
        images = self._images.begin(facts, parts)
        if schema is None and prompt is None and images is None:
            return None
        self._lookups.learn_router()
        conversation = None
        if headers is not None and self._conversation_header:
            conversation = headers.get(self._conversation_header) or None
        ticket = None
        if prompt is not None and sent is not None and self.attributor is not None:
            ticket = self.attributor.rivals.opened(
                self.attributor.cache_key(facts.model), prompt, sent
            )
        return Pending(
            facts=facts,
            schema=schema,
            prompt=prompt,
            conversation=conversation,
            images=images,
            image_count=len(parts),
            ticket=ticket,
        )

    def learn_rate(self, record: Record, *_: object) -> None:
        """Record sink: keep the prefill ms per token of the latest large uncached batch
        (at least ``REFERENCE_MIN_TOKENS`` prompt tokens evaluated), to price cached schemas."""
        if (
            record.prompt_n is not None
            and record.prompt_n >= REFERENCE_MIN_TOKENS
            and record.prefill_ms
        ):
            self.reference_ms_per_token = record.prefill_ms / record.prompt_n

    async def complete(
        self,
        record: Record,
        pending: Pending,
        obs: Observation | None,
        ended: float | None = None,
    ) -> Record:
        """The record with the schema, prefix, image and tool-call fields filled in (``null``
        and the reason in ``accounting_error`` on failure). Waits at most the look-up
        timeout per round; the agent's response is already done (at ``ended``)."""
        errors: list[str] = []
        attributor, ticket = self.attributor, pending.ticket
        if attributor is not None and ticket is not None and ended is not None:
            attributor.rivals.ended(ticket, ended)
        try:
            attribution = await self._attribution(record, pending)
        finally:
            if attributor is not None and ticket is not None:
                attributor.rivals.settle(ticket)
        schema = await self._schema(record, pending, errors, attribution)
        images = None
        if pending.images is not None:
            images, error = await self._images.fields(record, pending.images, pending.image_count)
            if error is not None:
                errors.append(f"images: {error}")
        outputs = None
        if obs is not None:
            outputs, more = await self._outputs.count(obs, pending.facts.model)
            errors.extend(more)
        return assemble(record, schema, attribution, images, outputs, accounting_note(errors))

    async def _schema(
        self,
        record: Record,
        pending: Pending,
        errors: list[str],
        attribution: AttributionFields | None,
    ) -> SchemaFields | None:
        """The schema's fields, priced for ``record`` (its failure into ``errors``), with
        the prompt's ``attribution`` saying whether an earlier prompt held it in place."""
        if pending.schema is None:
            return None
        # three look-up rounds in a row, each bounded by the session's timeout
        info, error = await joined(pending.schema, 3 * self._timeout)
        if info is None:
            errors.append(f"schema: {error}")
            return None
        model = await self._lookups.model_key(pending.facts.model)
        return self._schemas.price(record, info, model, self.reference_ms_per_token, attribution)

    async def _attribution(self, record: Record, pending: Pending) -> AttributionFields | None:
        """The prefix fields, from the prompt's rendering once it is done."""
        if pending.prompt is None or self.attributor is None:
            return None
        prompt, error = await joined(pending.prompt, 3 * self._timeout)
        if prompt is None:
            return AttributionFields(attribution_error=error)
        rate = self.reference_ms_per_token
        return self.attributor.attribute(
            record, pending.facts, prompt, rate, pending.conversation, pending.ticket
        )

    def snapshot(self) -> dict[str, Any]:
        """The ``/stats`` ``schemas`` section (see :meth:`SchemaCosts.snapshot`)."""
        return self._schemas.snapshot()
