"""``timing-proxy report`` end to end: read the logs, build the document, print it (and plot).

I/O: reads the log files and, with ``--plot``, writes a PNG through :mod:`proxy.commands.plot`
(which imports the summary, never this module: the dependency goes one way).
"""

from __future__ import annotations

import orjson

from proxy.commands.report.errors import ReportError
from proxy.commands.report.load import load_runs
from proxy.commands.report.render import render_text
from proxy.commands.report.summary import build_report
from proxy.core.roofline import Board, ModelMeta

__all__ = ["run_report"]


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
