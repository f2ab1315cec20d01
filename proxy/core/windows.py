"""The ``/stats`` windows: the last N completed records of a kind as log-bucket histograms.

Pure. Each field's histogram is updated as a record enters the window and as the oldest one
leaves it, so a read walks the occupied buckets and sorts nothing. Each bucket holds the
values within a factor :data:`GAMMA` of each other and answers with their mean, so each
percentile is within :data:`ALPHA` (1 %) of the exact one of the same records (see
:func:`column_quantiles` for the statement). The storage is a fixed number of arrays of
numbers: full windows add nothing to a full collection's pause.
"""

from __future__ import annotations

import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from math import ceil, log
from typing import Any

from proxy.core.record import Record
from proxy.core.summaries import QUANTILES, SUMMARY_FIELDS, assemble_summary

__all__ = ["ALPHA", "GAMMA", "Window", "column_quantiles", "slots", "summary_row"]

_FIELDS = len(SUMMARY_FIELDS)
_DRAFT = SUMMARY_FIELDS.index("draft_acceptance")
_DECODE = SUMMARY_FIELDS.index("decode_tok_s")
_WITH = _FIELDS
"""The histogram column of ``decode_tok_s`` over the records that drafted."""
_WITHOUT = _FIELDS + 1
"""The histogram column of ``decode_tok_s`` over the records that did not."""
_COLUMNS = _FIELDS + 2

ALPHA = 0.01
"""The relative error of a ``/stats`` percentile against the exact one of the same records
(:func:`percentile` over the window's values), for values of one sign; see
:func:`column_quantiles`."""
GAMMA = 1.0 + ALPHA
"""The ratio between a histogram bucket's upper and lower bound."""
_INV_LN_GAMMA = 1.0 / math.log(GAMMA)
_TINY = 1e-9
"""Values within this of 0 share the zero bucket."""
_HUGE = 1e300
"""Values beyond this (and NaN) are left out, as unknown: no bucket holds infinity."""
_OFFSET = 1 - math.ceil(math.log(_TINY) * _INV_LN_GAMMA)
"""Makes a positive value's key at least 1 (a negative one's at most -1; 0 is the zero
bucket), so keys sort as their values."""
_NAN = math.nan

_Row = tuple[float | None, ...]
"""A record's :data:`SUMMARY_FIELDS`, in that order."""
summary_row: Callable[[Record], _Row] = operator.attrgetter(*SUMMARY_FIELDS)


def slots(row: _Row) -> tuple[array[float], array[int]]:
    """A record as a window stores it: one value per column (:data:`SUMMARY_FIELDS`, then
    ``decode_tok_s`` again in the with- or the without-draft column), NaN where unknown
    (``None``, not finite, or the other draft column), and each value's bucket key.

    The key of ``v`` is ``k`` for ``GAMMA**(k-1) < v <= GAMMA**k``, shifted by
    :data:`_OFFSET` to be at least 1, its mirror image for a negative value, and 0 within
    :data:`_TINY` of 0 (and for NaN, which no histogram counts): keys sort as the values.
    """
    values = [v if v is not None and -_HUGE < v < _HUGE else _NAN for v in row]
    rate = values[_DECODE]
    values += (rate, _NAN) if values[_DRAFT] == values[_DRAFT] else (_NAN, rate)
    keys = [
        _OFFSET + ceil(log(v) * _INV_LN_GAMMA)
        if v > _TINY
        else (-_OFFSET - ceil(log(-v) * _INV_LN_GAMMA) if v < -_TINY else 0)
        for v in values
    ]
    return array("d", values), array("i", keys)


class Window:
    """The last ``size`` completed records of a kind (or of an API's kind) as histograms.

    ``values`` and ``keys`` keep each record's :func:`slots` (a ring of ``size`` records
    once full) only so that the oldest can be taken out of the histograms when a new one
    pushes it out. Per column, three parallel arrays: ``order``, the occupied buckets' keys
    ascending, and each one's ``counts`` and ``sums``. Contiguous arrays make a read a walk
    through a few kilobytes per column, and they hold no object the garbage collector walks.
    """

    _slots__ = ("counts", "keys", "n", "order", "size", "slot", "sums", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.values = array("d")
        self.keys = array("i")
        self.slot = 0
        self.n = 0
        self.order: tuple[array[int], ...] = tuple(array("i") for _ in range(_COLUMNS))
        self.counts: tuple[array[int], ...] = tuple(array("q") for _ in range(_COLUMNS))
        self.sums: tuple[array[float], ...] = tuple(array("d") for _ in range(_COLUMNS))

    def copy(self) -> Window:
        """A window holding the same records, sharing nothing with this one."""
        new = Window(self.size)
        new.values, new.keys = array("d", self.values), array("i", self.keys)
        new.slot, new.n = self.slot, self.n
        new.order = tuple(array("i", a) for a in self.order)
        new.counts = tuple(array("q", a) for a in self.counts)
        new.sums = tuple(array("d", a) for a in self.sums)
        return new

    def push(self, values: array[float], keys: array[int]) -> None:
        """Add a record (its :func:`slots`), taking the oldest out once the window is
        full."""
        if self.n < self.size:
            self.values.extend(values)
            self.keys.extend(keys)
            self.n += 1
        elif self.size:
            start = self.slot * _COLUMNS
            end = start + _COLUMNS
            self._remove(self.values[start:end], self.keys[start:end])
            self.values[start:end] = values
            self.keys[start:end] = keys
            self.slot = (self.slot + 1) % self.size
        else:
            return
        orders, counts, sums = self.order, self.counts, self.sums
        for column, value in enumerate(values):
            if value == value:
                key = keys[column]
                order = orders[column]
                i = bisect_left(order, key)
                if i < len(order) and order[i] == key:
                    counts[column][i] += 1
                    sums[column][i] += value
                else:
                    order.insert(i, key)
                    counts[column].insert(i, 1)
                    sums[column].insert(i, value)

    def _remove(self, values: array[float], keys: array[int]) -> None:
        """Take a record out of the histograms (an emptied bucket goes)."""
        orders, counts, sums = self.order, self.counts, self.sums
        for column, value in enumerate(values):
            if value == value:
                order = orders[column]
                i = bisect_left(order, keys[column])
                if counts[column][i] == 1:
                    del order[i], counts[column][i], sums[column][i]
                else:
                    counts[column][i] -= 1
                    sums[column][i] -= value

    def column(self, column: int) -> dict[str, float | None]:
        """``{p50, p90, p99}`` of one column (:func:`column_quantiles`)."""
        return column_quantiles(self.counts[column], self.sums[column])

    def summary(self) -> dict[str, Any]:
        """The kind's summary of the window's records (``count`` is the window's; the
        caller sets the kind's), with ``window``."""
        fields = {name: self.column(c) for c, name in enumerate(SUMMARY_FIELDS)}
        spec = {
            "drafted": sum(self.counts[_DRAFT]),
            "decode_tok_s_p50_with": self.column(_WITH)["p50"],
            "decode_tok_s_p50_without": self.column(_WITHOUT)["p50"],
        }
        out = assemble_summary(self.n, fields, spec)
        out["window"] = self.n
        return out


_NONE: dict[str, float | None] = {name: None for name, _ in QUANTILES}


def column_quantiles(counts: Sequence[int], sums: Sequence[float]) -> dict[str, float | None]:
    """``{p50, p90, p99}`` of a column from its occupied buckets' counts and sums (in key
    order), in one pass (cumulative counts, then a binary search per rank).

    Each rank's order statistic is read as the mean of the values in its bucket, then
    interpolated as :func:`percentile` does. The bucket's values lie within a factor
    :data:`GAMMA` of each other, so that mean is within ``ALPHA`` of each of them: for a
    column whose values have one sign each percentile is within ``ALPHA`` of the exact one
    (``|got - exact| < ALPHA * |exact|``, plus the rounding to 0.001 of both), and it is
    exact where the order statistics' buckets hold one distinct value (a single record,
    repeated values). Where the two order statistics have opposite signs, the error is
    below ``ALPHA`` times the interpolation of their magnitudes.
    """
    if not counts:
        return dict(_NONE)
    cum = list(accumulate(counts))
    n = cum[-1]

    def at(rank: int) -> float:
        i = bisect_right(cum, rank)
        return sums[i] / counts[i]

    out: dict[str, float | None] = {}
    for name, q in QUANTILES:
        pos = (n - 1) * q
        lo = math.floor(pos)
        hi = math.ceil(pos)
        low = at(lo)
        out[name] = round(low if lo == hi else low + (at(hi) - low) * (pos - lo), 3)
    return out
