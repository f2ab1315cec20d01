"""The report document: the runs' records summarised per kind, per run, and on the roofline.

Pure. The numbers reuse :mod:`proxy.core.summaries` (the kind summary, quantiles and cache
ratio), so the document's ``kinds`` have the shape of ``/stats``, with two differences that
the document states: percentiles are taken over *completed* requests only (the others are
counted by outcome), and every record of the files counts (``/stats`` keeps a sliding
window).

``by_api``, ``upstream_errors`` and ``per_run``: :mod:`.breakdown`. Why prefill was paid
(``findings``, ``conversations``) and the setup findings: :mod:`.causes`.

``tools_prefill`` is the Jetson measurement's cross-check, tool TTFT p50 - chat TTFT p50,
and the ``roofline`` its arithmetic on these medians
(:mod:`proxy.core.roofline_summary`; the lines: :mod:`.roofline_text`).

Records read from another harness's log may lack fields (see :mod:`.load`); the document
lists which and how often (``missing_fields``, those the summary needs first), which of the
harness's names were mapped (``mapped``) and which fields derived (``derived``). A record
without an ``outcome`` counts as completed: such a log holds the calls it timed, and the
proxy's own log always says the outcome. A record without a ``kind`` is in neither the chat
nor the tool summary: the report does not guess it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.commands.errors import ReportError
from proxy.commands.report.breakdown import (
    PER_RUN_FIELDS,
    by_api,
    completed,
    per_run,
    upstream_errors,
)
from proxy.commands.report.causes import (
    KINDS,
    TOP_CONVERSATIONS,
    conversations,
    findings,
    setup_findings,
)
from proxy.commands.report.harness import DERIVED
from proxy.commands.report.load import RECORD_FIELDS, Run
from proxy.commands.report.roofline_text import roofline_lines
from proxy.core.boards import Board
from proxy.core.record import Kind, Record
from proxy.core.roofline import ModelMeta
from proxy.core.roofline_summary import Medians, roofline_summary, tools_prefill
from proxy.core.summaries import (
    percentile,
    quantiles,
    summarize_cache,
    summarize_kind,
)

__all__ = [
    "COMPLETED_ONLY",
    "KINDS",
    "MEDIAN_CALL_FIELDS",
    "NEEDED_FIELDS",
    "PER_RUN_FIELDS",
    "TOP_CONVERSATIONS",
    "UNKNOWN",
    "build_report",
    "completed",
    "conversations",
    "findings",
    "median_call",
    "median_record",
    "setup_findings",
    "upstream_errors",
]

MEDIAN_CALL_FIELDS: tuple[str, ...] = (
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
"""The record fields of the median call (plus its ``tool_args_chars``)."""

NEEDED_FIELDS: tuple[str, ...] = (
    "kind",
    "e2e_ms",
    "ttft_ms",
    "prefill_ms",
    "decode_ms",
    "predicted_n",
)
"""The fields the summary is made of: named first among the missing ones."""

COMPLETED_ONLY = "percentiles, medians and ratios count completed requests only"

UNKNOWN: Mapping[str, str] = {
    "outcome": "counted as completed",
    "kind": "in neither the chat nor the tool summary",
}
"""How a record whose line lacks the field is counted (the report's ``unknown``)."""


def median_record(records: Sequence[Record], by: str = "e2e_ms") -> Record | None:
    """The record whose ``by`` is the median of ``records`` (the lower one of an even count)."""
    known = sorted((r for r in records if getattr(r, by) is not None), key=lambda r: getattr(r, by))
    return known[(len(known) - 1) // 2] if known else None


def _json_chars(record: Record) -> float | None:
    """The tool call's JSON length, when the log carries it (``tool_args_chars``)."""
    value = record.tool_args_chars
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def median_call(record: Record | None) -> dict[str, Any] | None:
    """The median call as the document shows it: :data:`MEDIAN_CALL_FIELDS` and
    ``tool_args_chars``; ``None`` for no record."""
    if record is None:
        return None
    out = {k: getattr(record, k) for k in MEDIAN_CALL_FIELDS}
    out["tool_args_chars"] = _json_chars(record)
    return out


def _values(records: Iterable[Record], name: str) -> list[float]:
    return sorted(float(v) for r in records if (v := getattr(r, name, None)) is not None)


def _q(records: Iterable[Record], name: str) -> dict[str, float | None]:
    return quantiles(_values(records, name))


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


def _images(records: Sequence[Record]) -> dict[str, Any]:
    """The requests with images: how many, their image tokens per call, how many images the
    cache covered, and the prefill the prefilled ones cost (as ``_schema`` for the tools)."""
    with_images = [r for r in records if r.images]
    paid = _values(with_images, "image_prefill_ms")
    return {
        "requests": len(with_images),
        "images": sum(r.images or 0 for r in with_images),
        "cached": sum(r.images_cached or 0 for r in with_images),
        "tokens": _q(with_images, "image_tokens"),
        "paid_ms": {"total": round(sum(paid), 3), "p50": percentile(paid, 0.5)},
    }


def _board(records: Sequence[Record]) -> dict[str, Any]:
    """What the board telemetry measured of the requests it covered: energy per call and
    per token, mean power, llama-server's CPU time."""
    return {
        "covered": sum(1 for r in records if r.energy_mj is not None),
        "energy_mj": _q(records, "energy_mj"),
        "energy_mj_per_token": _q(records, "energy_mj_per_token"),
        "power_w_avg": _q(records, "power_w_avg"),
        "upstream_cpu_ms": _q(records, "upstream_cpu_ms"),
    }


def _valid(records: Sequence[Record], kind: str) -> dict[str, int]:
    """Valid tool calls, k of n: n = completed tool requests (no call at all is not valid)
    whose calls are known: one with neither ``tool_calls`` nor ``tool_call_valid`` (not
    analysed, or a log without those fields) is left out, not counted as "no call"."""
    if kind == Kind.TOOL:
        of = sum(1 for r in records if r.tool_calls is not None or r.tool_call_valid is not None)
    else:
        of = sum(1 for r in records if r.tool_calls)
    valid = sum(1 for r in records if r.tool_call_valid is True)
    invalid = sum(1 for r in records if r.tool_call_valid is False)
    return {"valid": valid, "of": of, "invalid": invalid, "no_call": of - valid - invalid}


def _summarize(records: Sequence[Record], kind: str) -> dict[str, Any]:
    """``/stats``'s kind summary over completed records, plus the report's extras."""
    done = completed(records)
    out = summarize_kind(done)
    out["count"] = len(records)
    out["window"] = len(done)
    out["outcomes"] = dict(Counter(str(r.outcome) for r in records))
    out["prompt_n"] = _q(done, "prompt_n")
    out["tool_call_tokens"] = _q(done, "tool_call_tokens")
    out["tool_decode_tok_s"] = _q(done, "tool_decode_tok_s")
    out["tool_calls_valid"] = _valid(done, kind)
    out["schema"] = _schema(done)
    out["images"] = _images(done)
    out["board"] = _board(done)
    out["cache"] = summarize_cache(done)
    out["median_call"] = median_call(median_record(done))
    return out


def _medians(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Medians]:
    """What the roofline takes of each kind that has completed requests."""
    out: dict[str, Medians] = {}
    for kind, s in summaries.items():
        if not s["window"]:
            continue
        call = s["median_call"] or {}
        out[kind] = Medians(
            decode_tok_s=s["decode_tok_s"]["p50"],
            prompt_n=s["prompt_n"]["p50"],
            tool_call_tokens=call.get("tool_call_tokens"),
            json_chars=call.get("tool_args_chars"),
            energy_mj=s["board"]["energy_mj"]["p50"],
            prefill_ms=s["prefill_ms"]["p50"],
            ttft_ms=s["ttft_ms"]["p50"],
        )
    return out


def _missing(counts: Mapping[str, int]) -> dict[str, int]:
    """Missing fields: those the summary needs (:data:`NEEDED_FIELDS`) first, in that
    order; then the most often missing first, then in the record's order."""
    needed = {name: i for i, name in enumerate(NEEDED_FIELDS)}
    order = {name: i for i, name in enumerate(RECORD_FIELDS)}
    return dict(
        sorted(
            counts.items(),
            key=lambda item: (
                needed.get(item[0], len(needed)),
                -item[1],
                order.get(item[0], 0),
            ),
        )
    )


def _derived(counts: Mapping[str, int]) -> dict[str, int]:
    """Derived fields as the report says them (``"prefill_ms = ttft_ms"``), in
    :data:`.harness.DERIVED` order."""
    return {how: counts[name] for name, how in DERIVED.items() if counts.get(name)}


def _run_entry(run: Run) -> dict[str, Any]:
    return {
        "name": run.name,
        "read_as": run.read_as,
        "records": len(run.records),
        "completed": len(completed(run.records)),
        "skipped": dict(run.skipped),
        "missing_fields": _missing(run.missing),
        "mapped": dict(run.mapped),
        "derived": _derived(run.derived),
    }


def _unknown(missing: Mapping[str, int]) -> dict[str, str]:
    """How the records that lack an outcome or a kind were counted (those that exist)."""
    return {name: how for name, how in UNKNOWN.items() if missing.get(name)}


def build_report(
    runs: Sequence[Run],
    kind: str | None = None,
    meta: ModelMeta | None = None,
    board: Board | None = None,
) -> dict[str, Any]:
    """The report document: runs, the ``/stats``-shaped ``kinds`` (across APIs; ``apis``
    counts the requests per API, ``unknown`` for a log without the field, and ``by_api``
    summarises each API's kinds), ``upstream_errors`` by status, ``per_run`` medians with
    the spread between runs, ``tools_prefill`` (tool TTFT - chat TTFT, with the tokens it
    stands for; ``None`` without both kinds), the ``roofline`` (estimates, when model/board
    are known), the record fields the logs lacked (``missing_fields``, with ``unknown``
    saying how records without an outcome or a kind were counted), the harness names
    ``mapped`` and the fields ``derived`` (``{}`` for the proxy's own logs), why prefill was
    paid (``findings``,
    ``conversations`` of the ``conversations_seen``, and ``attributed``: the records with a
    prefix attribution, 0 for logs without one).

    ``kind`` (``chat`` or ``tool``) keeps only that kind.
    """
    if kind is not None and kind not in KINDS:
        raise ReportError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    kinds = [kind] if kind is not None else list(KINDS)
    chosen = [r for run in runs for r in run.records if r.kind in kinds]
    summaries = {k: _summarize([r for r in chosen if r.kind == k], k) for k in kinds}
    medians = _medians(summaries)
    roofline = roofline_summary(meta, board, medians)
    roofline["lines"] = roofline_lines(roofline)
    skipped: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    mapped: Counter[str] = Counter()
    derived: Counter[str] = Counter()
    for run in runs:
        skipped.update(run.skipped)
        missing.update(run.missing)
        mapped.update(run.mapped)
        derived.update(run.derived)
    talks, seen = conversations(runs, kinds)
    return {
        "note": COMPLETED_ONLY,
        "kind": kind,
        "runs": [_run_entry(run) for run in runs],
        "requests": len(chosen),
        "requests_read": sum(len(run.records) for run in runs),
        "skipped": dict(skipped),
        "missing_fields": _missing(missing),
        "unknown": _unknown(missing),
        "mapped": dict(mapped),
        "derived": _derived(derived),
        "models": sorted({r.model for r in chosen if r.model}),
        "outcomes": dict(Counter(str(r.outcome) for r in chosen)),
        "upstream_errors": upstream_errors(chosen),
        "apis": dict(Counter(r.api or "unknown" for r in chosen)),
        "kinds": summaries,
        "by_api": by_api(chosen, kinds),
        "cache": summarize_cache(completed(chosen)),
        "per_run": {k: per_run(runs, k) for k in kinds},
        "tools_prefill": tools_prefill(medians, meta, board),
        "roofline": roofline,
        "attributed": sum(1 for r in chosen if r.prefix_kind is not None),
        "findings": findings(runs, kinds),
        "setup_findings": setup_findings(runs, kinds),
        "conversations": talks,
        "conversations_seen": seen,
    }
