"""The Markdown report of a run (pure: results dict in, text out): the header (machine, code,
command, load, sizes), one row per path, and for the relay bench the targets and the
in-process analysis cost. The peers bench adds its standing (``bench/peers/report.py``)."""

from __future__ import annotations

from typing import Any

BARE, PROXY = "bare-relay", "timing-proxy"
BASELINE = "timing-proxy (baseline)"
STREAM_OVER_BARE_MS = 0.10
"""Target: timing-proxy's added p50 per 100-event stream at most this over the bare relay's."""
JSON_OVER_BARE_MS = 0.05
"""Target: the same per 645-byte JSON reply."""
LONG_STREAM_RATIO = 1.0
"""Target: the 20,003-event stream through timing-proxy at least this times direct's rate."""
ANALYSIS_US_PER_EVENT = 3.0
"""Target: the in-process analysis (framer + tracker, one event per chunk) per event."""


def _ms3(values: list[float], sign: bool) -> str:
    return " / ".join(("{:+.2f}" if sign else "{:.2f}").format(v) for v in values)


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
    return "–" if entry is None or name == "direct" else f"{entry['cpu_us_per_request']:,.0f}"


def _long_cell(long: dict[str, Any] | None, name: str) -> str:
    e = (long or {}).get("modes", {}).get(name)
    if e is None:
        return "–"
    cpu = "" if name == "direct" else f"; {e['cpu_us_per_event_median']:.1f} µs CPU/event"
    return f"{e['events_per_s_median']:,.0f} ({e['ratio_to_direct']:.2f}×{cpu})"


def _same_cell(lat: dict[str, Any], long: dict[str, Any] | None, name: str) -> str:
    entry = lat["kinds"]["stream"].get(name)
    if entry is None:
        return "–"
    if name == "direct":
        return "(reference)"
    n, same = entry["requests"], entry["identical_to_direct"]
    long_entry = (long or {}).get("modes", {}).get(name) or {}
    note = "" if long_entry.get("same_size_as_direct", True) else "; long stream differs in size"
    if same == n:
        return "yes" + note
    return ("no" if same == 0 else f"no ({n - same} of {n} differ)") + note


def _row(res: dict[str, Any], name: str) -> str:
    info = res["paths"][name]
    lat, long = res["latency"], res.get("long_stream")
    if name in res.get("skipped", {}):
        return f"| {name} | {info['does']} | skipped: {res['skipped'][name]} |" + " |" * 6
    rss = res["rss_mib"].get(name)
    cells = [
        name,
        info["does"],
        _latency_cell(lat, "stream", name),
        _latency_cell(lat, "plain", name),
        _cpu_cell(lat, "stream", name),
        _cpu_cell(lat, "plain", name),
        "–" if rss is None else f"{rss:,.0f}",
        _long_cell(long, name),
        _same_cell(lat, long, name),
    ]
    line = "| " + " | ".join(cells) + " |"
    if name in res.get("failed", {}):
        line += f" left the run: {res['failed'][name]}"
    return line


def table(res: dict[str, Any]) -> list[str]:
    """One row per path (``direct`` first, skipped ones with their reason)."""
    lat = res["latency"]
    long_events = (res.get("long_stream") or {}).get("sse_events")
    head = (
        f"| Path | Beyond forwarding | {lat['stream_sse_events']}-event stream: added p50 / p90 "
        f"/ p99 (ms) | {lat['plain_body_bytes']}-byte JSON reply: added p50 / p90 / p99 (ms) "
        "| CPU µs per stream | CPU µs per JSON reply | RSS after (MiB) "
        + (f"| {long_events:,}-event stream: events/s (× direct) " if long_events else "| – ")
        + "| streamed bytes = direct |"
    )
    return [head, "|---|---|---|---|---|---|---|---|---|"] + [_row(res, n) for n in res["order"]]


def run_lines(res: dict[str, Any]) -> list[str]:
    """Date, machine, code, command and runtime (every bench's report starts with them)."""
    m = res["machine"]
    node = f", Node {m['node']}" if m.get("node") else ""
    dirty = " (proxy/ modified)" if m["proxy_dir_modified"] else ""
    return [
        f"Date: {res['timestamp']}  ",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, Python "
        f"{m['python']}, aiohttp {m['aiohttp']}{node}  ",
        f"Code: {m['git_commit']}{dirty}  ",
        f"Command: `{res['command']}` ({res['runtime_s']:.0f} s)  ",
    ]


def header(res: dict[str, Any]) -> list[str]:
    """The run's lines, the load around it, the sizes, and the paths' versions."""
    load, lat, long = res["load"], res["latency"], res.get("long_stream")
    versions = [f"{n} `{i['version']}`" for n, i in res["paths"].items() if i.get("version")]
    runs = f"long stream: median of {long['runs_per_path']} runs per path" if long else ""
    return [
        *run_lines(res),
        f"Load average (1/5/15 min) before: {_ms3(load['before'], sign=False)}, after: "
        f"{_ms3(load['after'], sign=False)}; other processes' CPU during the run: "
        f"{load['other_cores']:.2f} cores  ",
        f"Sizes: {lat['rounds']} rounds per kind (warm-up {lat['warmup']}), paths in a fresh "
        f"random order each round, kinds alternating in blocks of {lat['block']} rounds; {runs}"
        + ("  " if versions else ""),
        *(["Versions: " + ", ".join(versions)] if versions else []),
        "",
    ]


def _over_bare(lat: dict[str, Any], kind: str, name: str) -> tuple[float, list[float]] | None:
    """``name``'s added p50 minus the bare relay's, whole run and per quarter."""
    k = lat["kinds"][kind]
    if name not in k or BARE not in k:
        return None
    p, b = k[name]["added_ms"], k[BARE]["added_ms"]
    quarters = [x - y for x, y in zip(p["quarters_p50"], b["quarters_p50"], strict=True)]
    return p["median_diff"] - b["median_diff"], quarters


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _judged(res: dict[str, Any], name: str, tracker: Any) -> list[tuple[str, Any]]:
    """Each target: what it asks, and ``name``'s figure with whether it is met (or None)."""
    lat, long, out = res["latency"], res.get("long_stream") or {}, []
    for kind, what, limit in (
        ("stream", f"{lat['stream_sse_events']}-event stream", STREAM_OVER_BARE_MS),
        ("plain", f"{lat['plain_body_bytes']}-byte JSON reply", JSON_OVER_BARE_MS),
    ):
        got = _over_bare(lat, kind, name)
        q = " / ".join(f"{x:+.3f}" for x in got[1]) if got else ""
        fig = got and (f"{got[0]:+.3f} ms (quarters of the rounds: {q})", got[0] <= limit)
        out.append((f"{what}: added p50 over the bare aiohttp relay ≤ +{limit:.2f} ms", fig))
    ratio = long.get("modes", {}).get(name, {}).get("ratio_to_direct")
    what = f"{long.get('sse_events', 0):,}-event stream ≥ {LONG_STREAM_RATIO:.1f}× direct's"
    fig = None if ratio is None else (f"{ratio:.2f}×", ratio >= LONG_STREAM_RATIO)
    out.append((what + " events/s (median)", fig))
    us = tracker and tracker["1_event_per_chunk"]["tracker"]["cpu_us_per_event_median"]
    what = f"analysis in-process ≤ {ANALYSIS_US_PER_EVENT:.0f} µs per event (one event per chunk"
    out.append((what + ", median)", us and (f"{us:.2f} µs", us <= ANALYSIS_US_PER_EVENT)))
    return out


def targets(res: dict[str, Any]) -> list[str]:
    """The relay bench's targets, each with timing-proxy's figure and whether it is met
    (and beside it, with ``--baseline``, the baseline's figure and its own verdict)."""
    ours, base = _judged(res, PROXY, res.get("tracker")), None
    if BASELINE in res["paths"]:
        base = _judged(res, BASELINE, res.get("tracker_baseline"))
    cols = [f"{BASELINE} (met)"] * bool(base) + ["timing-proxy", "met"]
    lines = ["| Target | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for i, (what, got) in enumerate(ours):
        then = base[i][1] if base else None
        was = [f"{then[0]} ({_yes(then[1])})" if then else "–"] if base else []
        lines += ["| " + " | ".join([what, *was, got[0], _yes(got[1])]) + " |"] if got else []
    return [*lines, ""]


def tracker_table(tr: dict[str, Any], base: dict[str, Any] | None = None) -> list[str]:
    """CPU µs per event of the tracker (its framer included) per chunking, median of the
    repetitions, and ``orjson.loads`` of every event for scale; with ``base``, the
    baseline's beside."""
    trees = [("timing-proxy", tr), *([(BASELINE, base)] if base else [])]
    lines = [
        f"In-process analysis of a {tr['sse_events']:,}-event stream (CPU µs per event, median of "
        f"{tr['reps']} repetitions, each a process of its own after a warm-up run):",
        "",
        "| Chunking | " + " | ".join(f"framer + tracker: {n}" for n, _ in trees) + " |",
        "|---|" + "---|" * len(trees),
    ]
    for name in ("1_event_per_chunk", "4_events_per_chunk", "64_KiB_reads"):
        cells = [f"{t[name]['tracker']['cpu_us_per_event_median']:.2f}" for _, t in trees]
        lines.append(f"| {name.replace('_', ' ')} | " + " | ".join(cells) + " |")
    ref = (t["reference_orjson_loads_every_event"]["cpu_us_per_event_median"] for _, t in trees)
    scale = " | ".join(f"{us:.2f}" for us in ref)
    return [*lines, f"| (for scale: `orjson.loads` of every event) | {scale} |"]


def report(res: dict[str, Any]) -> str:
    """The relay bench's report: header, targets, the paths' table, the analysis cost."""
    lines = [*header(res), *targets(res), *table(res)]
    if tr := res.get("tracker"):
        lines += ["", *tracker_table(tr, res.get("tracker_baseline"))]
    return "\n".join(lines)
