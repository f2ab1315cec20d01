"""The peers bench's report (pure: results dict in, text out): the shared header and table
(``bench/overhead/report.py``), then where timing-proxy stands among the paths that do more
than forward bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.overhead.report import BARE, PROXY, header, table

__all__ = ["PROXY", "report", "standing", "table"]


Metric = tuple[str, Callable[[dict[str, Any], str], float | None], bool, str]
"""(label, value of a path or None, higher is better, unit)."""


def _lat_value(kind: str) -> Callable[[dict[str, Any], str], float | None]:
    def get(res: dict[str, Any], name: str) -> float | None:
        entry = res["latency"]["kinds"][kind].get(name)
        return None if entry is None else float(entry["added_ms"]["median_diff"])

    return get


def _cpu_value(kind: str) -> Callable[[dict[str, Any], str], float | None]:
    def get(res: dict[str, Any], name: str) -> float | None:
        entry = res["latency"]["kinds"][kind].get(name)
        return None if entry is None else float(entry["cpu_us_per_request"])

    return get


def _eps_value(res: dict[str, Any], name: str) -> float | None:
    entry = (res.get("long_stream") or {}).get("modes", {}).get(name)
    return None if entry is None else float(entry["events_per_s_median"])


METRICS: list[Metric] = [
    ("stream added p50", _lat_value("stream"), False, "ms"),
    ("JSON reply added p50", _lat_value("plain"), False, "ms"),
    ("CPU per stream", _cpu_value("stream"), False, "µs"),
    ("CPU per JSON reply", _cpu_value("plain"), False, "µs"),
    ("long-stream events/s", _eps_value, True, "/s"),
]


def _fmt(v: float, unit: str) -> str:
    return f"{v:,.2f} ms" if unit == "ms" else f"{v:,.0f} {unit}".replace(" /s", "/s")


def _standing_line(res: dict[str, Any], metric: Metric, judged: list[str]) -> str | None:
    label, get, higher, unit = metric
    ours = get(res, PROXY)
    others = {n: v for n in judged if n != PROXY and (v := get(res, n)) is not None}
    if ours is None or not others:
        return None
    ranked = sorted([*others.values(), ours], reverse=higher)
    rank = ranked.index(ours) + 1
    best_name = (max if higher else min)(others, key=lambda n: others[n])
    best = others[best_name]
    gap = abs(ours - best)
    if (best <= ours) if higher else (best >= ours):
        verdict = f"best, by {_fmt(gap, unit)} over {best_name} ({_fmt(best, unit)})"
    else:
        verdict = f"**not best**: {best_name} {_fmt(best, unit)}, {_fmt(gap, unit)} better"
    return f"* {label}: timing-proxy {_fmt(ours, unit)}, rank {rank} of {len(ranked)}: {verdict}"


def standing(res: dict[str, Any]) -> list[str]:
    """Where timing-proxy stands among the paths that do more than forward (lowest latency
    and CPU, highest long-stream rate win), and its distance to the bare relay."""
    judged = [
        n
        for n in res["order"]
        if res["paths"][n]["analyses"] and n in res["latency"]["kinds"]["stream"]
    ]
    lines = [f"Among the paths that do more than forward ({', '.join(judged)}):", ""]
    lines += [x for m in METRICS if (x := _standing_line(res, m, judged)) is not None]
    stream = res["latency"]["kinds"]["stream"]
    if PROXY in stream and BARE in stream:
        d = stream[PROXY]["added_ms"]["median_diff"] - stream[BARE]["added_ms"]["median_diff"]
        lines.append(f"* stream added p50 over the bare aiohttp relay: {d:+.2f} ms")
    return lines


def report(res: dict[str, Any]) -> str:
    """The whole report: header, table, standing."""
    return "\n".join([*header(res), *table(res), "", *standing(res)])
