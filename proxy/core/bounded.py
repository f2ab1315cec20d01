"""A mapping that keeps the most recently used entries within a count, and counts what it
let go. Pure.

Everything the proxy keeps per distinct thing a client sends (a tools array, a rendering)
grows with traffic unless it is bounded: the least recently used entry goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["Bounded"]

K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """At most ``limit`` entries; :meth:`get` and :meth:`put` make an entry the most recent."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.evicted = 0
        """Entries let go to stay within the limit."""
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The entry of ``key`` (now the most recent), or None."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` as the most recent; the least recent go past the
        limit."""
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)
            self.evicted += 1

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recent first."""
        return list(self._items.items())

    def values(self) -> list[V]:
        """The values, least recent first."""
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
