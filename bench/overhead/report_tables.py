"""The report's table of each step: latency, per-event delay, long stream, robot load,
in-process analysis cost, profile; and the number formats they share."""

from __future__ import annotations

import statistics
from typing import Any

from bench.overhead.constants import ROBOT_RATE


def num(x: float, nd: int = 3) -> str:
    """``x`` with ``nd`` decimals."""
    return f"{x:.{nd}f}"


def yes_no(flag: bool) -> str:
    """``yes``, or a bold ``no``."""
    return "yes" if flag else "**no**"


def _latency_rows(lat: dict[str, Any], modes: list[str]) -> list[str]:
    lines: list[str] = []
    for kind, label in (
        ("stream", f"streamed, {lat['stream_sse_events']} events"),
        ("plain", f"plain JSON, {lat['plain_body_bytes']} B"),
    ):
        k = lat["kinds"][kind]
        d = k["direct_ms"]
        lines.append(
            f"| {label} | direct | {num(d['p50'])} | {num(d['p90'])} | {num(d['p99'])} | | | | |"
        )
        for p in modes:
            s, ad = k[f"{p}_ms"], k[f"{p}_added_ms"]
            lines.append(
                f"| {label} | {p} | {num(s['p50'])} | {num(s['p90'])} | {num(s['p99'])} | "
                f"{num(ad['median_diff'])} | {num(ad['p99_diff'])} | "
                f"{num(ad['paired']['p50'])} | {num(ad['paired']['p99'])} |"
            )
    return lines


def latency_table(lat: dict[str, Any], modes: list[str]) -> list[str]:
    """Step 1: percentiles and added latency per path, relay CPU, added p50 per quarter."""
    cpu_req = lat["proxy_cpu_us_per_request"]
    return [
        f"### Latency per request (ms, wall time to the last body byte; {lat['rounds']} "
        f"interleaved rounds after {lat['warmup']} warm-up)",
        "",
        "| Response | Path | p50 | p90 | p99 | added: Δ p50 | Δ p99 | paired Δ p50 | "
        "paired Δ p99 |",
        "|---|---|---|---|---|---|---|---|---|",
        *_latency_rows(lat, modes),
        "",
        "Relay CPU per request (mean of streamed and plain, µs): "
        + ", ".join(f"{x} {cpu_req[x]:.0f}" for x in modes)
        + "  ",
        "Added p50 (Δ medians) in each quarter of the rounds, min–max: "
        + "; ".join(
            f"{kind} "
            + ", ".join(
                f"{x} {min(b):.3f}–{max(b):.3f}"
                for x in modes
                if (b := lat["kinds"][kind][f"{x}_added_ms"]["blocks_p50"])
            )
            for kind in ("stream", "plain")
        ),
    ]


def event_delay_table(ev: dict[str, Any], modes: list[str]) -> list[str]:
    """Step 2: per-event delay percentiles, added delay, relay CPU per event."""
    lines = [
        "",
        f"### Per-event forwarding delay (ms, arrival − upstream stamp; {ev['streams_per_mode']}"
        f" streams × {ev['tokens']} events at {ev['interval_ms']} ms per path)",
        "",
        "| Path | p50 | p90 | p99 | added p50 | added p99 | relay CPU µs/event (one wake-up "
        "per event) |",
        "|---|---|---|---|---|---|---|",
        f"| direct | {num(ev['direct_ms']['p50'])} | {num(ev['direct_ms']['p90'])} | "
        f"{num(ev['direct_ms']['p99'])} | | | |",
    ]
    for p in modes:
        s, ad = ev[f"{p}_ms"], ev[f"{p}_added_ms"]
        lines.append(
            f"| {p} | {num(s['p50'])} | {num(s['p90'])} | {num(s['p99'])} | "
            f"{num(ad['p50'])} | {num(ad['p99'])} | "
            f"{num(ev[f'{p}_proxy_cpu_us_per_event'], 1)} |"
        )
    return lines


def _throughput_row(p: str, e: dict[str, Any]) -> str:
    up = statistics.median(r["upstream_cpu_s"] for r in e["runs"])
    cl = statistics.median(r["client_cpu_s"] for r in e["runs"])
    head = f"| {p} | {e['events_per_s_median']:,.0f} | {e['events_per_s_best']:,.0f} | "
    if p == "direct":
        return head + f"| | | {num(up, 2)} | {num(cl, 2)} |"
    return (
        head + f"{num(e['ratio_median'], 2)} | {num(e['ratio_best'], 2)} | "
        f"{num(e['proxy_cpu_us_per_event_all_runs'], 1)} | {num(up, 2)} | {num(cl, 2)} |"
    )


def throughput_table(thr: dict[str, Any], modes: list[str]) -> list[str]:
    """Step 3: events/s of the long stream per path, ratios to direct, CPU."""
    return [
        "",
        f"### One long stream ({thr['sse_events']:,} events, {thr['bytes']:,} B, as fast as "
        f"possible; {thr['runs_per_mode']} runs per path, interleaved)",
        "",
        "| Path | events/s median | events/s best | ratio (median) | ratio (best) | "
        "proxy CPU µs/event | upstream CPU s | client CPU s |",
        "|---|---|---|---|---|---|---|---|",
        *(_throughput_row(p, thr["modes"][p]) for p in ["direct", *modes]),
    ]


def _robot_row(c: str, p: str, r: dict[str, Any]) -> str:
    others = (r["cpu_s"]["client"] + r["cpu_s"]["upstream"]) / r["seconds"]
    head = (
        f"| {c} | {p} | {r['events_per_s']:,.0f} | {r['requests']} | "
        f"{num(r['delay_ms']['p50'])} | {num(r['delay_ms']['p99'])} | "
    )
    if p == "direct":
        return head + f"| | | | | {others:.2f} |"
    return (
        head + f"{num(r['added_delay_ms']['p50'])} | {num(r['added_delay_ms']['p99'])} | "
        f"{r['proxy_cpu_share_of_one_core']:.0%} | "
        f"{num(r['proxy_cpu_us_per_event'], 1)} | "
        f"{r['streams_per_core_at_30_tok_s']:,.0f} | {others:.2f} |"
    )


def robot_table(rob: dict[str, Any], modes: list[str], seconds: float) -> list[str]:
    """Step 4: per level and path, events/s, delay, relay CPU, streams per core."""
    first = next(iter(rob["levels"].values()))["direct"]
    return [
        "",
        f"### Robot load (concurrent streams at {ROBOT_RATE:.0f} tok/s, "
        f"{first['tokens_per_request']} tokens per request, ~{seconds} s "
        "per path and level; event delay = arrival − upstream stamp, ms)",
        "",
        "| Streams | Path | events/s | requests | delay p50 | delay p99 | added p50 | added p99 "
        "| relay CPU (share of a core) | relay CPU µs/event | streams/core at 30 tok/s | "
        "client + upstream CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            _robot_row(c, p, level[p])
            for c, level in rob["levels"].items()
            for p in ["direct", *modes]
        ),
    ]


def tracker_table(tr: dict[str, Any]) -> list[str]:
    """Step 5: tracker and framer CPU per event, and the orjson reference."""
    lines = [
        "",
        f"### Analysis cost in-process (StreamTracker.feed + finish, {tr['sse_events']:,}-event "
        f"stream, no I/O; min / median of {tr['reps']} reps)",
        "",
        "| Chunking | tracker CPU µs/event | framer only µs/event |",
        "|---|---|---|",
    ]
    for name in ("1_event_per_chunk", "4_events_per_chunk", "64_KiB_reads"):
        if name not in tr:  # a result file from before that chunking was measured
            continue
        t = tr[name]
        lines.append(
            f"| {name.replace('_', ' ')} | {num(t['tracker']['cpu_us_per_event_min'], 2)} / "
            f"{num(t['tracker']['cpu_us_per_event_median'], 2)} | "
            f"{num(t['framer_only']['cpu_us_per_event_min'], 2)} / "
            f"{num(t['framer_only']['cpu_us_per_event_median'], 2)} |"
        )
    ref = tr["reference_orjson_loads_every_event"]
    lines.append(
        f"| (reference: orjson.loads of every event) | "
        f"{num(ref['cpu_us_per_event_min'], 2)} / "
        f"{num(ref['cpu_us_per_event_median'], 2)} | |"
    )
    return lines


def _profile_run(title: str, p: dict[str, Any]) -> list[str]:
    if "categories_inclusive_pct" not in p:
        return ["", f"Profile ({title}): {p.get('error', 'no samples')}"]
    return [
        "",
        f"### Proxy profile, {title} (py-spy, {p['samples']} busy samples, "
        f"proxy busy {p['proxy_cpu_share']:.0%} of a core; % of busy samples)",
        "",
        "| Self time by owner | % |",
        "|---|---|",
        *(f"| {n} | {v} |" for n, v in p["self_by_category_pct"].items()),
        "",
        "| Inclusive share (a sample counts for every match in its stack) | % |",
        "|---|---|",
        *(f"| {n} | {v} |" for n, v in p["categories_inclusive_pct"].items()),
        "",
        "| Top self time | % |",
        "|---|---|",
        *(f"| `{n}` | {v} |" for n, v in p["top_self_pct"][:12]),
    ]


def profile_tables(prof: dict[str, Any]) -> list[str]:
    """Step 6: per profiled workload, self time by owner, inclusive shares, top frames."""
    if "long_stream_raw" not in prof:
        return ["", f"Profile: {prof.get('error', 'not run')}"]
    lines: list[str] = []
    for key, title in (
        ("long_stream_raw", "long stream"),
        ("robots_raw", "robot load"),
        ("requests_raw", "back-to-back 20-token requests"),
    ):
        lines += _profile_run(title, prof.get(key, {}))
    return lines
