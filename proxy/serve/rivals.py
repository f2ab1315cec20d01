"""The requests being attributed, by their wall interval on the relay's clock: which others
held one of llama-server's slots when a request's prefill began. A request can reuse no prefix
of those (their slots were busy), and one of them may hold the slot that had its own.

A request is opened when it is sent (with its prompt's rendering), ended when its exchange
ends, and settled once attributed; its prefill began at its end less llama-server's prefill
and decode times (``timings``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.core.in_flight import InFlight
from proxy.core.lineage import Rival
from proxy.core.prefix import RenderedPrompt
from proxy.core.record import Record

__all__ = ["Rivals"]


@dataclass(slots=True)
class _Flying:
    """A request being attributed: its prompt's rendering, and its number once attributed."""

    prompt: asyncio.Future[RenderedPrompt]
    seq: int | None = None


class Rivals:
    """The requests of each prompt cache in flight, and who ran beside whom."""

    def __init__(self) -> None:
        self._in_flight: InFlight[_Flying] = InFlight()

    def opened(self, cache: str, prompt: asyncio.Future[RenderedPrompt], at: float) -> int:
        """A request to ``cache`` whose ``prompt`` is being rendered was sent at ``at``: its
        ticket."""
        return self._in_flight.open(cache, at, _Flying(prompt))

    def ended(self, ticket: int, at: float) -> None:
        """The request's exchange ended at ``at``."""
        self._in_flight.ended(ticket, at)

    def attributed(self, ticket: int | None, seq: int) -> None:
        """The request was attributed as prompt number ``seq``."""
        flying = self._in_flight.item(ticket) if ticket is not None else None
        if flying is not None:
            flying.seq = seq

    def settle(self, ticket: int) -> None:
        """The request is attributed (or never will be)."""
        self._in_flight.settle(ticket)

    def beside(self, ticket: int | None, record: Record) -> list[Rival]:
        """The requests to the same cache in flight when ``record``'s prefill began, those
        whose prompt is rendered; none when its end or llama-server's times are unknown."""
        end = self._in_flight.end_of(ticket) if ticket is not None else None
        if ticket is None or end is None or record.prefill_ms is None:
            return []
        began = end - (record.prefill_ms + (record.decode_ms or 0.0)) / 1000
        return [
            Rival(f.prompt.result(), f.seq)
            for f in self._in_flight.beside(ticket, began)
            if f.prompt.done() and not f.prompt.cancelled() and f.prompt.exception() is None
        ]

    def __len__(self) -> int:
        return len(self._in_flight)
