"""Per-exchange read and write deadlines with one timer instead of one per chunk.

``async with asyncio.timeout()`` around every read and every write costs about 6 µs each
(a new timer handle armed and cancelled each time): on a 25-chunk stream that is most of the
proxy's latency budget. Here the relay only stamps when a read or a write starts and ends
(an attribute store and a comparison), and a single timer, re-armed only when it would
fire too late or has fired early, checks the stamps. When one is overdue it cancels the
relay's task, exactly as ``asyncio.timeout`` does, and says which one expired.
"""

from __future__ import annotations

import asyncio
import time
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

T = TypeVar("T")
_NEVER = float("inf")


class Deadlines(Generic[T]):
    """Watches the current task's reads and writes; 0 disables a timeout.

    Use ``reading()``/``writing()`` before awaiting and ``idle()`` after; when a
    ``CancelledError`` reaches the caller, :meth:`expired_cancel` tells whether it came from
    here (and then consumes it) or from elsewhere (re-raise it).
    """

    def __init__(self, read_s: float, write_s: float, on_read: T, on_write: T) -> None:
        self._loop = asyncio.get_running_loop()
        # asyncio's own loops keep time with time.monotonic: called directly, without the
        # Python frame of loop.time() (another loop, uvloop's, keeps its own clock)
        plain = type(self._loop).time is asyncio.BaseEventLoop.time
        self._time = time.monotonic if plain else self._loop.time
        self._task = asyncio.current_task()
        self._read_s = read_s
        self._write_s = write_s
        self._on = (on_read, on_write)
        self._since: float | None = None
        self._writing = False
        self.expired: T | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = _NEVER
        """When the armed timer fires (``_NEVER`` when none is)."""
        # the first timer is armed for the shorter limit: the write after the first read
        # then finds it early enough, and one timer is armed per exchange, not two
        self._soonest = min(read_s, write_s) if read_s > 0 and write_s > 0 else max(read_s, write_s)

    # reading() and writing() run twice per relayed chunk: a clock read, two stores and
    # one comparison with the armed timer's due time, the timer re-armed only when it would
    # fire too late (the first operation, or a write shorter-limited than the read before)

    def reading(self) -> None:
        """A read starts now."""
        self._since = now = self._time()
        self._writing = False
        if self._read_s > 0 and now + self._read_s < self._due:
            self._arm(now + self._soonest)

    def writing(self) -> None:
        """A write starts now."""
        self._since = now = self._time()
        self._writing = True
        if self._write_s > 0 and now + self._write_s < self._due:
            self._arm(now + self._soonest)

    def _arm(self, due: float) -> None:
        """The timer fires at ``due`` instead of later (or never)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._due = _NEVER
        if self._task is not None:
            self._handle = self._loop.call_at(due, self._check)
            self._due = due

    def idle(self) -> None:
        """Neither reading nor writing."""
        self._since = None

    def _check(self) -> None:
        self._handle, self._due = None, _NEVER
        limit = self._write_s if self._writing else self._read_s
        now = self._time()
        if self._since is not None and limit > 0 and now >= self._since + limit:
            self.expired = self._on[1] if self._writing else self._on[0]
            assert self._task is not None
            self._task.cancel()
            return
        # not overdue: wait for the current operation's deadline, or for the next one to arm
        if self._since is not None and limit > 0:
            self._arm(self._since + limit)

    def expired_cancel(self) -> bool:
        """True when the cancellation being handled is this watchdog's (it is consumed)."""
        if self.expired is None or self._task is None:
            return False
        return self._task.uncancel() == 0

    def stop(self) -> None:
        """Disarm the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle, self._due = None, _NEVER
