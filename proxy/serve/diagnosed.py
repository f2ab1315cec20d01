"""Prompt-cache diagnostics served, beside the relay: only for a request that asks
(:func:`proxy.core.cache_answer.asked`); every other response goes as the relay sends it.

:class:`Comparisons` keeps, per response id the proxy relayed (``chatcmpl-…`` of Messages
and Chat Completions, ``resp_…`` of Responses), the prompt of its request as the
attribution rendered it (token ids and sections, no text) and its model, as many as the
attribution's history keeps (``[accounting] attribution_history``). :class:`Diagnosing` is
one asking request's answer: a plain body is read whole, gets the answer and its new
``Content-Length``; a stream is held at the answer's event (Messages' ``message_start``,
Responses' ``response.completed``, Chat Completions' chunk with the counts) until the
answer is ready, at most :data:`WAIT_S` (then it says ``unavailable``), and the bytes
before and after that event go as they come.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson

from proxy.core.annotate import Anchor, Splitter
from proxy.core.bounded import Bounded
from proxy.core.cache_answer import (
    ANCHOR_EVENTS,
    UNAVAILABLE_DIAGNOSIS,
    Asked,
    ChatSplitter,
    answer,
    asked,
    with_member,
    with_member_in_event,
)
from proxy.core.diagnostics import Diagnosis, diagnose
from proxy.core.prefix import RenderedPrompt
from proxy.core.record import Outcome, ServerTimings
from proxy.core.turns import compare
from proxy.serve.accounting import Accounting, Pending
from proxy.serve.annotated import Note
from proxy.serve.attribution import Attributor
from proxy.serve.deadline import Deadlines
from proxy.serve.flight import Flight
from proxy.serve.whole import read_whole

__all__ = ["WAIT_S", "Comparisons", "Diagnosing", "comparisons_for"]

WAIT_S = 2.0
"""How long an answer waits for its request's rendering (it starts when the request
arrives, so it is normally done before the first token)."""

Read = Callable[[], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class Kept:
    """What is kept of one relayed response's request."""

    prompt: RenderedPrompt
    model: str
    """Whose cache the prompt went to (the attribution's model key)."""


class Comparisons:
    """The prompts of the responses relayed, by response id, and the diagnoses against them."""

    def __init__(
        self,
        attributor: Attributor,
        rate: Callable[[], float | None],
        clock: Callable[[], float],
        limit: int,
    ) -> None:
        self.clock = clock
        """The relay's clock (the tracker's times are on it)."""
        self._attributor = attributor
        self._rate = rate
        self.kept: Bounded[str, Kept] = Bounded(limit)

    def keep(self, response_id: str | None, pending: Pending | None) -> None:
        """Keep the prompt of the response ``response_id`` once it is rendered (its text
        dropped); nothing when either is unknown or the rendering failed."""
        if response_id is None or pending is None or pending.prompt is None:
            return
        model = self._attributor.cache_key(pending.facts.model)
        kept = self.kept

        def put(future: asyncio.Future[RenderedPrompt]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            prompt = dataclasses.replace(future.result(), text=None)
            kept.put(response_id, Kept(prompt, model))

        if pending.prompt.done():
            put(pending.prompt)
        else:
            pending.prompt.add_done_callback(put)

    async def diagnosis(
        self,
        asking: Asked,
        pending: Pending | None,
        usage: ServerTimings | None,
        flush: Callable[[], None],
        own_rate: float | None = None,
    ) -> Diagnosis | None:
        """The diagnosis of this request against the response it names (None: it names
        none); ``unavailable`` when its prompt or counts are not known in time, or its
        rendering is not the prompt llama-server evaluated. ``flush`` hands off the records
        of exchanges that ended (a response that just ended is then known). The missed ms
        are at the reference rate, else at ``own_rate`` (this response's ``timings``)."""
        if asking.previous is None:
            return None
        prompt = await _rendered(pending)
        if prompt is None or pending is None or usage is None:
            return UNAVAILABLE_DIAGNOSIS
        if usage.prompt_n is None or usage.cache_n is None:
            return UNAVAILABLE_DIAGNOSIS
        model = pending.facts.model
        offset = self._attributor.offset(model)
        prompt_tokens = usage.prompt_n + usage.cache_n
        if len(prompt) + offset != prompt_tokens:
            return UNAVAILABLE_DIAGNOSIS
        earlier = self.kept.get(asking.previous)
        if earlier is None:
            flush()
            earlier = self.kept.get(asking.previous)
        return diagnose(
            compare(prompt, earlier.prompt) if earlier is not None else None,
            same_model=earlier is None or earlier.model == self._attributor.cache_key(model),
            offset=offset,
            prompt_tokens=prompt_tokens,
            cache_n=usage.cache_n,
            ms_per_token=self._rate() or own_rate,
        )


async def _rendered(pending: Pending | None) -> RenderedPrompt | None:
    """The request's rendering, waited for at most :data:`WAIT_S` (never cancelled: the
    attribution shares it); None when there is none in time."""
    future = pending.prompt if pending is not None else None
    if future is None:
        return None
    await asyncio.wait({future}, timeout=WAIT_S)
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return future.result()


def comparisons_for(
    accounting: Accounting | None, clock: Callable[[], float]
) -> Comparisons | None:
    """The comparisons of a proxy whose accounting renders prompts (attribution on), as
    many responses kept as the attribution's history keeps prompts."""
    attributor = accounting.attributor if accounting is not None else None
    if accounting is None or attributor is None:
        return None
    rate = lambda: accounting.reference_ms_per_token  # noqa: E731
    return Comparisons(attributor, rate, clock, attributor.history.size)


class Diagnosing:
    """The answer of one request that asked for prompt-cache diagnostics."""

    def __init__(
        self,
        flight: Flight,
        comparisons: Comparisons,
        asking: Asked,
        note: Note | None,
        flush: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        self._flight = flight
        self._clock = clock
        self._comparisons = comparisons
        self._asking = asking
        self._note = note
        self._flush = flush
        event = ANCHOR_EVENTS.get(asking.api)
        self._splitter: Splitter | ChatSplitter = (
            Splitter(Anchor(event)) if event is not None else ChatSplitter(asking.usage_chunk)
        )
        self._event: bytes | None = None
        """The answer's event so far, once its first bytes were seen."""
        self._answered = False
        self._failure: aiohttp.ClientError | None = None

    @classmethod
    def of(
        cls,
        flight: Flight,
        upstream: aiohttp.ClientResponse,
        comparisons: Comparisons | None,
        note: Note | None,
        flush: Callable[[], None],
    ) -> Diagnosing | None:
        """The answer of ``flight``'s request, if it asked and the upstream answered it
        (200, not compressed); None leaves the response to the relay as it is."""
        if comparisons is None or upstream.status != 200:
            return None
        if upstream.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
            return None
        asking = asked(flight.analysed())
        if asking is None:
            return None
        return cls(flight, comparisons, asking, note, flush, comparisons.clock)

    async def _member(self, obj: object) -> tuple[str, object]:
        """The answer's field and value for the body or event ``obj`` (its usage)."""
        flight = self._flight
        usage = timings = None
        if isinstance(obj, dict):
            usage = flight.facts.dialect.usage(obj)
            timings = ServerTimings.from_json(obj.get("timings"))
            if usage is None or usage.cache_n is None:
                usage = timings  # a Chat Completions chunk without usage has the timings
        rate = None
        if timings is not None and timings.prompt_ms and timings.prompt_n:
            rate = timings.prompt_ms / timings.prompt_n
        try:
            diagnosis = await self._comparisons.diagnosis(
                self._asking, flight.beside.pending, usage, self._flush, rate
            )
        except Exception as exc:  # the answer must never disturb the relay
            flight.beside.annotate_error = f"diagnostics: {type(exc).__name__}"
            diagnosis = UNAVAILABLE_DIAGNOSIS
        return answer(self._asking.api, diagnosis)

    # a plain body: read whole, answered, its length set

    async def read_whole(
        self, upstream: aiohttp.ClientResponse, deadlines: Deadlines[Outcome]
    ) -> tuple[bytes, str | None]:
        """The whole body (fed to the tracker as it came) with the answer in it, and the
        failure that ended the reading early (then the body goes as it came)."""
        if self._note is not None and self._note.holds():
            body, failure = await self._note.read_whole(upstream, deadlines)
        else:
            reply = self._flight.reply
            assert reply is not None
            body, failure = await read_whole(upstream, deadlines, reply.tracker, self._clock)
        if failure is not None:
            return body, failure
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body, None
        key, value = await self._member(obj)
        changed = with_member(body, key, value)
        if changed is None:
            return body, None
        reply = self._flight.reply
        assert reply is not None
        reply.resp.content_length = len(changed)  # the agent asked for the longer body
        return changed, None

    # an event stream: held at the answer's event

    def reader(self, read: Read) -> Read:
        """``read`` with the answer's event held until the answer is in it: it returns
        ``b""`` only at the end, after every byte it held."""

        async def next_chunk() -> bytes:
            if self._failure is not None:
                raise self._failure
            while True:
                try:
                    chunk = await read()
                except aiohttp.ClientError as exc:
                    held = self._release()
                    if not held:
                        raise
                    self._failure = exc
                    return held
                if self._answered or not chunk:
                    return chunk or self._release()
                out = await self._pass(chunk)
                if out:
                    return out

        return next_chunk

    async def _pass(self, chunk: bytes) -> bytes:
        """What of ``chunk`` goes now: before the answer's event, or the event answered and
        what follows it; nothing while the event is not whole."""
        out = b""
        if self._event is None:
            out, rest = self._splitter.split(chunk)
            if rest is None:
                return out
            self._event = rest
        else:
            self._event += chunk
        end = self._event.find(b"\n\n")
        if end < 0:
            return out
        event, after = self._event[: end + 2], self._event[end + 2 :]
        self._event, self._answered = None, True
        return out + await self._answered_event(event) + after

    async def _answered_event(self, event: bytes) -> bytes:
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    obj = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    return event
                key, value = await self._member(obj)
                return with_member_in_event(event, self._asking.api, key, value)
        return event

    def _release(self) -> bytes:
        """The bytes held when the stream ends or fails: they go as they came."""
        held, _ = self._splitter.end()
        event, self._event = self._event or b"", None
        self._answered = True
        return held + event
