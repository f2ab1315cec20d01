"""The read and write deadlines of one exchange, on one :func:`asyncio.timeout`.

Each read from the upstream and each write to the agent has its own limit (``idle_timeout_s``,
``write_timeout_s``; 0 is none), so a stream that keeps moving never expires however long it
runs: the timeout is moved to ``now + limit`` whenever a read or a write starts, and off
between them. When it fires, :func:`asyncio.timeout` cancels the task and raises
``TimeoutError`` at the end of the ``async with``; :attr:`Deadlines.expired` then says which
of the two it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

T = TypeVar("T")


class Deadlines(Generic[T]):
    """Watches the reads and writes of the code inside :meth:`watching`.

    Call ``reading()`` or ``writing()`` before awaiting one, ``idle()`` when neither runs. A
    cancellation from elsewhere (the agent hung up) passes through untouched.
    """

    def __init__(self, read_s: float, write_s: float, on_read: T, on_write: T) -> None:
        self._read_s = read_s
        self._write_s = write_s
        self._on_read = on_read
        self._on_write = on_write
        self._phase: T | None = None
        self._timeout: asyncio.Timeout | None = None
        self.expired: T | None = None
        """What expired (``on_read`` or ``on_write``), once the timeout fired."""

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[Deadlines[T]]:
        """The deadlines apply inside; ``TimeoutError`` when one expired."""
        timeout = asyncio.timeout(None)
        try:
            async with timeout:
                self._timeout = timeout
                yield self
        except TimeoutError:
            if timeout.expired():
                self.expired = self._phase
            raise
        finally:
            self._timeout = None

    @property
    def due(self) -> float | None:
        """The loop time the current read or write expires (``None``: nothing is due)."""
        return self._timeout.when() if self._timeout is not None else None

    def _start(self, phase: T | None, limit: float) -> None:
        timeout = self._timeout
        if timeout is None or timeout.expired():  # fired: its phase stays the one that expired
            return
        self._phase = phase
        timeout.reschedule(asyncio.get_running_loop().time() + limit if limit > 0 else None)

    def reading(self) -> None:
        """A read starts now."""
        self._start(self._on_read, self._read_s)

    def writing(self) -> None:
        """A write starts now."""
        self._start(self._on_write, self._write_s)

    def idle(self) -> None:
        """Neither reading nor writing: nothing can expire."""
        self._start(None, 0.0)
