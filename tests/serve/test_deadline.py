"""The relay's read and write deadlines, on one ``asyncio.timeout``."""

from __future__ import annotations

import asyncio

import pytest

from proxy.serve.deadline import Deadlines


class TestDeadlines:
    """One timeout watches reads and writes; expiry raises TimeoutError and names the phase."""

    async def test_slow_read_expires_as_read(self) -> None:
        """A read longer than the read limit ends the block with TimeoutError and reports the
        read outcome."""
        d = Deadlines(0.05, 1.0, "read", "write")
        with pytest.raises(TimeoutError):
            async with d.watching():
                d.reading()
                await asyncio.sleep(1)
        assert d.expired == "read"

    async def test_slow_write_expires_as_write(self) -> None:
        """A write longer than the write limit reports the write outcome, even when the
        timeout had been set for a later read deadline."""
        d = Deadlines(5.0, 0.05, "read", "write")
        with pytest.raises(TimeoutError):
            async with d.watching():
                d.reading()
                await asyncio.sleep(0.01)
                d.writing()
                await asyncio.sleep(1)
        assert d.expired == "write"

    async def test_an_operation_started_after_the_watch_expires_at_its_own_due(self) -> None:
        """A write started after the watch timer was set expires, and not before its own
        limit has passed: the watch wakes early, finds nothing due, and waits for it."""
        loop = asyncio.get_running_loop()
        d = Deadlines(5.0, 0.1, "read", "write")
        with pytest.raises(TimeoutError):
            async with d.watching():
                d.reading()  # the watch wakes after the shortest limit, 0.1 s
                await asyncio.sleep(0.05)
                d.writing()  # due 0.1 s from now: after the watch's first wake-up
                started = loop.time()
                await asyncio.sleep(5)
        assert d.expired == "write"
        assert loop.time() - started >= 0.1

    async def test_steady_progress_never_expires(self) -> None:
        """Many short reads and writes, each well inside its limit, add up past both limits
        without expiring: the limits are per operation, not per exchange."""
        # limits 25x each operation, so a loaded machine's late wake-ups stay inside them
        d = Deadlines(0.25, 0.25, "read", "write")
        async with d.watching():
            for _ in range(40):  # about 0.6 s in all: past both limits
                d.reading()
                await asyncio.sleep(0.01)
                d.writing()
                await asyncio.sleep(0.005)
            d.idle()
            assert d.due is None
            await asyncio.sleep(0.3)
        assert d.expired is None

    async def test_zero_disables(self) -> None:
        """Limits of 0 never expire and set no deadline."""
        d = Deadlines(0.0, 0.0, "read", "write")
        async with d.watching():
            d.reading()
            assert d.due is None
            await asyncio.sleep(0.05)
            d.writing()
            assert d.due is None
            await asyncio.sleep(0.05)
        assert d.expired is None

    async def test_a_limit_sets_its_deadline(self) -> None:
        """A read with a limit is due that limit from now (the zero case above is not
        vacuous)."""
        d = Deadlines(5.0, 0.0, "read", "write")
        async with d.watching():
            d.reading()
            due = d.due
            assert due is not None
            assert 4.0 < due - asyncio.get_running_loop().time() <= 5.0

    async def test_foreign_cancellation_is_not_consumed(self) -> None:
        """A cancellation from elsewhere (the agent hung up) passes through as a cancellation,
        not mistaken for a timeout."""
        d = Deadlines(5.0, 5.0, "read", "write")
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.01, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            async with d.watching():
                d.reading()
                await asyncio.sleep(1)
        assert d.expired is None
        task.uncancel()

    async def test_a_timeout_error_from_inside_is_no_expiry(self) -> None:
        """A ``TimeoutError`` the code inside raises itself passes through unchanged, and
        nothing is named expired."""
        d = Deadlines(5.0, 5.0, "read", "write")
        own = TimeoutError("the code's own")
        with pytest.raises(TimeoutError) as raised:
            async with d.watching():
                d.reading()
                raise own
        assert raised.value is own
        assert d.expired is None

    async def test_calls_after_expiry_change_nothing(self) -> None:
        """A write started after the timeout fired, before its cancellation has ended the
        block, neither fails nor renames what expired."""
        d = Deadlines(0.01, 5.0, "read", "write")
        with pytest.raises(TimeoutError):
            async with d.watching():
                d.reading()
                try:
                    await asyncio.sleep(1)
                except asyncio.CancelledError:
                    d.writing()  # the timeout is expiring now
                    d.idle()
                    raise
        assert d.expired == "read"
