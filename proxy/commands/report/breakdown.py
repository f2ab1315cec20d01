"""The report's breakdowns of the records: by API, by run, and the completed ones.

Pure. ``by_api`` breaks the kinds down by the API the requests were read with (``/stats``'s
``by_api``, over every record and with each kind's ``outcomes``), ``upstream_errors``
counts the requests llama-server answered with an HTTP error, by status, and ``per_run``
gives each run's medians and the spread between the runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from proxy.commands.report.load import Run
from proxy.core.record import Outcome, Record
from proxy.core.stats import APIS, status_name
from proxy.core.summaries import percentile, summarize_kind

__all__ = ["PER_RUN_FIELDS", "by_api", "completed", "per_run", "upstream_errors"]

PER_RUN_FIELDS: tuple[str, ...] = (
    "e2e_ms",
    "tool_call_ms",
    "ttft_ms",
    "prefill_ms",
    "decode_ms",
    "decode_tok_s",
)
"""Fields whose median is shown for each run, and whose spread between runs is given."""


def completed(records: Iterable[Record], kind: str | None = None) -> list[Record]:
    """The records that completed (of ``kind``, when given)."""
    return [
        r for r in records if r.outcome is Outcome.COMPLETED and (kind is None or r.kind == kind)
    ]


def _median(records: Iterable[Record], name: str) -> float | None:
    values = sorted(float(v) for r in records if (v := getattr(r, name, None)) is not None)
    return percentile(values, 0.5)


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


def by_api(records: Sequence[Record], kinds: Sequence[str]) -> dict[str, Any]:
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


def per_run(runs: Sequence[Run], kind: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for run in runs:
        done = completed(run.records, kind)
        row: dict[str, Any] = {"name": run.name, "count": len(done)}
        row.update({f: _median(done, f) for f in PER_RUN_FIELDS})
        rows.append(row)
    spread = {f: _spread([v for row in rows if (v := row[f]) is not None]) for f in PER_RUN_FIELDS}
    return {"runs": rows, "spread": spread}
