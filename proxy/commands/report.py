"""``timing-proxy report``: the proxy's own JSON-lines logs read back into a summary.

Each file is one run. The numbers reuse :func:`proxy.core.stats.summarize_kind`, so ``report
--json`` has the ``kinds`` shape of ``/stats``, with two differences that the output states:
percentiles are taken over *completed* requests only (the others are counted by outcome),
and every record of the files counts (``/stats`` keeps a sliding window).

Pure except :func:`load_runs` (reads files), :func:`fetch_model_meta` (one HTTP GET) and the
optional plot in :func:`run_report`.
"""

from __future__ import annotations

import gzip
import os
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.record import Kind, Outcome, Record
from proxy.core.roofline import Board, Medians, ModelMeta, roofline_lines, roofline_summary
from proxy.core.stats import SUMMARY_FIELDS, percentile, summarize_kind

__all__ = [
    "EVENT",
    "KINDS",
    "PER_RUN_FIELDS",
    "ReportError",
    "Run",
    "build_report",
    "fetch_model_meta",
    "load_runs",
    "median_record",
    "render_text",
    "run_report",
]

EVENT = "request_completed"
"""The log event that carries a record."""

KINDS: tuple[str, ...] = (str(Kind.CHAT), str(Kind.TOOL))
"""The kinds the report summarises (as ``/stats`` does)."""

PER_RUN_FIELDS: tuple[str, ...] = (
    "e2e_ms",
    "tool_call_ms",
    "ttft_ms",
    "prefill_ms",
    "decode_ms",
    "decode_tok_s",
)
"""Fields whose median is shown for each run, and whose spread between runs is given."""

COMPLETED_ONLY = "percentiles, medians and ratios count completed requests only"


class ReportError(Exception):
    """The report cannot be made (unreadable file, bad argument); the message says why."""


@dataclass(frozen=True, slots=True)
class Run:
    """One log file: its records and the lines skipped, by reason."""

    name: str
    records: list[Record]
    skipped: Mapping[str, int] = field(default_factory=dict)

    @property
    def skipped_total(self) -> int:
        """All skipped lines."""
        return sum(self.skipped.values())


# -- reading ----------------------------------------------------------------------------------


def _parse_lines(lines: Iterable[bytes]) -> tuple[list[Record], Counter[str]]:
    records: list[Record] = []
    skipped: Counter[str] = Counter()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            skipped["not_json"] += 1
            continue
        if not isinstance(obj, dict):
            skipped["not_json"] += 1
            continue
        if obj.get("event") != EVENT:
            skipped["other_event"] += 1
            continue
        try:
            records.append(Record.from_dict(obj))
        except (TypeError, ValueError):
            skipped["bad_record"] += 1
    return records, skipped


def _run_names(paths: Sequence[str]) -> list[str]:
    """Base names when they are unique, else the paths as given."""
    names = [os.path.basename(p) or p for p in paths]
    return names if len(set(names)) == len(names) else list(paths)


def load_runs(paths: Sequence[str]) -> list[Run]:
    """Read each JSON-lines log (``.gz`` files are decompressed) into a :class:`Run`.

    Lines that are not JSON objects (``not_json``), other events (``other_event``) and
    ``request_completed`` lines that are not a valid record (``bad_record``) are skipped and
    counted. Raises :class:`ReportError` for a file that cannot be read.
    """
    runs: list[Run] = []
    for path, name in zip(paths, _run_names(paths), strict=True):
        try:
            if path.endswith(".gz"):
                with gzip.open(path, "rb") as fh:
                    records, skipped = _parse_lines(fh)
            else:
                with open(path, "rb") as fh:
                    records, skipped = _parse_lines(fh)
        except FileNotFoundError:
            raise ReportError(f"{path}: no such file") from None
        except (OSError, EOFError) as exc:
            raise ReportError(f"{path}: cannot read: {exc}") from None
        runs.append(Run(name, records, dict(skipped)))
    return runs


def fetch_model_meta(upstream_url: str, timeout_s: float = 5.0) -> ModelMeta | None:
    """GET ``{upstream_url}/v1/models`` and read its ``meta``; ``None`` when it has none.

    Raises :class:`ReportError` when the server cannot be reached or does not answer JSON.
    """
    url = upstream_url.rstrip("/") + "/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ReportError(f"{url}: {exc}") from None
    try:
        return ModelMeta.from_models_json(orjson.loads(body))
    except orjson.JSONDecodeError:
        raise ReportError(f"{url}: the answer is not JSON") from None


# -- summarising ------------------------------------------------------------------------------


def _values(records: Iterable[Record], name: str) -> list[float]:
    return sorted(float(v) for r in records if (v := getattr(r, name, None)) is not None)


def _q(records: Iterable[Record], name: str) -> dict[str, float | None]:
    values = _values(records, name)
    return {
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
    }


def _median(records: Iterable[Record], name: str) -> float | None:
    return percentile(_values(records, name), 0.5)


def median_record(records: Sequence[Record], by: str = "e2e_ms") -> Record | None:
    """The record whose ``by`` is the median of ``records`` (the lower one of an even count)."""
    known = sorted((r for r in records if getattr(r, by) is not None), key=lambda r: getattr(r, by))
    return known[(len(known) - 1) // 2] if known else None


def _json_chars(record: Record | None) -> float | None:
    """The median tool call's JSON length, when the log carries it (``tool_args_chars``)."""
    value = record.tool_args_chars if record is not None else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _median_call(record: Record | None) -> dict[str, Any] | None:
    if record is None:
        return None
    keys = (
        "id",
        "ts",
        "model",
        "e2e_ms",
        "ttft_ms",
        "overhead_ms",
        "prefill_ms",
        "decode_ms",
        "prompt_n",
        "cache_n",
        "predicted_n",
        "decode_tok_s",
        "tool_call_ms",
        "tool_call_tokens",
        "tool_call_valid",
    )
    out = {k: getattr(record, k) for k in keys}
    out["tool_args_chars"] = _json_chars(record)
    return out


def _cache(records: Iterable[Record]) -> dict[str, Any]:
    cache_n = prompt = 0
    for r in records:
        if r.cache_n is not None and r.prompt_tokens is not None:
            cache_n += r.cache_n
            prompt += r.prompt_tokens
    return {
        "cache_n": cache_n,
        "prompt_tokens": prompt,
        "hit_ratio": round(cache_n / prompt, 6) if prompt else None,
    }


def _schema(records: Sequence[Record]) -> dict[str, Any]:
    priced = [r for r in records if r.schema_prefill_ms is not None]
    paid = _values(priced, "schema_prefill_ms")
    saved = _values(priced, "schema_saved_ms")
    return {
        "tokens": _q(records, "schema_tokens"),
        "source": dict(Counter(s for r in records if (s := r.schema_tokens_source))),
        "priced": len(priced),
        "cached": sum(1 for r in priced if r.schema_cached),
        "paid_ms": {"total": round(sum(paid), 3), "p50": percentile(paid, 0.5)},
        "saved_ms": {"total": round(sum(saved), 3), "p50": percentile(saved, 0.5)},
    }


def _valid(records: Sequence[Record], kind: str) -> dict[str, int]:
    """Valid tool calls, k of n: n = completed tool requests (no call at all is not valid)."""
    of = len(records) if kind == Kind.TOOL else sum(1 for r in records if r.tool_calls)
    valid = sum(1 for r in records if r.tool_call_valid is True)
    invalid = sum(1 for r in records if r.tool_call_valid is False)
    return {"valid": valid, "of": of, "invalid": invalid, "no_call": of - valid - invalid}


def _summarize(records: Sequence[Record], kind: str) -> dict[str, Any]:
    """``/stats``'s kind summary over completed records, plus the report's extras."""
    done = [r for r in records if r.outcome is Outcome.COMPLETED]
    out = summarize_kind(done)
    out["count"] = len(records)
    out["window"] = len(done)
    out["outcomes"] = dict(Counter(str(r.outcome) for r in records))
    out["prompt_n"] = _q(done, "prompt_n")
    out["tool_call_tokens"] = _q(done, "tool_call_tokens")
    out["tool_decode_tok_s"] = _q(done, "tool_decode_tok_s")
    out["tool_calls_valid"] = _valid(done, kind)
    out["schema"] = _schema(done)
    out["cache"] = _cache(done)
    out["median_call"] = _median_call(median_record(done))
    return out


def _spread(medians: list[float]) -> dict[str, float] | None:
    if len(medians) < 2:
        return None
    lo, hi = min(medians), max(medians)
    centre = percentile(sorted(medians), 0.5) or 0.0
    return {
        "min": lo,
        "max": hi,
        "ms": round(hi - lo, 3),
        "pct": round(100.0 * (hi - lo) / centre, 2) if centre else 0.0,
    }


def _per_run(runs: Sequence[Run], kind: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for run in runs:
        done = [r for r in run.records if r.kind == kind and r.outcome is Outcome.COMPLETED]
        row: dict[str, Any] = {"name": run.name, "count": len(done)}
        row.update({f: _median(done, f) for f in PER_RUN_FIELDS})
        rows.append(row)
    spread = {f: _spread([v for row in rows if (v := row[f]) is not None]) for f in PER_RUN_FIELDS}
    return {"runs": rows, "spread": spread}


def build_report(
    runs: Sequence[Run],
    kind: str | None = None,
    meta: ModelMeta | None = None,
    board: Board | None = None,
) -> dict[str, Any]:
    """The report document: runs, the ``/stats``-shaped ``kinds``, ``per_run`` medians with
    the spread between runs, and the ``roofline`` (estimates, when model/board are known).

    ``kind`` (``chat`` or ``tool``) keeps only that kind.
    """
    if kind is not None and kind not in KINDS:
        raise ReportError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    kinds = [kind] if kind is not None else list(KINDS)
    records = [r for run in runs for r in run.records]
    chosen = [r for r in records if r.kind in kinds]
    summaries = {k: _summarize([r for r in chosen if r.kind == k], k) for k in kinds}
    medians = {
        k: Medians(
            decode_tok_s=s["decode_tok_s"]["p50"],
            prompt_n=s["prompt_n"]["p50"],
            tool_call_tokens=(s["median_call"] or {}).get("tool_call_tokens"),
            json_chars=(s["median_call"] or {}).get("tool_args_chars"),
        )
        for k, s in summaries.items()
        if s["window"]
    }
    roofline = roofline_summary(meta, board, medians)
    roofline["lines"] = roofline_lines(meta, board, medians)
    skipped: Counter[str] = Counter()
    for run in runs:
        skipped.update(run.skipped)
    return {
        "note": COMPLETED_ONLY,
        "kind": kind,
        "runs": [
            {
                "name": run.name,
                "records": len(run.records),
                "completed": sum(1 for r in run.records if r.outcome is Outcome.COMPLETED),
                "skipped": dict(run.skipped),
            }
            for run in runs
        ],
        "requests": len(chosen),
        "skipped": dict(skipped),
        "models": sorted({r.model for r in chosen if r.model}),
        "outcomes": dict(Counter(str(r.outcome) for r in chosen)),
        "kinds": summaries,
        "cache": _cache(r for r in chosen if r.outcome is Outcome.COMPLETED),
        "per_run": {k: _per_run(runs, k) for k in kinds},
        "roofline": roofline,
    }


# -- rendering --------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    """Milliseconds as the seed writes them: ``2,061``, ``93.5``, ``4.25``."""
    if value is None:
        return "-"
    if abs(value) >= 100 or value == round(value):
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _int(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


_ROWS: tuple[tuple[str, str, Callable[[float | None], str]], ...] = (
    ("ttft_ms", "TTFT ms", _ms),
    ("prefill_ms", "prefill ms", _ms),
    ("decode_ms", "decode ms", _ms),
    ("e2e_ms", "end-to-end ms", _ms),
    ("decode_tok_s", "decode tok/s", _rate),
    ("tool_call_ms", "tool call complete ms", _ms),
    ("overhead_ms", "overhead ms", _ms),
)
_EXTRA_ROWS: tuple[tuple[str, str, Callable[[float | None], str]], ...] = (
    ("prompt_n", "prompt tokens evaluated", _int),
    ("tool_call_tokens", "tool-call tokens", _int),
    ("tool_decode_tok_s", "tool-call decode tok/s", _rate),
)


def _rows() -> list[tuple[str, str, Callable[[float | None], str]]]:
    """The table rows: the known summary fields, then any other field ``/stats`` summarises."""
    known = {name for name, _, _ in _ROWS}
    rest = [(n, n, _ms if n.endswith("_ms") else _rate) for n in SUMMARY_FIELDS if n not in known]
    return [*_ROWS, *rest, *_EXTRA_ROWS]


_LABEL = 26
_COL = 10


def _table_row(label: str, cells: Sequence[str]) -> str:
    return f"  {label:<{_LABEL}}" + "".join(f"{c:>{_COL}}" for c in cells)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} %"


def _kind_lines(kind: str, s: Mapping[str, Any]) -> list[str]:
    outcomes = ", ".join(f"{n} {o}" for o, n in sorted(s["outcomes"].items()))
    lines = [f"{kind}: {s['count']:,} requests ({outcomes or 'none'})"]
    if not s["window"]:
        lines.append("  no completed requests")
        return lines
    lines.append(_table_row("", ["p50", "p90", "p99"]))
    for name, label, fmt in _rows():
        q = s.get(name)
        if not isinstance(q, dict):
            continue
        if q.get("p50") is None:
            continue
        lines.append(_table_row(label, [fmt(q["p50"]), fmt(q["p90"]), fmt(q["p99"])]))
    split = s["split"]
    if split["prefill_ms"] is not None and split["decode_ms"] is not None:
        lines.append(
            f"  {'split (medians)':<{_LABEL}}prefill {_ms(split['prefill_ms'])} ms"
            f" ({_pct(split['prefill_pct'])}) + decode {_ms(split['decode_ms'])} ms"
            f" ({_pct(split['decode_pct'])})"
        )
    schema = s["schema"]
    if schema["tokens"]["p50"] is not None:
        sources = ", ".join(sorted(schema["source"])) or "unknown"
        lines.append(
            f"  {'schema tokens (p50)':<{_LABEL}}{_int(schema['tokens']['p50'])}"
            f" (counted by: {sources})"
        )
    if schema["priced"]:
        paid, saved = schema["paid_ms"], schema["saved_ms"]
        lines.append(
            f"  {'schema prefill paid':<{_LABEL}}{_ms(paid['total'])} ms in all,"
            f" p50 {_ms(paid['p50'])} ms per call"
        )
        lines.append(
            f"  {'schema prefill saved':<{_LABEL}}{_ms(saved['total'])} ms in all,"
            f" p50 {_ms(saved['p50'])} ms per call ({schema['cached']} of {schema['priced']}"
            " calls with the schema cached)"
        )
    valid = s["tool_calls_valid"]
    if valid["of"]:
        extra = [f"{valid[k]} {k.replace('_', ' ')}" for k in ("invalid", "no_call") if valid[k]]
        lines.append(
            f"  {'valid tool calls':<{_LABEL}}{valid['valid']} of {valid['of']}"
            + (f" ({', '.join(extra)})" if extra else "")
        )
    cache = s["cache"]
    if cache["hit_ratio"] is not None:
        lines.append(
            f"  {'prompt cache hit ratio':<{_LABEL}}{100 * cache['hit_ratio']:.1f} %"
            f" ({cache['cache_n']:,} of {cache['prompt_tokens']:,} prompt tokens)"
        )
    call = s["median_call"]
    if call is not None:
        parts = [f"{_ms(call['e2e_ms'])} ms end to end"]
        if call["prefill_ms"] is not None and call["decode_ms"] is not None:
            parts.append(f"prefill {_ms(call['prefill_ms'])} + decode {_ms(call['decode_ms'])} ms")
        if call["predicted_n"] is not None:
            parts.append(f"{call['predicted_n']} tokens")
        lines.append(f"  {'median call':<{_LABEL}}{call['id']}: " + ", ".join(parts))
    return lines


_RUN_COLS: tuple[tuple[str, str, Callable[[float | None], str]], ...] = (
    ("e2e_ms", "e2e ms", _ms),
    ("tool_call_ms", "tool ms", _ms),
    ("ttft_ms", "TTFT ms", _ms),
    ("prefill_ms", "prefill ms", _ms),
    ("decode_ms", "decode ms", _ms),
    ("decode_tok_s", "tok/s", _rate),
)


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
    cells = []
    for name, _, fmt in cols:
        spread = per_run["spread"][name]
        cells.append("-" if spread is None else fmt(spread["ms"]))
    lines.append(f"  {'spread':<{width}}{'':>6}" + "".join(f"{c:>{_COL + 2}}" for c in cells))
    main = next((name for name in ("tool_call_ms", "e2e_ms") if per_run["spread"].get(name)), None)
    if main is not None:
        sp = per_run["spread"][main]
        medians = " / ".join(_ms(row[main]) for row in rows if row[main] is not None)
        lines.append(f"  spread between the runs' {main} medians: {medians} ms")
        lines.append(f"  max - min = {_ms(sp['ms'])} ms, {sp['pct']:.1f} % of the median run")
    return lines


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


def render_text(report: Mapping[str, Any]) -> str:
    """The report as a terminal table (fixed-width columns, units, thousands separators)."""
    runs = report["runs"]
    skipped = sum(report["skipped"].values())
    head = (
        f"timing-proxy report: {len(runs)} run{'s' if len(runs) != 1 else ''},"
        f" {report['requests']:,} requests"
        + (f" (kind {report['kind']})" if report["kind"] else " (chat and tool)")
    )
    if skipped:
        reasons = ", ".join(
            f"{n} {k.replace('_', ' ')}" for k, n in sorted(report["skipped"].items())
        )
        head += f"; {skipped:,} line{'s' if skipped != 1 else ''} skipped ({reasons})"
    lines = [head]
    if report["models"]:
        lines.append("model: " + ", ".join(report["models"]))
    lines.append(f"{COMPLETED_ONLY};")
    lines.append("prefill and decode are llama-server's clock, the other times the proxy's")
    for kind, summary in report["kinds"].items():
        lines.append("")
        lines.extend(_kind_lines(kind, summary))
    if len(runs) > 1:
        for kind, per_run in report["per_run"].items():
            block = _per_run_lines(kind, per_run)
            if block:
                lines.append("")
                lines.extend(block)
    roof_lines = report["roofline"]["lines"]
    hint = _roofline_hint(report)
    if roof_lines or hint:
        lines.append("")
    if roof_lines:
        lines.append(
            "roofline (est. = an estimate; measured = a median from these logs;"
            " spec = the board's data sheet)"
        )
        lines.extend(f"  {line}" for line in roof_lines)
        if hint:
            lines.append("")
    lines.extend(hint)
    return "\n".join(lines) + "\n"


def run_report(
    paths: list[str],
    *,
    json_out: bool,
    kind: str | None,
    plot: str | None,
    board: Board | None,
    meta: ModelMeta | None,
) -> str:
    """What ``timing-proxy report`` prints: the text table or (``json_out``) the JSON document.

    With ``plot`` set, also draws the clock of the median chat and tool call to that PNG.
    Raises :class:`ReportError` (missing file, bad ``kind``, matplotlib not installed).
    """
    if not paths:
        raise ReportError("give at least one log file")
    report = build_report(load_runs(paths), kind=kind, meta=meta, board=board)
    if plot is not None:
        from proxy.commands.plot import plot_clock

        plot_clock(report, plot)
        report["plot"] = plot
    if json_out:
        return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
    text = render_text(report)
    if plot is not None:
        text += f"\nclock of the median calls drawn to {plot}\n"
    return text
