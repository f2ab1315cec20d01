"""Prefix attribution beside the relay: each chat or tool prompt rendered and tokenized by the
served llama-server, matched against the recent ones, and joined to the record with the
cause of its paid prefill.

The look-ups (``/apply-template``, ``/tokenize`` with pieces) use the accounting's own
session, start when the request arrives, and are cached by the prompt's content: a retry
costs none. At most two renderings run at once. The matching and the findings are
:mod:`proxy.core.prefix` and :mod:`proxy.core.findings`; the record names sections, never
text, unless ``[privacy] show_diff_text`` is on.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from proxy.core.dialects import CHAT_COMPLETIONS
from proxy.core.findings import Cause, Findings, Loss, dropped_section, loss_of
from proxy.core.lineage import Attribution, PromptHistory
from proxy.core.partials import AttributionFields
from proxy.core.prefix import RenderedPrompt
from proxy.core.record import Kind, Record
from proxy.core.request import RequestFacts
from proxy.core.schema import digest, for_counting
from proxy.serve.rivals import Rivals
from proxy.serve.tasks import spawn

__all__ = ["Attributor", "chat_body_of", "conversation_id_of"]

DIFF_CONTEXT = 80
"""Characters shown on each side of a change when ``show_diff_text`` is on."""

Post = Callable[[str, dict[str, Any]], Awaitable[Any]]


def chat_body_of(facts: RequestFacts) -> dict[str, Any] | None:
    """The request as the Chat Completions body llama-server renders (None: no such form)."""
    body, dialect = facts.body, facts.dialect
    if body is None:
        return None
    if dialect is CHAT_COMPLETIONS:
        return for_counting(body)
    if dialect.chat_form is None:
        return None
    return for_counting(dialect.chat_form(body))


def conversation_id_of(body: dict[str, Any] | None, key: bytes | None) -> str | None:
    """An id the agent sent for its conversation: ``user``, or ``metadata.user_id``. These
    name end users (often an e-mail address), not conversations: with ``key`` the id is
    ``u:`` and 10 hex digits of its HMAC-SHA256 under ``key``, the same for the same id;
    without, the id as sent (``[privacy] raw_conversation_ids``)."""
    if body is None:
        return None
    user = body.get("user")
    metadata = body.get("metadata")
    if not (isinstance(user, str) and user):
        user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not (isinstance(user, str) and user):
        return None
    if key is None:
        return user
    mac = hmac.new(key, user.encode(errors="surrogatepass"), hashlib.sha256)
    return "u:" + mac.hexdigest()[:10]


def _size(task: asyncio.Task[RenderedPrompt]) -> int:
    """What a cached rendering holds (0 while in flight or failed)."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return 0
    return task.result().nbytes


def _around(prompt: RenderedPrompt, token: int) -> dict[str, str]:
    """Up to :data:`DIFF_CONTEXT` characters of the rendered text on each side of ``token``."""
    text = prompt.text or ""
    at = prompt.starts[token] if token < len(prompt.starts) else len(text)
    return {
        "before": text[max(0, at - DIFF_CONTEXT) : at],
        "after": text[at : at + DIFF_CONTEXT],
    }


@dataclass(frozen=True, slots=True)
class _Priced:
    """What a record's loss cost, as its fields say it."""

    section: str | None
    """The section named: where the prompt diverged, or what the template dropped."""
    lost_ms: float | None = None
    cache_cause: str | None = None
    cache_ms: float | None = None
    total_ms: float | None = None
    """The ms lost in all, for the conversation's total (None: nothing lost)."""


def _priced(tokens: int | None, ms_per_token: float | None) -> float | None:
    """``tokens`` at ``ms_per_token`` (None when either is unknown or nothing was lost)."""
    return round(tokens * ms_per_token, 3) if tokens and ms_per_token else None


UNSUPPORTED_RETRY_S = 60.0
"""After the upstream answered a look-up with 404/405/501 (a server without
``/apply-template`` or ``/tokenize``), no prompt is rendered for this long: every request
would otherwise pay the failed look-ups again."""
OFFSETS_KEPT = 64
"""Models whose BOS offset is kept; the names come from clients, so the map is bounded."""


class LookupUnsupported(Exception):
    """The upstream has no such endpoint (it answered 404, 405 or 501)."""


class ImagesInPrompt(Exception):
    """The prompt has image parts: its token positions are not modelled (the record's
    ``attribution_error`` names this class)."""


class Attributor:
    """Renders prompts, keeps the recent ones, and attributes each record's prefill."""

    def __init__(
        self,
        post: Post,
        *,
        history: int = 64,
        cache_entries: int = 256,
        keep_text: bool = False,
        raw_conversation_ids: bool = False,
        on_event: Callable[..., None] | None = None,
        context_size: Callable[[str | None], int | None] = lambda _: None,
        routed: Callable[[], bool] = lambda: False,
        max_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
        slots: Callable[[str | None], int | None] = lambda _: None,
    ) -> None:
        self._post = post
        self._clock = clock
        self._unsupported_until = float("-inf")
        self._unsupported: asyncio.Future[RenderedPrompt] | None = None
        self._keep_text = keep_text
        self._id_key = None if raw_conversation_ids else secrets.token_bytes(32)
        """The key of the body's conversation ids' hashes: this process's own."""
        self._max = cache_entries
        self._max_bytes = max_bytes
        self._cache: OrderedDict[str, asyncio.Task[RenderedPrompt]] = OrderedDict()
        self._background: set[asyncio.Future[None]] = set()
        self._slots = asyncio.Semaphore(2)
        self._offsets: dict[str, int] = {}
        """Per model named in the body: the count of tokens llama-server puts before the
        template's text (BOS). Keyed by the name whether or not the upstream routes by it, so
        a prompt rendered before the router was known finds its offset afterwards."""
        self.history = PromptHistory(size=history, max_bytes=max_bytes)
        self.findings = Findings()
        self.conversations: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._on_event = on_event or (lambda *a, **k: None)
        self._context_size = context_size
        self._slots_of = slots
        self._routed = routed
        self.rivals = Rivals()
        """Who held a slot beside whom when its prefill began."""

    def _model_key(self, facts: RequestFacts) -> str:
        """Whose cache a prompt goes to: the request's model when the upstream routes by it
        (llama-server's router mode), else the one model a single server has."""
        return self._key(facts.model)

    def _key(self, model: Any) -> str:
        return model if isinstance(model, str) and self._routed() else ""

    def offset(self, model: Any) -> int:
        """The tokens llama-server puts before the template's text for ``model`` (the body's
        name): 0 until a rendering for it asked."""
        return self._offsets.get(_named(model), 0)

    def cache_key(self, model: Any) -> str:
        """Whose cache a prompt for ``model`` (the body's name) goes to."""
        return self._key(model)

    def close(self) -> None:
        """Cancel renderings in flight."""
        for task in self._cache.values():
            task.cancel()

    def begin(self, facts: RequestFacts) -> asyncio.Future[RenderedPrompt] | None:
        """Start rendering a chat or tool prompt (cached by its content); None otherwise.
        Within :data:`UNSUPPORTED_RETRY_S` of the upstream refusing a look-up, the answer is
        that refusal at once, with no request made."""
        if facts.kind not in (Kind.CHAT, Kind.TOOL):
            return None
        if self._clock() < self._unsupported_until and self._unsupported is not None:
            return self._unsupported
        chat = chat_body_of(facts)
        if chat is None:
            return None
        key = digest(chat)
        task = self._cache.get(key)
        if task is not None and not (task.done() and (task.cancelled() or task.exception())):
            self._cache.move_to_end(key)
            return task
        task = spawn(self._render(chat), self._background)
        self._cache[key] = task
        self._trim()
        task.add_done_callback(lambda _: self._trim())  # its size is known once it is done
        return task

    def _trim(self) -> None:
        """Keep the renderings within the count and the bytes (the least recent go; one in
        flight counts nothing until it is done)."""
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        total = self.cached_bytes
        while total > self._max_bytes and len(self._cache) > 1:
            _, task = self._cache.popitem(last=False)
            total -= _size(task)

    @property
    def cached_bytes(self) -> int:
        """About the memory the cached renderings take."""
        return sum(_size(t) for t in self._cache.values())

    async def _render(self, chat: dict[str, Any]) -> RenderedPrompt:
        try:
            return await self._rendered(chat)
        except LookupUnsupported as exc:
            self._unsupported_until = self._clock() + UNSUPPORTED_RETRY_S
            refused: asyncio.Future[RenderedPrompt] = asyncio.get_running_loop().create_future()
            refused.set_exception(exc)
            refused.exception()  # retrieved: those who join it get it, nobody else warns
            self._unsupported = refused
            raise

    async def _rendered(self, chat: dict[str, Any]) -> RenderedPrompt:
        if CHAT_COMPLETIONS.image_parts is not None and CHAT_COMPLETIONS.image_parts(chat):
            # /tokenize reads the media marker as text, not as the image's block of tokens:
            # every position after it would be wrong, so such a prompt is not attributed
            raise ImagesInPrompt
        # the chat body names the request's model: a router answers for it, so the
        # tokenizations name it too
        model = {"model": chat["model"]} if isinstance(chat.get("model"), str) else {}
        key = _named(chat.get("model"))
        async with self._slots:
            if key not in self._offsets:
                if len(self._offsets) >= OFFSETS_KEPT:
                    self._offsets.clear()  # names are the client's: bounded, re-asked
                bos = await self._post("/tokenize", {"content": "", "add_special": True, **model})
                self._offsets[key] = len(bos["tokens"])
            text = str((await self._post("/apply-template", chat))["prompt"])
            got = await self._post(
                "/tokenize",
                {
                    "content": text,
                    "add_special": False,
                    "parse_special": True,
                    "with_pieces": True,
                    **model,
                },
            )
        tokens = got["tokens"]
        ids = [int(t["id"]) for t in tokens]
        pieces = [p.encode() if isinstance(p := t["piece"], str) else bytes(p) for t in tokens]
        return await asyncio.to_thread(
            RenderedPrompt.build, ids, pieces, text, chat, self._keep_text
        )

    def attribute(
        self,
        record: Record,
        facts: RequestFacts,
        prompt: RenderedPrompt,
        ms_per_token: float | None,
        conversation: str | None = None,
        ticket: int | None = None,
    ) -> AttributionFields:
        """The record's prefix fields for its rendered ``prompt``; counts the finding.
        ``conversation`` is the id the agent sent in a header, if any (before the body's);
        ``ticket`` is the request's among :attr:`rivals`."""
        offset = self._offsets.get(_named(facts.model), 0)
        if ms_per_token is None and record.prefill_ms is not None and record.prompt_n:
            # no reference rate yet: this request's own
            ms_per_token = record.prefill_ms / record.prompt_n
        if record.prompt_tokens is not None and len(prompt) + offset != record.prompt_tokens:
            # the rendering is not the prompt llama-server evaluated (another API's form
            # the proxy does not mirror): no position can be trusted
            return AttributionFields(attribution_error="rendered_prompt_differs")
        a = self.history.attribute(
            prompt,
            offset=offset,
            cache_n=record.cache_n,
            ms_per_token=ms_per_token,
            conversation_id=conversation or conversation_id_of(facts.body, self._id_key),
            model=self._model_key(facts),
            rivals=self.rivals.beside(ticket, record),
        )
        self.rivals.attributed(ticket, self.history.last_seq)
        self.history.answered(self.history.last_seq, record.predicted_n, record.prompt_tokens)
        loss = loss_of(
            a,
            cache_prompt=(facts.body or {}).get("cache_prompt") is not False,
            missing=prompt.missing,
            n_ctx=self._context_size(facts.model),
            prompt_n=record.prompt_n,
            slots=self._slots_of(facts.model),
        )
        priced = self._count_loss(record, a, loss, prompt, ms_per_token)
        self._count_conversation(a.conversation, a.turn, record, priced.total_ms)
        text = None
        if self._keep_text and prompt.text is not None and a.diverged_at is not None:
            text = _around(prompt, a.diverged_at - offset)
        return AttributionFields(
            prefix_kind=str(a.prefix_kind),
            reusable_tokens=a.reusable_tokens,
            cache_lost_tokens=a.cache_lost_tokens,
            diverged_at=a.diverged_at,
            diverged_section=priced.section,
            diverged_offset=a.diverged_offset,
            diverged_cost_ms=a.diverged_cost_ms,
            prefill_cause=str(loss.cause) if loss.cause is not None else None,
            prefill_lost_ms=priced.lost_ms,
            prefill_lost_tokens=loss.tokens if loss.cause is not None else None,
            cache_lost_cause=priced.cache_cause,
            cache_lost_ms=priced.cache_ms,
            conversation=a.conversation,
            turn=a.turn,
            diverged_text=text,
            attribution_error="predecessor_unknown" if a.predecessor_unknown else None,
        )

    def _count_loss(
        self,
        record: Record,
        a: Attribution,
        loss: Loss,
        prompt: RenderedPrompt,
        ms_per_token: float | None,
    ) -> _Priced:
        """Price the loss and count its findings."""
        section = a.diverged_section
        if loss.cause is None:
            return _Priced(section)
        if loss.cause is Cause.TEMPLATE_DROPS_HISTORY:
            section = dropped_section(prompt.missing)
        lost_ms = _priced(loss.tokens, ms_per_token)
        self.findings.add(loss.cause, section, loss.tokens, lost_ms, a.diverged_offset)
        self._on_event(
            "prefill_cause", id=record.id, cause=str(loss.cause), section=section, lost_ms=lost_ms
        )
        if loss.cache_cause is None:
            return _Priced(section, lost_ms, total_ms=lost_ms)
        cache_ms = _priced(loss.cache_tokens, ms_per_token)
        self.findings.add(loss.cache_cause, None, loss.cache_tokens, cache_ms)
        total = (lost_ms or 0.0) + (cache_ms or 0.0)
        return _Priced(section, lost_ms, str(loss.cache_cause), cache_ms, total)

    def _count_conversation(
        self, name: str, turn: int, record: Record, lost_ms: float | None
    ) -> None:
        entry = self.conversations.get(name)
        if entry is None:
            entry = self.conversations[name] = {
                "turns": 0,
                "requests": 0,
                "prefill_ms": 0.0,
                "lost_ms": 0.0,
            }
            while len(self.conversations) > 100:
                self.conversations.popitem(last=False)
        self.conversations.move_to_end(name)
        entry["turns"] = max(entry["turns"], turn)
        entry["requests"] += 1
        entry["prefill_ms"] = round(entry["prefill_ms"] + (record.prefill_ms or 0.0), 3)
        entry["lost_ms"] = round(entry["lost_ms"] + (lost_ms or 0.0), 3)

    def snapshot(self) -> dict[str, Any]:
        """``/stats`` ``cache.findings`` and ``conversations``."""
        return {
            "findings": [f.to_dict() for f in self.findings.ranked()],
            "conversations": dict(self.conversations),
        }


def _named(model: Any) -> str:
    """The model a body names, or "" when it names none."""
    return model if isinstance(model, str) else ""
