"""The report document as a terminal table: fixed-width columns, units, thousands separators.

Pure: a :func:`proxy.commands.report.summary.build_report` document in, text out. Times are
written by :func:`proxy.core.numbers.figure_or_dash` (``2,061``, ``93.5``, ``4.25``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.commands.report.summary import COMPLETED_ONLY
from proxy.core.numbers import figure_or_dash as _ms
from proxy.core.stats import SUMMARY_FIELDS

__all__ = ["render_text"]

_Format = Callable[[float | None], str]


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _int(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} %"


def _share(value: float | None) -> str:
    """A ratio (0..1) as a percentage."""
    return "-" if value is None else f"{100 * value:.0f} %"


_ROWS: tuple[tuple[str, str, _Format], ...] = (
    ("ttft_ms", "TTFT ms", _ms),
    ("prefill_ms", "prefill ms", _ms),
    ("decode_ms", "decode ms", _ms),
    ("e2e_ms", "end-to-end ms", _ms),
    ("decode_tok_s", "decode tok/s", _rate),
    ("tool_call_ms", "tool call complete ms", _ms),
    ("overhead_ms", "overhead ms", _ms),
    ("draft_acceptance", "draft acceptance", _share),
    ("image_tokens", "image tokens", _int),
    ("image_prefill_ms", "image prefill ms", _ms),
    ("energy_mj", "energy mJ", _int),
    ("energy_mj_per_token", "energy mJ per token", _rate),
    ("power_w_avg", "board power W", _rate),
    ("upstream_cpu_ms", "llama-server CPU ms", _ms),
)
_EXTRA_ROWS: tuple[tuple[str, str, _Format], ...] = (
    ("prompt_n", "prompt tokens evaluated", _int),
    ("tool_call_tokens", "tool-call tokens", _int),
    ("tool_decode_tok_s", "tool-call decode tok/s", _rate),
)
_RUN_COLS: tuple[tuple[str, str, _Format], ...] = (
    ("e2e_ms", "e2e ms", _ms),
    ("tool_call_ms", "tool ms", _ms),
    ("ttft_ms", "TTFT ms", _ms),
    ("prefill_ms", "prefill ms", _ms),
    ("decode_ms", "decode ms", _ms),
    ("decode_tok_s", "tok/s", _rate),
)
_API_COLS: tuple[tuple[str, str, _Format], ...] = (
    ("ttft_ms", "TTFT ms", _ms),
    ("prefill_ms", "prefill ms", _ms),
    ("e2e_ms", "e2e ms", _ms),
    ("tool_call_ms", "tool ms", _ms),
    ("decode_tok_s", "tok/s", _rate),
)
"""The medians the per-API table shows (``--json`` has every percentile)."""

_LABEL = 26
_COL = 10
_MISSING_SHOWN = 12
"""How many missing fields the text names (``--json`` has them all)."""
_FINDINGS_SHOWN = 10
"""How many findings the text lists (``--json`` has them all)."""
_WIDTH = 100


def _rows() -> list[tuple[str, str, _Format]]:
    """The table rows: the known summary fields, then any other field ``/stats`` summarises."""
    known = {name for name, _, _ in _ROWS}
    rest = [(n, n, _ms if n.endswith("_ms") else _rate) for n in SUMMARY_FIELDS if n not in known]
    return [*_ROWS, *rest, *_EXTRA_ROWS]


def _table_row(label: str, cells: Sequence[str]) -> str:
    return f"  {label:<{_LABEL}}" + "".join(f"{c:>{_COL}}" for c in cells)


def _labelled(label: str, text: str) -> str:
    return f"  {label:<{_LABEL}}{text}"


def _percentile_lines(s: Mapping[str, Any]) -> list[str]:
    lines = [_table_row("", ["p50", "p90", "p99"])]
    for name, label, fmt in _rows():
        q = s.get(name)
        if isinstance(q, dict) and q.get("p50") is not None:
            lines.append(_table_row(label, [fmt(q["p50"]), fmt(q["p90"]), fmt(q["p99"])]))
    return lines


def _split_lines(split: Mapping[str, Any]) -> list[str]:
    if split["prefill_ms"] is None or split["decode_ms"] is None:
        return []
    return [
        _labelled(
            "split (medians)",
            f"prefill {_ms(split['prefill_ms'])} ms ({_pct(split['prefill_pct'])})"
            f" + decode {_ms(split['decode_ms'])} ms ({_pct(split['decode_pct'])})",
        )
    ]


def _schema_lines(schema: Mapping[str, Any]) -> list[str]:
    lines = []
    if schema["tokens"]["p50"] is not None:
        sources = ", ".join(sorted(schema["source"])) or "unknown"
        lines.append(
            _labelled(
                "schema tokens (p50)",
                f"{_int(schema['tokens']['p50'])} (counted by: {sources})",
            )
        )
    if schema["priced"]:
        paid, saved = schema["paid_ms"], schema["saved_ms"]
        lines.append(
            _labelled(
                "schema prefill paid",
                f"{_ms(paid['total'])} ms in all, p50 {_ms(paid['p50'])} ms per call",
            )
        )
        lines.append(
            _labelled(
                "schema prefill saved",
                f"{_ms(saved['total'])} ms in all, p50 {_ms(saved['p50'])} ms per call"
                f" ({schema['cached']} of {schema['priced']} calls with the schema cached)",
            )
        )
    return lines


def _image_lines(images: Mapping[str, Any] | None) -> list[str]:
    """Beside the schema's: the image tokens per call, and their prefill paid."""
    if not images or not images["requests"]:
        return []
    lines = [
        _labelled(
            "image tokens (p50)",
            f"{_int(images['tokens']['p50'])} per call with images"
            f" ({images['requests']:,} calls, {images['images']:,} images,"
            f" {images['cached']:,} from the cache)",
        )
    ]
    paid = images["paid_ms"]
    if paid["p50"] is not None:
        lines.append(
            _labelled(
                "image prefill paid",
                f"{_ms(paid['total'])} ms in all, p50 {_ms(paid['p50'])} ms per call",
            )
        )
    return lines


def _speculation_lines(spec: Mapping[str, Any] | None) -> list[str]:
    """How many requests drafted, and the decode rate with and without a draft."""
    if not spec or not spec["drafted"]:
        return []
    return [
        _labelled(
            "speculative decoding",
            f"{spec['drafted']:,} drafted; decode p50 {_rate(spec['decode_tok_s_p50_with'])}"
            f" tok/s with, {_rate(spec['decode_tok_s_p50_without'])} without",
        )
    ]


def _board_lines(board: Mapping[str, Any] | None) -> list[str]:
    """Energy per call from the board telemetry, when it covered any request."""
    if not board or board["energy_mj"]["p50"] is None:
        return []
    per_token = board["energy_mj_per_token"]["p50"]
    return [
        _labelled(
            "energy per call (p50)",
            f"{_int(board['energy_mj']['p50'])} mJ"
            + (f", {_rate(per_token)} mJ per token" if per_token is not None else "")
            + f", {_rate(board['power_w_avg']['p50'])} W"
            f" ({board['covered']:,} calls measured)",
        )
    ]


def _valid_lines(valid: Mapping[str, int]) -> list[str]:
    if not valid["of"]:
        return []
    extra = [f"{valid[k]} {k.replace('_', ' ')}" for k in ("invalid", "no_call") if valid[k]]
    return [
        _labelled(
            "valid tool calls",
            f"{valid['valid']} of {valid['of']}" + (f" ({', '.join(extra)})" if extra else ""),
        )
    ]


def _cache_lines(cache: Mapping[str, Any]) -> list[str]:
    if cache["hit_ratio"] is None:
        return []
    return [
        _labelled(
            "prompt cache hit ratio",
            f"{100 * cache['hit_ratio']:.1f} %"
            f" ({cache['cache_n']:,} of {cache['prompt_tokens']:,} prompt tokens)",
        )
    ]


def _median_call_lines(call: Mapping[str, Any] | None) -> list[str]:
    if call is None:
        return []
    parts = [f"{_ms(call['e2e_ms'])} ms end to end"]
    if call["prefill_ms"] is not None and call["decode_ms"] is not None:
        parts.append(f"prefill {_ms(call['prefill_ms'])} + decode {_ms(call['decode_ms'])} ms")
    if call["predicted_n"] is not None:
        parts.append(f"{call['predicted_n']} tokens")
    name = call["id"] if call["id"] is not None else "(no id)"
    return [_labelled("median call", f"{name}: " + ", ".join(parts))]


def _kind_lines(kind: str, s: Mapping[str, Any]) -> list[str]:
    outcomes = ", ".join(f"{n} {o}" for o, n in sorted(s["outcomes"].items()))
    lines = [f"{kind}: {s['count']:,} requests ({outcomes or 'none'})"]
    if not s["window"]:
        return [*lines, "  no completed requests"]
    return [
        *lines,
        *_percentile_lines(s),
        *_split_lines(s["split"]),
        *_schema_lines(s["schema"]),
        *_image_lines(s.get("images")),
        *_speculation_lines(s.get("speculation")),
        *_board_lines(s.get("board")),
        *_valid_lines(s["tool_calls_valid"]),
        *_cache_lines(s["cache"]),
        *_median_call_lines(s["median_call"]),
    ]


def _spread_lines(rows: Sequence[Mapping[str, Any]], spread: Mapping[str, Any]) -> list[str]:
    main = next((name for name in ("tool_call_ms", "e2e_ms") if spread.get(name)), None)
    if main is None:
        return []
    sp = spread[main]
    medians = " / ".join(_ms(row[main]) for row in rows if row[main] is not None)
    return [
        f"  spread between the runs' {main} medians: {medians} ms",
        f"  max - min = {_ms(sp['ms'])} ms, {sp['pct']:.1f} % of the median run",
    ]


def _per_run_lines(kind: str, per_run: Mapping[str, Any]) -> list[str]:
    rows = per_run["runs"]
    cols = [c for c in _RUN_COLS if any(row[c[0]] is not None for row in rows)]
    if not cols:
        return []
    width = max(12, *(len(row["name"]) for row in rows))
    head = f"  {'run':<{width}}{'n':>6}" + "".join(f"{label:>{_COL + 2}}" for _, label, _ in cols)
    lines = [f"{kind} per run (medians of completed requests)", head]
    for row in rows:
        lines.append(
            f"  {row['name']:<{width}}{row['count']:>6,}"
            + "".join(f"{fmt(row[name]):>{_COL + 2}}" for name, _, fmt in cols)
        )
    spread = per_run["spread"]
    cells = ["-" if spread[name] is None else fmt(spread[name]["ms"]) for name, _, fmt in cols]
    lines.append(f"  {'spread':<{width}}{'':>6}" + "".join(f"{c:>{_COL + 2}}" for c in cells))
    return [*lines, *_spread_lines(rows, spread)]


def _api_rows(by_api: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(api, kind, summary) of each kind each API had requests of."""
    return [
        (api, kind, s)
        for api, entry in by_api.items()
        for kind, s in entry["kinds"].items()
        if s["count"]
    ]


def _by_api_lines(report: Mapping[str, Any]) -> list[str]:
    """The medians of each API's chat and tool requests, one row per API and kind (only
    those with requests); nothing for logs that do not name the API."""
    by_api: Mapping[str, Any] = report.get("by_api") or {}
    rows = _api_rows(by_api) if set(by_api) - {"unknown"} else []
    if not rows:
        return []
    cols = [c for c in _API_COLS if any(s[c[0]]["p50"] is not None for _, _, s in rows)]
    width = max(12, *(len(api) for api, _, _ in rows))
    head = f"  {'api':<{width}}  {'kind':<6}{'requests':>9}{'completed':>10}" + "".join(
        f"{label:>{_COL + 1}}" for _, label, _ in cols
    )
    lines = ["per API (medians of completed requests)", head]
    for api, kind, s in rows:
        lines.append(
            f"  {api:<{width}}  {kind:<6}{s['count']:>9,}{s['window']:>10,}"
            + "".join(f"{fmt(s[name]['p50']):>{_COL + 1}}" for name, _, fmt in cols)
        )
    return lines


def _upstream_error_lines(report: Mapping[str, Any]) -> list[str]:
    """The requests llama-server answered with an HTTP error, by status."""
    errors: Mapping[str, int] = report.get("upstream_errors") or {}
    if not errors:
        return []
    return ["upstream errors by status: " + ", ".join(f"{s} {n:,}" for s, n in errors.items())]


def _roofline_hint(report: Mapping[str, Any]) -> list[str]:
    roof = report["roofline"]
    need: list[str] = []
    if roof["model"] is None:
        need += [
            "the model: --upstream URL (reads llama-server's /v1/models meta)",
            "  or --model-size BYTES --params N",
        ]
    board = roof["board"]
    if board is None or board["bandwidth_gbs"] is None or board["peak_tflops"] is None:
        need += [
            "the board: --board PRESET (e.g. jetson-orin-nano-8gb)",
            "  or memory_bandwidth_gbs and peak_tflops in config.toml's [board]",
        ]
    if not need:
        return []
    return ["roofline: for the bandwidth floor and the ridge, give", *(f"  {n}" for n in need)]


def _reasons(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(counts.items()))


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' if n != 1 else ''}"


def _head(report: Mapping[str, Any]) -> str:
    runs = report["runs"]
    skipped = sum(report["skipped"].values())
    head = f"timing-proxy report: {_plural(len(runs), 'run')}, {report['requests']:,} requests" + (
        f" (kind {report['kind']})" if report["kind"] else " (chat and tool)"
    )
    if skipped:
        head += f"; {_plural(skipped, 'line')} skipped ({_reasons(report['skipped'])})"
    return head


def _wrap(head: str, items: Sequence[str], width: int = 100) -> list[str]:
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


def _missing_lines(report: Mapping[str, Any]) -> list[str]:
    """Which record fields the logs lacked and how often, and how such records count."""
    missing: Mapping[str, int] = report["missing_fields"]
    if not missing:
        return []
    named = [f"{name} {n:,}" for name, n in list(missing.items())[:_MISSING_SHOWN]]
    more = len(missing) - len(named)
    if more:
        named.append(f"and {more} more (all in --json)")
    return [
        *_wrap("fields missing (read as unknown): ", named),
        *(
            f"{_plural(missing[name], 'record')} with no {name}: {how}"
            for name, how in report["unknown"].items()
        ),
    ]


def _roofline_lines(report: Mapping[str, Any]) -> list[str]:
    roof_lines = report["roofline"]["lines"]
    hint = _roofline_hint(report)
    lines: list[str] = [""] if roof_lines or hint else []
    if roof_lines:
        lines.append(
            "roofline (est. = an estimate; measured = a median from these logs;"
            " spec = the board's data sheet)"
        )
        lines.extend(f"  {line}" for line in roof_lines)
        if hint:
            lines.append("")
    return [*lines, *hint]


def _finding_lines(found: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per finding (cause, section, requests, tokens, ms), its fix wrapped below."""
    shown = found[:_FINDINGS_SHOWN]
    cause_w = max(5, *(len(f["cause"]) for f in shown))
    section_w = max(7, *(len(f["section"] or "-") for f in shown))
    nums = ("requests", "tokens", "ms lost")
    lines = [
        f"  {'cause':<{cause_w}}  {'section':<{section_w}}" + "".join(f"{n:>10}" for n in nums)
    ]
    for f in shown:
        cells = (_int(f["requests"]), _int(f["lost_tokens"]), _ms(f["lost_ms"]))
        lines.append(
            f"  {f['cause']:<{cause_w}}  {f['section'] or '-':<{section_w}}"
            + "".join(f"{c:>10}" for c in cells)
        )
        lines.extend(
            textwrap.wrap(
                f["fix"],
                _WIDTH,
                initial_indent="    fix: ",
                subsequent_indent="         ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        )
    more = len(found) - len(shown)
    if more:
        lines.append(f"  and {_plural(more, 'finding')} more (all in --json)")
    return lines


def _conversation_lines(report: Mapping[str, Any]) -> list[str]:
    """The conversations that lost the most prefill: turns, requests, prefill paid, lost."""
    talks: Mapping[str, Mapping[str, Any]] = report.get("conversations") or {}
    if not talks:
        return []
    seen = report.get("conversations_seen") or len(talks)
    width = max(12, *(len(name) for name in talks))
    cols = ("turns", "requests", "prefill ms", "lost ms")
    lines = [
        f"conversations: the {len(talks):,} of {seen:,} that lost the most prefill to misses",
        f"  {'conversation':<{width}}" + "".join(f"{c:>12}" for c in cols),
    ]
    for name, t in talks.items():
        cells = (_int(t["turns"]), _int(t["requests"]), _ms(t["prefill_ms"]), _ms(t["lost_ms"]))
        lines.append(f"  {name:<{width}}" + "".join(f"{c:>12}" for c in cells))
    return lines


def _prefill_lines(report: Mapping[str, Any]) -> list[str]:
    """Why prefill was paid: the findings with their fixes, then the conversations. Nothing
    for logs without a prefix attribution."""
    attributed = report.get("attributed") or 0
    found: Sequence[Mapping[str, Any]] = report.get("findings") or []
    if not attributed and not found:
        return []
    lines = ["", f"why prefill was paid ({_plural(attributed, 'request')} attributed)"]
    if found:
        lines.append("  ms lost: the prefill paid again, at the proxy's reference prefill rate")
        lines.extend(_finding_lines(found))
    else:
        lines.append("  no prefill was lost to a cache miss")
    talks = _conversation_lines(report)
    return [*lines, *([""] if talks else []), *talks]


def _setup_lines(report: Mapping[str, Any]) -> list[str]:
    """The setup findings, first in the report: one line each, its fix wrapped below."""
    found: Sequence[Mapping[str, Any]] = report.get("setup_findings") or []
    if not found:
        return []
    lines = ["setup findings (fix these first)"]
    for f in found:
        what = f"{f['cause']} ({f['model']}): {_plural(f['requests'], 'request')}"
        if f["ms"]:
            what += f", {_ms(f['ms'])} ms"
        detail = f.get("detail") or {}
        if detail.get("longest_tokens") is not None and f["cause"] == "no_max_tokens":
            what += f", longest generation {_int(detail['longest_tokens'])} tokens"
        if "tool_decode_tok_s" in detail:
            what += (
                f": tool calls {_rate(detail['tool_decode_tok_s'])} tok/s against chat"
                f" {_rate(detail['chat_decode_tok_s'])} (spread {_rate(detail['spread_tok_s'])})"
            )
        lines.append("  " + what)
        lines.extend(
            textwrap.wrap(
                f["fix"],
                _WIDTH,
                initial_indent="    fix: ",
                subsequent_indent="         ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        )
    return [*lines, ""]


def render_text(report: Mapping[str, Any]) -> str:
    """The report as a terminal table (fixed-width columns, units, thousands separators)."""
    lines = [_head(report), *_setup_lines(report)]
    if report["models"]:
        lines.append("model: " + ", ".join(report["models"]))
    apis = report.get("apis") or {}
    if set(apis) - {"unknown"}:
        lines.append("api: " + ", ".join(f"{name} {n:,}" for name, n in sorted(apis.items())))
    lines.extend(_upstream_error_lines(report))
    lines.extend(_missing_lines(report))
    lines.append(f"{COMPLETED_ONLY};")
    lines.append("prefill and decode are llama-server's clock, the other times the proxy's")
    for kind, summary in report["kinds"].items():
        lines.append("")
        lines.extend(_kind_lines(kind, summary))
    by_api = _by_api_lines(report)
    if by_api:
        lines.append("")
        lines.extend(by_api)
    if len(report["runs"]) > 1:
        for kind, per_run in report["per_run"].items():
            block = _per_run_lines(kind, per_run)
            if block:
                lines.append("")
                lines.extend(block)
    lines.extend(_prefill_lines(report))
    lines.extend(_roofline_lines(report))
    return "\n".join(lines) + "\n"
