"""Numbers as the report, the roofline lines and the plot write them, in one rule.

Pure. About three significant figures, as the Jetson Orin Nano measurement this project
starts from writes them (``2,061`` ms, ``93.5`` ms, ``4.25`` ms); whole numbers without
decimals (``796``, ``9``).
"""

from __future__ import annotations

__all__ = ["figure", "figure_or_dash"]


def figure(value: float) -> str:
    """``value`` with about three significant figures: thousands separated and no decimals
    from 100 up (``2,061``), one decimal from 10 (``93.5``), two below (``4.25``, ``0.61``).

    A whole number has no decimals at any size (``796``, ``9``, ``0``).
    """
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def figure_or_dash(value: float | None) -> str:
    """:func:`figure`, or ``-`` for an unknown value (``None``)."""
    return "-" if value is None else figure(value)
