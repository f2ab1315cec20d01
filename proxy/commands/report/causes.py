"""Why prefill was paid, from the records' prefix attribution, and the setup findings.

Pure. ``findings`` and ``conversations`` say why prefill was paid, from the records'
``prefill_cause``, ``prefill_lost_ms``, ``conversation`` and ``turn``: the findings by cause
and section, ranked by the milliseconds lost, aggregated by
:class:`proxy.core.findings.Findings` as ``/stats``'s ``cache.findings`` are (and in their
shape), over every record of the files; and the :data:`TOP_CONVERSATIONS` conversations
that lost the most prefill. ``setup_findings`` are ``/stats``'s findings of category
``setup`` over the same records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.commands.report.load import Run
from proxy.core.findings import Cause, Findings
from proxy.core.record import Kind, Record
from proxy.core.setup import SetupFindings

__all__ = ["KINDS", "TOP_CONVERSATIONS", "conversations", "findings", "setup_findings"]

KINDS: tuple[str, ...] = (str(Kind.CHAT), str(Kind.TOOL))
"""The kinds the report summarises (as ``/stats`` does)."""

TOP_CONVERSATIONS = 10
"""How many conversations the report lists (those that lost the most prefill)."""


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
