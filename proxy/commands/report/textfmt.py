"""How the report's text writes numbers and lines, shared by its text modules.

Pure. Times are written by :func:`proxy.core.numbers.figure_or_dash` (``2,061``, ``93.5``,
``4.25``); rates with one decimal, counts with thousands separators; ``-`` is unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.core.numbers import figure_or_dash

__all__ = [
    "COL",
    "LABEL",
    "WIDTH",
    "Format",
    "integer",
    "labelled",
    "ms",
    "pct",
    "plural",
    "rate",
    "share",
    "table_row",
    "wrap",
]

Format = Callable[[float | None], str]

LABEL = 26
"""The label column of the kind tables."""
COL = 10
"""A number column."""
WIDTH = 100
"""The widest line the text wraps to."""

ms: Format = figure_or_dash
"""A time in ms (or any figure) with about three significant figures."""


def rate(value: float | None) -> str:
    """A rate with one decimal."""
    return "-" if value is None else f"{value:,.1f}"


def integer(value: float | None) -> str:
    """A count with thousands separators."""
    return "-" if value is None else f"{value:,.0f}"


def pct(value: float | None) -> str:
    """A percentage (0..100)."""
    return "-" if value is None else f"{value:.0f} %"


def share(value: float | None) -> str:
    """A ratio (0..1) as a percentage."""
    return "-" if value is None else f"{100 * value:.0f} %"


def plural(n: int, noun: str) -> str:
    """``1 line``, ``2 lines``."""
    return f"{n:,} {noun}{'s' if n != 1 else ''}"


def table_row(label: str, cells: Sequence[str]) -> str:
    """A kind table's row: the label, then right-aligned cells."""
    return f"  {label:<{LABEL}}" + "".join(f"{c:>{COL}}" for c in cells)


def labelled(label: str, text: str) -> str:
    """A kind table's line of text under its label."""
    return f"  {label:<{LABEL}}{text}"


def wrap(head: str, items: Sequence[str], width: int = WIDTH) -> list[str]:
    """``head`` and the comma-separated ``items`` in lines of at most ``width`` characters
    (unless one item is longer), the next lines indented by two spaces."""
    lines = [head.rstrip()]
    for i, item in enumerate(items):
        cell = item + ("," if i < len(items) - 1 else "")
        if len(lines[-1]) + 1 + len(cell) > width:
            lines.append("  " + cell)
        else:
            lines[-1] += " " + cell
    return lines
