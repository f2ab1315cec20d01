"""The report document as a terminal table: fixed-width columns, units, thousands separators.

Pure: a :func:`proxy.commands.report.summary.build_report` document in, text out. Times are
written by :func:`proxy.core.numbers.figure_or_dash` (``2,061``, ``93.5``, ``4.25``). This
module writes the head (what was read and how), the kinds and the roofline section; the
other tables are :mod:`.render_tables`, the roofline's lines :mod:`.roofline_text`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.commands.report.render_tables import (
    by_api_lines,
    per_run_lines,
    prefill_lines,
    setup_lines,
)
from proxy.commands.report.roofline_text import tools_prefill_lines
from proxy.commands.report.summary import COMPLETED_ONLY
from proxy.commands.report.textfmt import Format as _Format
from proxy.commands.report.textfmt import integer as _int
from proxy.commands.report.textfmt import labelled as _labelled
from proxy.commands.report.textfmt import ms as _ms
from proxy.commands.report.textfmt import pct as _pct
from proxy.commands.report.textfmt import plural as _plural
from proxy.commands.report.textfmt import rate as _rate
from proxy.commands.report.textfmt import share as _share
from proxy.commands.report.textfmt import table_row as _table_row
from proxy.commands.report.textfmt import wrap as _wrap
from proxy.core.summaries import SUMMARY_FIELDS

__all__ = ["render_text"]

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
_MISSING_SHOWN = 12
"""How many missing fields the text names (``--json`` has them all)."""


def _rows() -> list[tuple[str, str, _Format]]:
    """The table rows: the known summary fields, then any other field ``/stats`` summarises."""
    known = {name for name, _, _ in _ROWS}
    rest = [(n, n, _ms if n.endswith("_ms") else _rate) for n in SUMMARY_FIELDS if n not in known]
    return [*_ROWS, *rest, *_EXTRA_ROWS]


def _percentile_lines(s: Mapping[str, Any]) -> list[str]:
    lines = [_table_row("of the calls", ["p50", "p90", "p99"])]
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


def _median_call_lines(call: Mapping[str, Any] | None, calls_rate: float | None) -> list[str]:
    """The median call (by end-to-end time); its own decode rate beside the median of the
    calls' rates (``calls_rate``), which is another number."""
    if call is None:
        return []
    parts = [f"{_ms(call['e2e_ms'])} ms end to end"]
    if call["prefill_ms"] is not None and call["decode_ms"] is not None:
        parts.append(f"prefill {_ms(call['prefill_ms'])} + decode {_ms(call['decode_ms'])} ms")
    if call["predicted_n"] is not None:
        parts.append(f"{call['predicted_n']} tokens")
    name = call["id"] if call["id"] is not None else "(no id)"
    lines = [_labelled("median call", f"{name}: " + ", ".join(parts))]
    if call["decode_tok_s"] is not None:
        own = f"its own rate {_rate(call['decode_tok_s'])} tok/s"
        if calls_rate is not None:
            own += f"; the p50 above, {_rate(calls_rate)}, is the calls' median"
        lines.append(_labelled("", own))
    return lines


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
        *_median_call_lines(s["median_call"], s["decode_tok_s"]["p50"]),
    ]


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


def _head(report: Mapping[str, Any]) -> str:
    runs = report["runs"]
    skipped = sum(report["skipped"].values())
    head = f"timing-proxy report: {_plural(len(runs), 'run')}, {report['requests']:,} requests" + (
        f" (kind {report['kind']})" if report["kind"] else " (chat and tool)"
    )
    if skipped:
        entry = "entry" if any(run.get("read_as") for run in runs) else "line"
        noun = _plural(skipped, entry).replace("entrys", "entries")
        head += f"; {noun} skipped ({_reasons(report['skipped'])})"
    return head


def _of(how: str, n: int, records: int) -> str:
    """A rename or derivation, with how many records it was for when not all of them."""
    return how if n >= records else f"{how} ({n:,} of {records:,})"


def _read_lines(report: Mapping[str, Any]) -> list[str]:
    """How each file that is not plain JSON lines was read, the harness names mapped and
    the fields derived: nothing for the proxy's own logs."""
    lines = [f"read {run['name']} as {run['read_as']}" for run in report["runs"] if run["read_as"]]
    records = report["requests_read"]
    mapped: Mapping[str, int] = report.get("mapped") or {}
    if mapped:
        lines += _wrap("names mapped:", list(mapped))
    derived: Mapping[str, int] = report.get("derived") or {}
    if derived:
        lines += _wrap("derived:", [_of(how, n, records) for how, n in derived.items()])
        if any(how.startswith("prefill_ms") for how in derived):
            lines.append("  (prefill = TTFT includes the wait before the prefill: an upper bound)")
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


def render_text(report: Mapping[str, Any]) -> str:
    """The report as a terminal table (fixed-width columns, units, thousands separators)."""
    lines = [_head(report), *_read_lines(report), *setup_lines(report)]
    if report["models"]:
        lines.append("model: " + ", ".join(report["models"]))
    apis = report.get("apis") or {}
    if set(apis) - {"unknown"}:
        lines.append("api: " + ", ".join(f"{name} {n:,}" for name, n in sorted(apis.items())))
    lines.extend(_upstream_error_lines(report))
    lines.extend(_missing_lines(report))
    lines.append(f"{COMPLETED_ONLY};")
    if report.get("derived"):
        lines.append(
            "the times are the logs' own; prefill and decode derived where they lacked them"
        )
    else:
        lines.append("prefill and decode are llama-server's clock, the other times the proxy's")
    for kind, summary in report["kinds"].items():
        lines.append("")
        lines.extend(_kind_lines(kind, summary))
    check = tools_prefill_lines(report.get("tools_prefill"))
    if check:
        lines.append("")
        lines.extend(check)
    by_api = by_api_lines(report)
    if by_api:
        lines.append("")
        lines.extend(by_api)
    if len(report["runs"]) > 1:
        for kind, per_run in report["per_run"].items():
            block = per_run_lines(kind, per_run)
            if block:
                lines.append("")
                lines.extend(block)
    lines.extend(prefill_lines(report))
    lines.extend(_roofline_lines(report))
    return "\n".join(lines) + "\n"
