"""Which requests to one prompt cache were in flight at a given moment: when a request's
prefill began, the others that held llama-server's slots then. Pure: the times are the
caller's, on one clock.

A request is opened when it is sent, ended when its exchange ends and settled once it no
longer asks who ran beside it. An ended request is kept while a request that started before
its end is still unsettled (it may yet ask), and at most ``limit`` are kept in all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["InFlight"]

T = TypeVar("T")


@dataclass(slots=True)
class _Span(Generic[T]):
    key: str
    start: float
    item: T
    end: float | None = None
    settled: bool = False


@dataclass(slots=True)
class InFlight(Generic[T]):
    """Requests by cache ``key`` and wall interval, each with an ``item`` (its prompt)."""

    limit: int = 256
    _spans: dict[int, _Span[T]] = field(default_factory=dict)
    _next: int = 0

    def open(self, key: str, start: float, item: T) -> int:
        """A request to ``key``'s cache was sent at ``start``: its ticket."""
        self._next += 1
        self._spans[self._next] = _Span(key, start, item)
        while len(self._spans) > self.limit:
            del self._spans[next(iter(self._spans))]
        return self._next

    def ended(self, ticket: int, end: float) -> None:
        """The request's exchange ended at ``end``."""
        span = self._spans.get(ticket)
        if span is not None:
            span.end = end

    def item(self, ticket: int) -> T | None:
        """The request's item (None: no longer kept)."""
        span = self._spans.get(ticket)
        return span.item if span is not None else None

    def end_of(self, ticket: int) -> float | None:
        """When the request's exchange ended (None: not yet, or no longer kept)."""
        span = self._spans.get(ticket)
        return span.end if span is not None else None

    def beside(self, ticket: int, moment: float) -> list[T]:
        """The items of the other requests to the same cache in flight at ``moment``: sent
        at or before it and not ended by then."""
        span = self._spans.get(ticket)
        if span is None:
            return []
        return [
            other.item
            for number, other in self._spans.items()
            if number != ticket
            and other.key == span.key
            and other.start <= moment
            and (other.end is None or other.end > moment)
        ]

    def settle(self, ticket: int) -> None:
        """The request asks no more; forget what no unsettled request can ask about."""
        span = self._spans.get(ticket)
        if span is None:
            return
        span.settled = True
        if span.end is None:
            span.end = span.start
        waiting = [s.start for s in self._spans.values() if not s.settled]
        oldest = min(waiting, default=float("inf"))
        for number in [
            n for n, s in self._spans.items() if s.settled and s.end is not None and s.end <= oldest
        ]:
            del self._spans[number]

    def __len__(self) -> int:
        return len(self._spans)
