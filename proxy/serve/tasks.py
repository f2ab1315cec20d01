"""Background tasks that cannot vanish: the event loop keeps only a weak reference to a task,
so one nobody holds can be collected mid-flight. ``spawn`` keeps it in a set until it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["spawn"]

T = TypeVar("T")


def spawn(coro: Coroutine[Any, Any, T], keep: set[asyncio.Future[Any]]) -> asyncio.Task[T]:
    """Start ``coro`` as a task held in ``keep`` until it is done."""
    task = asyncio.get_running_loop().create_task(coro)
    keep.add(task)
    task.add_done_callback(keep.discard)
    return task
