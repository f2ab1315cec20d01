"""The Markdown report of a run: the header (machine, command, load), the targets table,
then the tables of every step that ran (``report_tables``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.overhead.constants import (
    BARE,
    LEAN,
    REFERENCES,
    ROBOT_RATE,
    SPLICE,
    TARGET_ADDED_P50_MS,
    TARGET_ADDED_P99_MS,
    TARGET_STREAMS_PER_CORE,
    TARGET_THROUGHPUT_RATIO,
)
from bench.overhead.report_tables import (
    event_delay_table,
    latency_table,
    num,
    profile_tables,
    robot_table,
    throughput_table,
    tracker_table,
    yes_no,
)


def _other_load(step: dict[str, Any]) -> float:
    return float(step["machine_cpu_s"]["other_processes"] / step["step_seconds"])


def _header(res: dict[str, Any]) -> list[str]:
    m = res["machine"]
    modes: list[str] = res["proxy_modes"]
    return [
        f"Date: {res['timestamp']}  ",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, "
        f"Python {m['python']}, aiohttp {m['aiohttp']}, orjson {m['orjson']}"
        + (f", uvloop {m['uvloop']}" if m["uvloop"] else "")
        + "  ",
        f"Code: {m['git_commit']}"
        + (" (proxy/ modified)" if m["proxy_dir_modified"] else "")
        + "  ",
        f"Command: `{res['command']}` ({res['runtime_s']:.0f} s)  ",
        "Fake upstream: "
        + (
            "keeps connections alive after streams (unlike llama-server)"
            if res["args"].get("keep_streams_alive")
            else "closes the connection after each stream, like llama-server "
            "(with `Connection: close`)"
        )
        + ".  ",
        f"Processes: load client + {', '.join(modes)} + fake upstream on "
        f"{m['nproc']} cores: they compete for CPU. References, not timing-proxy: `{BARE}` "
        f"(a minimal aiohttp relay with no analysis, no timeouts, no log), `{LEAN}` (its "
        f"aiohttp server with an httptools upstream client), `{SPLICE}` (bytes copied "
        "between sockets, no HTTP).  ",
        f"Machine busy before start: {m.get('busy_cores_before_start', 0):.2f} cores. "
        "Other processes on the machine (CPU cores busy, average per step): "
        + ", ".join(
            f"{step} {_other_load(res[step]):.2f}"
            for step in ("latency", "event_delay", "throughput", "robots")
            if "machine_cpu_s" in res.get(step, {})
        ),
        "",
    ]


class TargetTable:
    """The targets table: one column per path, and whether each judged path meets it."""

    def __init__(self, modes: list[str]) -> None:
        self.modes = modes
        judged = [x for x in modes if x not in REFERENCES]
        self.lines = [
            "| Target | "
            + " | ".join(f"{x} (reference)" if x in REFERENCES else x for x in modes)
            + " | Met ("
            + ", ".join(judged)
            + ") |",
            "|---|" + "---|" * len(modes) + "---|",
        ]

    def row(
        self,
        label: str,
        values: list[float],
        fmt: Callable[[float], str],
        met: Callable[[float], bool],
    ) -> None:
        self.lines.append(
            f"| {label} | "
            + " | ".join(fmt(v) for v in values)
            + " | "
            + ", ".join(
                yes_no(met(v))
                for x, v in zip(self.modes, values, strict=True)
                if x not in REFERENCES
            )
            + " |"
        )


def _latency_targets(table: TargetTable, lat: dict[str, Any]) -> None:
    for kind in ("stream", "plain"):
        k = lat["kinds"][kind]
        table.row(
            f"added p50 per request, {kind} (Δ medians, ms) ≤ {TARGET_ADDED_P50_MS}",
            [k[f"{p}_added_ms"]["median_diff"] for p in table.modes],
            num,
            lambda v: v <= TARGET_ADDED_P50_MS,
        )
        table.row(
            f"added p99 per request, {kind} (p99 of paired Δ, ms) ≤ {TARGET_ADDED_P99_MS}",
            [k[f"{p}_added_ms"]["paired"]["p99"] for p in table.modes],
            num,
            lambda v: v <= TARGET_ADDED_P99_MS,
        )


def _throughput_target(table: TargetTable, thr: dict[str, Any]) -> None:
    table.row(
        f"{thr['sse_events']:,}-event stream, proxied/direct events/s (median) "
        f"≥ {TARGET_THROUGHPUT_RATIO}",
        [thr["modes"][p]["ratio_median"] for p in table.modes],
        lambda v: num(v, 2),
        lambda v: v >= TARGET_THROUGHPUT_RATIO,
    )


def _robot_target(table: TargetTable, rob: dict[str, Any]) -> None:
    table.row(
        f"streams one core carries at 30 tok/s (robot load, least of "
        f"{'/'.join(rob['levels'])} concurrent) ≥ {TARGET_STREAMS_PER_CORE}",
        [rob[f"{p}_streams_per_core_at_30_tok_s"] for p in table.modes],
        lambda v: f"{v:,.0f}",
        lambda v: v >= TARGET_STREAMS_PER_CORE,
    )


def _long_stream_cpu_target(table: TargetTable, thr: dict[str, Any]) -> None:
    table.row(
        f"streams one core carries at 30 tok/s (long-stream CPU, coalesced reads; "
        f"optimistic) ≥ {TARGET_STREAMS_PER_CORE}",
        [
            1e6 / (thr["modes"][p]["proxy_cpu_us_per_event_all_runs"] * ROBOT_RATE)
            for p in table.modes
        ],
        lambda v: f"{v:,.0f}",
        lambda v: v >= TARGET_STREAMS_PER_CORE,
    )


def _targets(res: dict[str, Any], modes: list[str]) -> list[str]:
    table = TargetTable(modes)
    lat, thr, rob = res.get("latency"), res.get("throughput"), res.get("robots")
    if lat:
        _latency_targets(table, lat)
    if thr:
        _throughput_target(table, thr)
    if rob:
        _robot_target(table, rob)
    if thr:
        _long_stream_cpu_target(table, thr)
    return ["### Targets", "", *table.lines, ""]


def _step_tables(res: dict[str, Any], modes: list[str]) -> list[str]:
    tables: list[tuple[str, Callable[[Any], list[str]]]] = [
        ("latency", lambda lat: latency_table(lat, modes)),
        ("event_delay", lambda ev: event_delay_table(ev, modes)),
        ("throughput", lambda thr: throughput_table(thr, modes)),
        ("robots", lambda rob: robot_table(rob, modes, res["args"]["robot_seconds"])),
        ("tracker", tracker_table),
        ("profile", profile_tables),
    ]
    lines: list[str] = []
    for key, render in tables:
        if res.get(key):
            lines += render(res[key])
    return lines


def report(res: dict[str, Any]) -> str:
    """The whole report of the results ``res`` (as written to the JSON file)."""
    modes: list[str] = res["proxy_modes"]
    return "\n".join(_header(res) + _targets(res, modes) + _step_tables(res, modes))
