#!/usr/bin/env python3
"""Which structure for the ``/stats`` percentiles: error against the exact percentiles of the
same records, CPU per record added, CPU per read of a full window, memory.

Three ways to keep a window of the last ``--window`` records of a kind and read p50/p90/p99
of its 14 summarised fields (and the decode rate's medians with and without drafts):

* ``sort``: the structure ``/stats`` had until issue 15, a ``deque`` of each record's
  summary values, every field's column sorted when read. Exact.
* ``histogram``: what ``/stats`` uses now (``proxy.core.stats._Window``): per field, counts
  and sums of log buckets 1 % wide, kept up to date as a record enters the window and as the
  oldest leaves it; a read walks the occupied buckets and answers each order statistic with
  its bucket's mean, interpolated as the exact percentile is.
* ``ddsketch``: DataDog's ``ddsketch`` (pure Python, relative accuracy 1 %). A sketch cannot
  forget a value, so the window is ``--blocks`` sketches of ``window / blocks`` records
  each, the oldest dropped when a new one starts, merged when read: it covers between
  ``window - window/blocks + 1`` and ``window`` records, and its quantile is the value of
  the order statistic at rank ``q (n - 1)`` rounded down, not interpolated.

Every add and read is timed in rounds, the three structures in a new random order each
round, on the same records; the figures are medians over rounds (on a shared machine, read
them as indicative). The error is the largest ``|got - exact| / |exact|`` over the fields
and p50/p90/p99, where ``exact`` is :func:`proxy.core.stats.percentile` (linear
interpolation between order statistics, numpy's default) over the records the structure
holds. Memory: ``tracemalloc``'s count of the bytes a full window holds, and the objects
the garbage collector tracks in it.

Data: ``seed``: records shaped like the seed's measurements (tool calls whose totals are
the seed's five, 3,172 / 1,813 / 2,061 / 1,432 / 4,071 ms, each within 10 ms of its first
time, TTFT about 820 ms, 6.0 tok/s; chat turns at 162 ms and 10.7 tok/s); ``heavy``:
every field Pareto (shape 1.1, infinite variance) or log-normal (sigma 2, six decades);
``seed-five``: only the seed's five tool totals (a window of 5).

``ddsketch`` is not a dependency of the proxy: install it (and ``six``) anywhere on
``PYTHONPATH`` to include it, e.g. ``pip install --target DIR ddsketch six``; without it
its rows are skipped. A script to run by hand::

    PYTHONPATH=DIR .venv/bin/python bench/stats_sketch.py [--window 10000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import statistics
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from proxy.core.stats import (
    ALPHA,
    QUANTILES,
    SUMMARY_FIELDS,
    _slots,
    _Window,
    percentile,
)

Row = tuple[float | None, ...]
SEED_TOOL_TOTALS = (3172.0, 1813.0, 2061.0, 1432.0, 4071.0)
FIELD = {name: i for i, name in enumerate(SUMMARY_FIELDS)}
DRAFT, DECODE = FIELD["draft_acceptance"], FIELD["decode_tok_s"]
COLUMNS = (*SUMMARY_FIELDS, "decode_with", "decode_without")


def spec_columns(row: Row) -> tuple[float | None, float | None]:
    """The decode rate as the with-draft and the without-draft column see it."""
    rate = row[DECODE]
    return (rate, None) if row[DRAFT] is not None else (None, rate)


class Structure(Protocol):
    """One way of keeping a window: add a record's row, read every column's quantiles."""

    def add(self, row: Row) -> None: ...

    def read(self) -> dict[str, dict[str, float | None]]: ...

    def held(self) -> list[Row]: ...


class Sorted:
    """The previous ``/stats``: a deque of rows, each column sorted when read."""

    def __init__(self, window: int) -> None:
        self.rows: deque[Row] = deque(maxlen=window)

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def read(self) -> dict[str, dict[str, float | None]]:
        out = {}
        for c, name in enumerate(SUMMARY_FIELDS):
            column = sorted(v for row in self.rows if (v := row[c]) is not None)
            out[name] = {q_name: percentile(column, q) for q_name, q in QUANTILES}
        for c, name in enumerate(COLUMNS[-2:]):
            column = sorted(v for row in self.rows if (v := spec_columns(row)[c]) is not None)
            out[name] = {"p50": percentile(column, 0.5)}
        return out

    def held(self) -> list[Row]:
        return list(self.rows)


class Histogram:
    """``/stats`` now: :class:`proxy.core.stats._Window`."""

    def __init__(self, window: int) -> None:
        self.window = _Window(window)

    def add(self, row: Row) -> None:
        self.window.push(*_slots(row))

    def read(self) -> dict[str, dict[str, float | None]]:
        out = {name: self.window.column(c) for c, name in enumerate(SUMMARY_FIELDS)}
        out["decode_with"] = {"p50": self.window.column(len(SUMMARY_FIELDS))["p50"]}
        out["decode_without"] = {"p50": self.window.column(len(SUMMARY_FIELDS) + 1)["p50"]}
        return out

    def held(self) -> list[Row]:
        raise NotImplementedError  # the last ``window`` rows fed: the caller knows them


class DDSketches:
    """``blocks`` rotated blocks of one ``DDSketch`` per column, merged when read."""

    def __init__(
        self, window: int, blocks: int, sketch: Callable[[], Any], keep_rows: bool = True
    ) -> None:
        self.sketch = sketch
        self.keep_rows = keep_rows
        self.block_size = max(1, math.ceil(window / blocks))
        self.blocks: deque[tuple[list[Any], list[Row]]] = deque(maxlen=blocks)
        self.fill = 0

    def add(self, row: Row) -> None:
        if not self.blocks or self.fill == self.block_size:
            self.blocks.append(([self.sketch() for _ in COLUMNS], []))
            self.fill = 0
        sketches, rows = self.blocks[-1]
        self.fill += 1
        if self.keep_rows:  # for the error only
            rows.append(row)
        for c, v in enumerate(row):
            if v is not None:
                sketches[c].add(v)
        for c, v in enumerate(spec_columns(row)):
            if v is not None:
                sketches[len(SUMMARY_FIELDS) + c].add(v)

    def read(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for c, name in enumerate(COLUMNS):
            merged = self.sketch()
            for sketches, _ in self.blocks:
                merged.merge(sketches[c])
            wanted = QUANTILES if c < len(SUMMARY_FIELDS) else (("p50", 0.5),)
            out[name] = {}
            for q_name, q in wanted:
                value = merged.get_quantile_value(q)
                out[name][q_name] = None if value is None else round(value, 3)
        return out

    def held(self) -> list[Row]:
        return [row for _, rows in self.blocks for row in rows]


def seed_rows(rng: random.Random, n: int) -> list[Row]:
    """Seed-shaped records (the module's docstring), as summary rows."""
    rows = []
    for i in range(n):
        values: dict[str, float | None] = dict.fromkeys(SUMMARY_FIELDS)
        if i % 3:
            total = SEED_TOOL_TOTALS[i % 5] + rng.uniform(-10.0, 10.0)
            values.update(
                ttft_ms=820.0 * rng.lognormvariate(0, 0.1),
                prefill_ms=796.0 * rng.lognormvariate(0, 0.1),
                decode_ms=1265.0 * rng.lognormvariate(0, 0.3),
                decode_tok_s=6.0 * rng.lognormvariate(0, 0.05),
                e2e_ms=total,
                tool_call_ms=total,
            )
        else:
            values.update(
                ttft_ms=162.0 * rng.lognormvariate(0, 0.2),
                prefill_ms=140.0 * rng.lognormvariate(0, 0.2),
                decode_ms=2300.0 * rng.lognormvariate(0, 0.5),
                decode_tok_s=10.7 * rng.lognormvariate(0, 0.05),
                draft_acceptance=rng.random() if i % 9 == 0 else None,
                e2e_ms=2500.0 * rng.lognormvariate(0, 0.5),
            )
        values["overhead_ms"] = rng.uniform(0.2, 1.5)
        values["upstream_cpu_ms"] = 600.0 * rng.lognormvariate(0, 0.3)
        rows.append(tuple(values[name] for name in SUMMARY_FIELDS))
    return rows


def heavy_rows(rng: random.Random, n: int) -> list[Row]:
    """Every field heavy-tailed: Pareto 1.1 (even columns) or log-normal sigma 2."""

    def draw(c: int) -> float:
        return 100.0 * rng.paretovariate(1.1) if c % 2 == 0 else rng.lognormvariate(3.0, 2.0)

    return [tuple(draw(c) for c in range(len(SUMMARY_FIELDS))) for _ in range(n)]


def five_rows() -> list[Row]:
    """The seed's five tool totals, as ``tool_call_ms``."""
    at = FIELD["tool_call_ms"]
    return [
        tuple(t if c == at else None for c in range(len(SUMMARY_FIELDS))) for t in SEED_TOOL_TOTALS
    ]


def worst_error(got: dict[str, dict[str, float | None]], rows: Sequence[Row]) -> float:
    """The largest relative error of ``got`` against the exact percentiles of ``rows``."""
    worst = 0.0
    for name in got:
        c = COLUMNS.index(name)
        if c < len(SUMMARY_FIELDS):
            column = sorted(v for row in rows if (v := row[c]) is not None)
        else:
            spec = c - len(SUMMARY_FIELDS)
            column = sorted(v for row in rows if (v := spec_columns(row)[spec]) is not None)
        for q_name, value in got[name].items():
            exact = percentile(column, dict(QUANTILES)[q_name])
            if exact is None or value is None:
                assert exact is None and value is None, (name, q_name, value, exact)
                continue
            worst = max(worst, abs(value - exact) / abs(exact) if exact else abs(value))
    return worst


def footprint(make: Callable[[], Structure], rows: Sequence[Row]) -> tuple[int, int]:
    """Bytes a structure fed ``rows`` holds (tracemalloc), and its objects the garbage
    collector tracks. Each row is fed as a new tuple of new floats, as the proxy makes one
    from a record (which then goes)."""
    gc.collect()
    before = len(gc.get_objects())
    tracemalloc.start()
    structure = make()
    for row in rows:
        structure.add(tuple(None if v is None else v * 1.0 for v in row))
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    objects = len(gc.get_objects()) - before
    del structure
    return held, objects


def measure(
    makers: dict[str, Callable[[], Structure]], rows: list[Row], window: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Per structure: median µs per add (a full window, so each add also evicts), median
    ms per read, the worst relative error."""
    batch = rows[window : window + min(2000, len(rows) - window)] or rows
    adds: dict[str, list[float]] = {name: [] for name in makers}
    reads: dict[str, list[float]] = {name: [] for name in makers}
    errors: dict[str, float] = {}
    for _ in range(rounds):
        order = list(makers)
        random.shuffle(order)
        for name in order:
            structure = makers[name]()
            for row in rows[:window]:
                structure.add(row)
            t = time.perf_counter()
            for row in batch:
                structure.add(row)
            adds[name].append((time.perf_counter() - t) / len(batch) * 1e6)
            t = time.perf_counter()
            got = structure.read()
            reads[name].append((time.perf_counter() - t) * 1e3)
            if name not in errors:
                kept = rows[: window + len(batch)][-window:]
                if isinstance(structure, DDSketches):
                    kept = structure.held()
                errors[name] = worst_error(got, kept)
    return {
        name: {
            "add_us": statistics.median(adds[name]),
            "read_ms": statistics.median(reads[name]),
            "error": errors[name],
        }
        for name in makers
    }


def main(window: int, rounds: int, blocks: int) -> None:
    try:
        from ddsketch import DDSketch  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        DDSketch = None
        print(f"ddsketch not importable ({e}): its rows are skipped")

    def makers(size: int) -> dict[str, Callable[[], Structure]]:
        out: dict[str, Callable[[], Structure]] = {
            "sort": lambda: Sorted(size),
            "histogram": lambda: Histogram(size),
        }
        if DDSketch is not None:
            out["ddsketch"] = lambda: DDSketches(size, blocks, lambda: DDSketch(ALPHA))
        return out

    rng = random.Random(15)
    data = {
        "seed": seed_rows(rng, window + 2000),
        "heavy": heavy_rows(rng, window + 2000),
    }
    print(
        f"window {window} records, {len(SUMMARY_FIELDS)} fields (+2 speculation columns), "
        f"{rounds} interleaved rounds; ddsketch: {blocks} blocks, relative accuracy {ALPHA}"
    )
    print("| data | structure | add, µs per record | read, ms | worst relative error |")
    print("|---|---|---|---|---|")
    for label, rows in data.items():
        for name, m in measure(makers(window), rows, window, rounds).items():
            print(
                f"| {label} | {name} | {m['add_us']:.1f} | {m['read_ms']:.2f} "
                f"| {m['error'] * 100:.2f} % |"
            )
    five = five_rows()
    for name, make in makers(5).items():
        structure = make()
        for row in five:
            structure.add(row)
        got = structure.read()["tool_call_ms"]
        print(
            f"| seed-five | {name} | | | {worst_error({'tool_call_ms': got}, five) * 100:.2f} % "
            f"(p50/p90/p99 {got['p50']} / {got['p90']} / {got['p99']}) |"
        )
    print()
    print("| structure | bytes held, full window (seed data) | objects the collector tracks |")
    print("|---|---|---|")
    sizes = makers(window)
    if DDSketch is not None:
        sizes["ddsketch"] = lambda: DDSketches(window, blocks, lambda: DDSketch(ALPHA), False)
    for name, make in sizes.items():
        held, objects = footprint(make, data["seed"][:window])
        print(f"| {name} | {held / 1e6:.2f} MB | {objects} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--blocks", type=int, default=4)
    a = p.parse_args()
    main(a.window, a.rounds, a.blocks)
