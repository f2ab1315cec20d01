"""``timing-proxy report``: the proxy's own JSON-lines logs (or another harness's per-call
log) read back into a summary.

Each file is one run. The rooms: :mod:`.load` reads the files (and fetches the model's
size), :mod:`.summary` builds the document (``/stats``'s kind summaries over completed
requests, per-run medians, the roofline, the fields the logs lacked), :mod:`.render` writes
it as a table, :mod:`.run` is the command. :mod:`proxy.commands.plot` draws from the
summary: :mod:`.run` imports it, and it imports only :mod:`.summary` and :mod:`.errors`,
so the imports run one way.
"""

from __future__ import annotations

from proxy.commands.report.errors import ReportError
from proxy.commands.report.load import EVENT, Run, load_runs
from proxy.commands.report.render import render_text
from proxy.commands.report.run import run_report
from proxy.commands.report.summary import (
    COMPLETED_ONLY,
    KINDS,
    PER_RUN_FIELDS,
    build_report,
    median_call,
    median_record,
)

__all__ = [
    "COMPLETED_ONLY",
    "EVENT",
    "KINDS",
    "PER_RUN_FIELDS",
    "ReportError",
    "Run",
    "build_report",
    "load_runs",
    "median_call",
    "median_record",
    "render_text",
    "run_report",
]
