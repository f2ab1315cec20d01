"""``timing-proxy report`` end to end: read the logs, build the document, print it (and plot).

I/O: reads the log files and, with ``--plot``, writes a PNG through :mod:`proxy.commands.plot`
(which imports the summary, never this module: the dependency goes one way).
"""

from __future__ import annotations

import orjson

from proxy.commands.errors import ReportError
from proxy.commands.report.load import Run, load_runs
from proxy.commands.report.render import render_text
from proxy.commands.report.summary import build_report
from proxy.core.roofline import Board, ModelMeta

__all__ = ["SHAPES", "run_report"]

SHAPES = (
    "report reads JSON lines of calls (the proxy's --log-file, bench's logs, or any with a"
    " kind or a time: ttft_ms, e2e_ms, total_ms, latency_ms, ...), a JSON list of calls, or"
    ' one JSON document of calls per kind: {"chat": [...], "tool": [...]}'
)
"""The shapes a log may have, as the error for an unreadable one names them."""


def _nothing_read(runs: list[Run]) -> str:
    """Why no record came out of the files, and what they may hold."""
    parts = []
    for run in runs:
        reasons = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in sorted(run.skipped.items()))
        parts.append(f"{run.name}: {reasons or 'empty'}")
    return f"no call could be read ({'; '.join(parts)}); {SHAPES}"


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
    Raises :class:`ReportError` (missing file, no call read from any file, naming the
    shapes a log may have; bad ``kind``, matplotlib not installed, nothing to plot).
    """
    if not paths:
        raise ReportError("give at least one log file")
    runs = load_runs(paths)
    if not any(run.records for run in runs):
        raise ReportError(_nothing_read(runs))
    report = build_report(runs, kind=kind, meta=meta, board=board)
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
