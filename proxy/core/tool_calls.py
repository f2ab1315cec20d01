"""Tool calls assembled from the fragments a response streams, or a body states. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.core.dialects import ToolDelta

__all__ = ["MAX_ARGUMENT_BYTES", "ToolCall", "ToolCallAssembly"]

MAX_ARGUMENT_BYTES = 256 * 1024
"""Tool-call argument text kept per response (to check and count it); beyond it, every
call's arguments are dropped, and the fields read from them are unknown."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call as streamed: the name and the concatenated argument text.

    The arguments are model output: they are counted, never logged.
    """

    index: int
    name: str
    arguments: str


@dataclass(slots=True)
class _Call:
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallAssembly:
    """One response's calls by index: each name as last stated, the argument fragments in
    order, all of them within :data:`MAX_ARGUMENT_BYTES`."""

    __slots__ = ("_calls", "_size")

    def __init__(self) -> None:
        self._calls: dict[int, _Call] = {}
        self._size = 0

    def __bool__(self) -> bool:
        """Some fragment named a call, even one with no name or arguments."""
        return bool(self._calls)

    @property
    def dropped(self) -> bool:
        """The arguments went over :data:`MAX_ARGUMENT_BYTES`: every call's are dropped."""
        return self._size > MAX_ARGUMENT_BYTES

    def merge(self, deltas: Iterable[ToolDelta]) -> None:
        """Add fragments: a name replaces the call's name (a repeated name is the full new
        name, not a suffix), argument text is appended."""
        for index, name, args in deltas:
            call = self._calls.setdefault(index, _Call())
            if name is not None:
                call.name = name
            if args is not None and self._size <= MAX_ARGUMENT_BYTES:
                self._size += len(args)
                call.arguments.append(args)

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls in index order; their arguments empty when :attr:`dropped`."""
        dropped = self.dropped
        return tuple(
            ToolCall(i, c.name, "" if dropped else "".join(c.arguments))
            for i, c in sorted(self._calls.items())
        )
