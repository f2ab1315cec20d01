"""The report document: the runs' records summarised per kind, per run, and on the roofline.

Pure. The numbers reuse :mod:`proxy.core.stats` (its kind summary, quantiles and cache
ratio), so the document's ``kinds`` have the shape of ``/stats``, with two differences that
the document states: percentiles are taken over *completed* requests only (the others are
counted by outcome), and every record of the files counts (``/stats`` keeps a sliding
window).

``by_api`` breaks the kinds down by the API the requests were read with (``/stats``'s
``by_api``, over every record and with each kind's ``outcomes``), and ``upstream_errors``
counts the requests llama-server answered with an HTTP error, by status.

``findings`` and ``conversations`` say why prefill was paid, from the records' prefix
attribution (``prefill_cause``, ``prefill_lost_ms``, ``conversation``, ``turn``): the
findings by cause and section, ranked by the milliseconds lost, aggregated by
:class:`proxy.core.findings.Findings` as ``/stats``'s ``cache.findings`` are (and in their
shape), over every record of the files; and the :data:`TOP_CONVERSATIONS` conversations that
lost the most prefill.

Records read from another harness's log may lack fields (see :mod:`.load`); the document
lists which and how often (``missing_fields``). A record without an ``outcome`` counts as
completed: such a log holds the calls it timed, and the proxy's own log always says the
outcome. A record without a ``kind`` is in neither the chat nor the tool summary: the
report does not guess it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.commands.report.errors import ReportError
from proxy.commands.report.load import RECORD_FIELDS, Run
from proxy.core.findings import Cause, Findings
from proxy.core.record import Kind, Outcome, Record
from proxy.core.roofline import Board, Medians, ModelMeta, roofline_lines, roofline_summary
from proxy.core.setup import SetupFindings
from proxy.core.stats import (
    APIS,
    percentile,
    quantiles,
    status_name,
    summarize_cache,
    summarize_kind,
)

__all__ = [
    "COMPLETED_ONLY",
    "KINDS",
    "MEDIAN_CALL_FIELDS",
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

TOP_CONVERSATIONS = 10
"""How many conversations the report lists (those that lost the most prefill)."""

COMPLETED_ONLY = "percentiles, medians and ratios count completed requests only"

UNKNOWN: Mapping[str, str] = {
    "outcome": "counted as completed",
    "kind": "in neither the chat nor the tool summary",
}
"""How a record whose line lacks the field is counted (the report's ``unknown``)."""


def completed(records: Iterable[Record], kind: str | None = None) -> list[Record]:
    """The records that completed (of ``kind``, when given)."""
    return [
        r for r in records if r.outcome is Outcome.COMPLETED and (kind is None or r.kind == kind)
    ]


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


def _median(records: Iterable[Record], name: str) -> float | None:
    return percentile(_values(records, name), 0.5)


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


def upstream_errors(records: Iterable[Record]) -> dict[str, int]:
    """The records llama-server answered with an HTTP error (outcome ``upstream_error``),
    counted by status (``"500"``; ``"unknown"`` without one), in status order."""
    counts = Counter(status_name(r.status) for r in records if r.outcome is Outcome.UPSTREAM_ERROR)
    return dict(sorted(counts.items()))


def _api_kind(records: Sequence[Record]) -> dict[str, Any]:
    """``/stats``'s summary of one API's requests of one kind (percentiles over the
    completed ones), with their ``outcomes``."""
    done = completed(records)
    out = summarize_kind(done)
    out["count"] = len(records)
    out["window"] = len(done)
    out["outcomes"] = dict(Counter(str(r.outcome) for r in records))
    return out


def _api_order(api: str) -> tuple[int, str]:
    """The order of ``by_api``: the proxy's APIs as :data:`APIS` lists them, then any
    other name (``unknown``, another harness's) alphabetically."""
    return (APIS.index(api), "") if api in APIS else (len(APIS), api)


def _by_api(records: Sequence[Record], kinds: Sequence[str]) -> dict[str, Any]:
    """Per API that had requests (``unknown`` for records without an ``api``): its
    requests, upstream errors by status and a summary per kind (:func:`_api_kind`)."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(r.api or "unknown", []).append(r)
    return {
        api: {
            "requests": len(group),
            "upstream_errors": upstream_errors(group),
            "kinds": {k: _api_kind([r for r in group if r.kind == k]) for k in kinds},
        }
        for api, group in sorted(groups.items(), key=lambda item: _api_order(item[0]))
    }


def _cause(record: Record) -> Cause | None:
    """The record's ``prefill_cause`` when it is one of :class:`Cause`."""
    return _named_cause(record.prefill_cause)


def _named_cause(name: str | None) -> Cause | None:
    """``name`` when it is one of :class:`Cause` (another harness's name is not)."""
    try:
        return Cause(name) if name is not None else None
    except ValueError:
        return None


def setup_findings(runs: Sequence[Run], kinds: Sequence[str] = KINDS) -> list[dict[str, Any]]:
    """The setup findings of the records (``/stats``'s ``findings`` of category ``setup``,
    over every record of the files). A log whose lines lack ``max_tokens`` (another
    harness's, or the proxy's before the field) says nothing about request limits."""
    found = SetupFindings()
    for run in runs:
        limit_known = not run.missing.get("max_tokens")
        for record in run.records:
            if record.kind in kinds:
                found.add(record, limit_known=limit_known)
    return found.findings()


def _in_order(runs: Sequence[Run]) -> list[tuple[str, Record]]:
    """Every record with its conversation's name: the proxy's own name when there is one
    run; ``RUN:NAME`` with several (the proxy numbers conversations per process, so two
    runs' ``c1`` are not the same conversation)."""
    several = len(runs) > 1
    return [
        (f"{run.name}:{r.conversation}" if several else r.conversation or "", r)
        for run in runs
        for r in run.records
    ]


def findings(runs: Sequence[Run], kinds: Sequence[str] = KINDS) -> list[dict[str, Any]]:
    """Why prefill was paid: the records' causes by (cause, section), ranked by the
    milliseconds lost, in ``/stats``'s ``cache.findings`` shape (each with its fix), from the
    records' own lost tokens and milliseconds, as ``/stats`` counts them."""
    found = Findings()
    for run in runs:
        for r in run.records:
            if r.kind not in kinds:
                continue
            cause = _cause(r)
            if cause is not None:
                tokens, ms = r.prefill_lost_tokens, r.prefill_lost_ms
                found.add(cause, r.diverged_section, tokens, ms, r.diverged_offset)
            cache_cause = _named_cause(r.cache_lost_cause)
            if cache_cause is not None:
                found.add(cache_cause, None, r.cache_lost_tokens, r.cache_lost_ms)
    return [f.to_dict() for f in found.ranked()]


def conversations(
    runs: Sequence[Run], kinds: Sequence[str] = KINDS, top: int = TOP_CONVERSATIONS
) -> tuple[dict[str, dict[str, Any]], int]:
    """The ``top`` conversations that lost the most prefill to cache misses (then the most
    prefill paid), each ``{turns, requests, prefill_ms, lost_ms}`` as in ``/stats``, and
    how many conversations the records name."""
    seen: dict[str, dict[str, Any]] = {}
    for name, r in _in_order(runs):
        if r.conversation is None or r.kind not in kinds:
            continue
        entry = seen.setdefault(
            name, {"turns": 0, "requests": 0, "prefill_ms": 0.0, "lost_ms": 0.0}
        )
        entry["turns"] = max(entry["turns"], r.turn or 0)
        entry["requests"] += 1
        entry["prefill_ms"] += r.prefill_ms or 0.0
        entry["lost_ms"] += (r.prefill_lost_ms or 0.0) + (r.cache_lost_ms or 0.0)
    ranked = sorted(seen.items(), key=lambda kv: (-kv[1]["lost_ms"], -kv[1]["prefill_ms"], kv[0]))
    shown = {
        name: {**e, "prefill_ms": round(e["prefill_ms"], 3), "lost_ms": round(e["lost_ms"], 3)}
        for name, e in ranked[:top]
    }
    return shown, len(seen)


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
        done = completed(run.records, kind)
        row: dict[str, Any] = {"name": run.name, "count": len(done)}
        row.update({f: _median(done, f) for f in PER_RUN_FIELDS})
        rows.append(row)
    spread = {f: _spread([v for row in rows if (v := row[f]) is not None]) for f in PER_RUN_FIELDS}
    return {"runs": rows, "spread": spread}


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
        )
    return out


def _missing(counts: Mapping[str, int]) -> dict[str, int]:
    """Missing fields, the most often missing first, then in the record's order."""
    order = {name: i for i, name in enumerate(RECORD_FIELDS)}
    return dict(sorted(counts.items(), key=lambda item: (-item[1], order.get(item[0], 0))))


def _run_entry(run: Run) -> dict[str, Any]:
    return {
        "name": run.name,
        "records": len(run.records),
        "completed": len(completed(run.records)),
        "skipped": dict(run.skipped),
        "missing_fields": _missing(run.missing),
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
    the spread between runs, the ``roofline`` (estimates, when model/board are known), and
    the record fields the logs lacked (``missing_fields``, with ``unknown`` saying how
    records without an outcome or a kind were counted), why prefill was paid (``findings``,
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
    roofline["lines"] = roofline_lines(meta, board, medians)
    skipped: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    for run in runs:
        skipped.update(run.skipped)
        missing.update(run.missing)
    talks, seen = conversations(runs, kinds)
    return {
        "note": COMPLETED_ONLY,
        "kind": kind,
        "runs": [_run_entry(run) for run in runs],
        "requests": len(chosen),
        "skipped": dict(skipped),
        "missing_fields": _missing(missing),
        "unknown": _unknown(missing),
        "models": sorted({r.model for r in chosen if r.model}),
        "outcomes": dict(Counter(str(r.outcome) for r in chosen)),
        "upstream_errors": upstream_errors(chosen),
        "apis": dict(Counter(r.api or "unknown" for r in chosen)),
        "kinds": summaries,
        "by_api": _by_api(chosen, kinds),
        "cache": summarize_cache(completed(chosen)),
        "per_run": {k: _per_run(runs, k) for k in kinds},
        "roofline": roofline,
        "attributed": sum(1 for r in chosen if r.prefix_kind is not None),
        "findings": findings(runs, kinds),
        "setup_findings": setup_findings(runs, kinds),
        "conversations": talks,
        "conversations_seen": seen,
    }
