"""The single-timer read/write deadlines of the relay."""

from __future__ import annotations

import asyncio

import pytest

from proxy.serve.deadline import Deadlines


class TestDeadlines:
    """One timer watches reads and writes; expiry cancels the task and names the phase."""

    async def test_slow_read_expires_as_read(self) -> None:
        """A read longer than the read limit cancels the task and reports the read outcome."""
        d = Deadlines(0.05, 1.0, "read", "write")
        d.reading()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(1)
        assert d.expired == "read"
        assert d.expired_cancel() is True
        d.stop()

    async def test_slow_write_expires_as_write(self) -> None:
        """A write longer than the write limit reports the write outcome, even when the timer
        had been armed for a later read deadline."""
        d = Deadlines(5.0, 0.05, "read", "write")
        d.reading()
        await asyncio.sleep(0.01)
        d.writing()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(1)
        assert d.expired == "write"
        assert d.expired_cancel() is True
        d.stop()

    async def test_steady_progress_never_expires(self) -> None:
        """Many short reads and writes, each well inside its limit, add up past both limits
        without expiring: the limits are per operation, not per exchange."""
        # limits 25x each operation, so a loaded machine's late wake-ups stay inside them
        d = Deadlines(0.25, 0.25, "read", "write")
        for _ in range(40):  # about 0.6 s in all: past both limits
            d.reading()
            await asyncio.sleep(0.01)
            d.writing()
            await asyncio.sleep(0.005)
        d.idle()
        await asyncio.sleep(0.3)
        assert d.expired is None
        d.stop()

    async def test_zero_disables(self) -> None:
        """Limits of 0 never expire and arm no timer."""
        d = Deadlines(0.0, 0.0, "read", "write")
        d.reading()
        await asyncio.sleep(0.05)
        d.writing()
        await asyncio.sleep(0.05)
        assert d.expired is None
        assert d._handle is None
        d.stop()

    async def test_foreign_cancellation_is_not_consumed(self) -> None:
        """A cancellation from elsewhere (the agent hung up) is not mistaken for a timeout."""
        d = Deadlines(5.0, 5.0, "read", "write")
        task = asyncio.current_task()
        assert task is not None
        d.reading()
        asyncio.get_running_loop().call_later(0.01, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(1)
        assert d.expired_cancel() is False
        task.uncancel()
        d.stop()
