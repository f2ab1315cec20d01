"""The read and write deadlines of one exchange, on one :func:`asyncio.timeout`.

Each read from the upstream and each write to the agent has its own limit (``idle_timeout_s``,
``write_timeout_s``; 0 is none), so a stream that keeps moving never expires however long it
runs. Starting a read or a write only notes when it is due: a stream makes two of them per
chunk, and moving a timer each time (cancel, new handle, heap push) costs more than the rest
of the relay loop. One watch timer checks instead: it wakes no later than the current
operation is due, and no later than the shortest limit after it was set (so no operation
started since can be due before it); awake, it either finds the operation due and fires the
:func:`asyncio.timeout`, or sets itself again. The timeout fires at the due time, as a timer
moved on every operation would.

When it fires, :func:`asyncio.timeout` cancels the task and raises ``TimeoutError`` at the
end of the ``async with``; :attr:`Deadlines.expired` then says which of the two it was.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
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
        limits = [s for s in (read_s, write_s) if s > 0]
        self._step = min(limits) if limits else 0.0
        """The shortest limit: no operation started after a moment is due sooner after it."""
        self._phase: T | None = None
        self._due: float | None = None
        self._timeout: asyncio.Timeout | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._fired: T | None = None
        self._has_fired = False
        self.expired: T | None = None
        """What expired (``on_read`` or ``on_write``), once the timeout fired."""

    def watching(self) -> Deadlines[T]:
        """The deadlines apply inside ``async with``; ``TimeoutError`` when one expired."""
        return self

    async def __aenter__(self) -> Deadlines[T]:
        timeout = asyncio.timeout(None)
        await timeout.__aenter__()
        self._timeout = timeout
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        timeout, self._timeout = self._timeout, None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        assert timeout is not None
        try:
            await timeout.__aexit__(exc_type, exc, tb)  # TimeoutError when it fired
        except TimeoutError:
            if timeout.expired():
                self.expired = self._fired
            raise

    @property
    def due(self) -> float | None:
        """The loop time the current read or write expires (``None``: nothing is due)."""
        return self._due

    def _start(self, phase: T | None, limit: float) -> None:
        if self._timeout is None or self._has_fired:  # its phase stays the one that expired
            return
        self._phase = phase
        if limit <= 0:
            self._due = None
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._due = now + limit
        if self._watch is None:
            self._watch = loop.call_at(now + min(limit, self._step), self._check)

    def _check(self) -> None:
        """The watch timer: fire the timeout if the current operation is due, else wake
        again when it is due or after the shortest limit, whichever is first."""
        self._watch = None
        due, timeout = self._due, self._timeout
        if due is None or timeout is None or self._has_fired:
            return  # idle: the next operation sets the watch again
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= due:
            self._has_fired, self._fired = True, self._phase
            timeout.reschedule(now)
        else:
            self._watch = loop.call_at(min(due, now + self._step), self._check)

    def reading(self) -> None:
        """A read starts now."""
        self._start(self._on_read, self._read_s)

    def writing(self) -> None:
        """A write starts now."""
        self._start(self._on_write, self._write_s)

    def idle(self) -> None:
        """Neither reading nor writing: nothing can expire."""
        self._start(None, 0.0)
