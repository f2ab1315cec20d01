"""The Markdown report of a peers run (pure: results dict in, text out): the header (machine,
load, command, runtime), one table row per path, and where timing-proxy stands among the
paths that do more than forward bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PROXY = "timing-proxy"
BARE = "bare-relay"


def _ms3(values: list[float], sign: bool) -> str:
    fmt = "{:+.2f}" if sign else "{:.2f}"
    return " / ".join(fmt.format(v) for v in values)


def _latency_cell(lat: dict[str, Any], kind: str, name: str) -> str:
    entry = lat["kinds"][kind].get(name)
    if entry is None:
        return "–"
    if name == "direct":
        ms = entry["ms"]
        return _ms3([ms["p50"], ms["p90"], ms["p99"]], sign=False) + " (absolute)"
    a = entry["added_ms"]
    return _ms3([a["median_diff"], a["p90_diff"], a["p99_diff"]], sign=True)


def _cpu_cell(lat: dict[str, Any], kind: str, name: str) -> str:
    entry = lat["kinds"][kind].get(name)
    if entry is None or name == "direct":
        return "–"
    return f"{entry['cpu_us_per_request']:,.0f}"


def _long_cell(long: dict[str, Any] | None, name: str) -> str:
    entry = (long or {}).get("modes", {}).get(name)
    if entry is None:
        return "–"
    return f"{entry['events_per_s_median']:,.0f} ({entry['ratio_to_direct']:.2f}×)"


def _same_cell(lat: dict[str, Any], long: dict[str, Any] | None, name: str) -> str:
    entry = lat["kinds"]["stream"].get(name)
    if entry is None:
        return "–"
    if name == "direct":
        return "(reference)"
    n, same = entry["requests"], entry["identical_to_direct"]
    long_entry = (long or {}).get("modes", {}).get(name)
    long_note = ""
    if long_entry is not None and not long_entry["same_size_as_direct"]:
        long_note = "; long stream differs in size"
    if same == n:
        return "yes" + long_note
    return ("no" if same == 0 else f"no ({n - same} of {n} differ)") + long_note


def _row(res: dict[str, Any], name: str) -> str:
    info = res["paths"][name]
    lat, long = res["latency"], res.get("long_stream")
    if name in res.get("skipped", {}):
        return f"| {name} | {info['does']} | skipped: {res['skipped'][name]} |" + " |" * 6
    cells = [
        name,
        info["does"],
        _latency_cell(lat, "stream", name),
        _latency_cell(lat, "plain", name),
        _cpu_cell(lat, "stream", name),
        _cpu_cell(lat, "plain", name),
        "–" if res["rss_mib"].get(name) is None else f"{res['rss_mib'][name]:,.0f}",
        _long_cell(long, name),
        _same_cell(lat, long, name),
    ]
    line = "| " + " | ".join(cells) + " |"
    if name in res.get("failed", {}):
        line += f" left the run: {res['failed'][name]}"
    return line


def table(res: dict[str, Any]) -> list[str]:
    """One row per path (``direct`` first, skipped peers with their reason)."""
    lat = res["latency"]
    events = lat["stream_sse_events"]
    long_events = (res.get("long_stream") or {}).get("sse_events")
    head = (
        f"| Path | Beyond forwarding | {events}-event stream: added p50 / p90 / p99 (ms) "
        f"| {lat['plain_body_bytes']}-byte JSON reply: added p50 / p90 / p99 (ms) "
        "| CPU µs per stream | CPU µs per JSON reply | RSS after (MiB) "
        + (f"| {long_events:,}-event stream: events/s (× direct) " if long_events else "| – ")
        + "| streamed bytes = direct |"
    )
    return [head, "|---|---|---|---|---|---|---|---|---|"] + [_row(res, n) for n in res["order"]]


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


def header(res: dict[str, Any]) -> list[str]:
    """Date, machine, code, command, runtime, load, sizes and the peers' versions."""
    m = res["machine"]
    load = res["load"]
    lat = res["latency"]
    return [
        f"Date: {res['timestamp']}  ",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, "
        f"Python {m['python']}, aiohttp {m['aiohttp']}, Node {m.get('node') or '?'}  ",
        f"Code: {m['git_commit']}"
        + (" (proxy/ modified)" if m["proxy_dir_modified"] else "")
        + "  ",
        f"Command: `{res['command']}` ({res['runtime_s']:.0f} s)  ",
        "Load average (1/5/15 min) before: "
        + " / ".join(f"{x:.2f}" for x in load["before"])
        + ", after: "
        + " / ".join(f"{x:.2f}" for x in load["after"])
        + f"; other processes' CPU (cores, average): latency {load['other_cores']['latency']:.2f}"
        + (
            f", long stream {load['other_cores']['long_stream']:.2f}"
            if "long_stream" in load["other_cores"]
            else ""
        )
        + "  ",
        f"Sizes: {lat['rounds']} rounds per kind (warm-up {lat['warmup']}), paths in a fresh "
        f"random order each round, kinds alternating in blocks of {lat['block']} rounds; "
        + (
            f"long stream {res['long_stream']['runs_per_path']} runs per path (median)  "
            if res.get("long_stream")
            else "no long stream  "
        ),
        "Peers: "
        + ", ".join(
            f"{n} `{res['paths'][n]['version']}`"
            for n in res["order"]
            if res["paths"][n].get("version")
        ),
        "",
    ]


def report(res: dict[str, Any]) -> str:
    """The whole report: header, table, standing."""
    return "\n".join([*header(res), *table(res), "", *standing(res)])
