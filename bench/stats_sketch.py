#!/usr/bin/env python3
"""How far ``/stats``' percentiles are from the exact ones of the same records.

It fills a ``/stats`` window of ``--window`` records (log-bucket histograms, 1 % wide) past
full, and compares every p50/p90/p99 of its summarised fields, and the decode rate's medians
with and without drafts, with the exact percentiles (linear interpolation between order
statistics) of the records it holds; it prints the worst relative error per data set:

* ``jetson``: records shaped like the Jetson measurement's (tool calls whose totals are its
  five, 3,172 / 1,813 / 2,061 / 1,432 / 4,071 ms, each within 10 ms; TTFT about 820 ms,
  6.0 tok/s; chat turns at 162 ms and 10.7 tok/s);
* ``heavy``: every field Pareto (shape 1.1) or log-normal (sigma 2, six decades);
* ``five-calls``: only the five tool-call totals, a window of 5.

The random data are the same on every run, so are the figures, on any machine::

    .venv/bin/python bench/stats_sketch.py [--window 10000]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``proxy``

from proxy.core.summaries import QUANTILES, SUMMARY_FIELDS, percentile
from proxy.core.windows import Window, slots

Row = tuple[float | None, ...]
TOOL_TOTALS = (3172.0, 1813.0, 2061.0, 1432.0, 4071.0)
FIELD = {name: i for i, name in enumerate(SUMMARY_FIELDS)}


def columns(row: Row) -> list[float | None]:
    """A row's summarised fields, then the decode rate with a draft, then without one."""
    rate, drafted = row[FIELD["decode_tok_s"]], row[FIELD["draft_acceptance"]] is not None
    return [*row, rate if drafted else None, None if drafted else rate]


def jetson_rows(rng: random.Random, n: int) -> list[Row]:
    """Records shaped like the Jetson measurement's (the module's docstring)."""
    rows = []
    for i in range(n):
        v: dict[str, float | None] = dict.fromkeys(SUMMARY_FIELDS)
        if i % 3:
            total = TOOL_TOTALS[i % 5] + rng.uniform(-10.0, 10.0)
            v.update(ttft_ms=820.0 * rng.lognormvariate(0, 0.1))
            v.update(prefill_ms=796.0 * rng.lognormvariate(0, 0.1))
            v.update(decode_ms=1265.0 * rng.lognormvariate(0, 0.3))
            v.update(decode_tok_s=6.0 * rng.lognormvariate(0, 0.05), e2e_ms=total)
            v.update(tool_call_ms=total)
        else:
            v.update(ttft_ms=162.0 * rng.lognormvariate(0, 0.2))
            v.update(prefill_ms=140.0 * rng.lognormvariate(0, 0.2))
            v.update(decode_ms=2300.0 * rng.lognormvariate(0, 0.5))
            v.update(decode_tok_s=10.7 * rng.lognormvariate(0, 0.05))
            v.update(draft_acceptance=rng.random() if i % 9 == 0 else None)
            v.update(e2e_ms=2500.0 * rng.lognormvariate(0, 0.5))
        v.update(
            overhead_ms=rng.uniform(0.2, 1.5), upstream_cpu_ms=600.0 * rng.lognormvariate(0, 0.3)
        )
        rows.append(tuple(v[name] for name in SUMMARY_FIELDS))
    return rows


def heavy_rows(rng: random.Random, n: int) -> list[Row]:
    """Every field heavy-tailed: Pareto 1.1 (even columns) or log-normal sigma 2."""

    def draw(c: int) -> float:
        return 100.0 * rng.paretovariate(1.1) if c % 2 == 0 else rng.lognormvariate(3.0, 2.0)

    return [tuple(draw(c) for c in range(len(SUMMARY_FIELDS))) for _ in range(n)]


def worst_error(rows: Sequence[Row], window: int) -> float:
    """Feed ``rows`` to a ``/stats`` window of ``window`` records; the largest relative error
    of its percentiles against the exact ones of the last ``window`` rows."""
    hist = Window(window)
    for row in rows:
        hist.push(*slots(row))
    kept = [columns(row) for row in rows[-window:]]
    worst = 0.0
    for c in range(len(SUMMARY_FIELDS) + 2):
        got = hist.column(c)
        exact = sorted(v for row in kept if (v := row[c]) is not None)
        for q_name, q in QUANTILES if c < len(SUMMARY_FIELDS) else (("p50", 0.5),):
            want, value = percentile(exact, q), got[q_name]
            if want is None or value is None:
                assert want is None and value is None, (c, q_name, value, want)
                continue
            worst = max(worst, abs(value - want) / abs(want) if want else abs(value))
    return worst


def main(window: int) -> None:
    rng = random.Random(15)
    data = {"jetson": jetson_rows(rng, window + 2000), "heavy": heavy_rows(rng, window + 2000)}
    at = FIELD["tool_call_ms"]
    five = [tuple(t if c == at else None for c in range(len(SUMMARY_FIELDS))) for t in TOOL_TOTALS]
    print("| data | window | worst relative error of p50/p90/p99 |\n|---|---|---|")
    for name, rows in data.items():
        print(f"| {name} | {window:,} | {worst_error(rows, window) * 100:.2f} % |")
    print(f"| five-calls | 5 | {worst_error(five, 5) * 100:.2f} % |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window", type=int, default=10_000)
    main(p.parse_args().window)
