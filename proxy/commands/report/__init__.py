"""``timing-proxy report``: the proxy's own JSON-lines logs (or another harness's calls: JSON
lines, a JSON list, or one JSON document of calls per kind) read back into a summary.

Each file is one run. The rooms: :mod:`.load` reads the files (and :mod:`.harness` maps a
harness's names and derives what its calls lack), :mod:`.summary` builds the document
(``/stats``'s kind summaries over completed requests, the fields the logs lacked, the
tools' prefill cross-check, the roofline), with :mod:`.breakdown` (per API, per run) and
:mod:`.causes` (why prefill was paid, setup findings); :mod:`.render` writes it as text,
with :mod:`.render_tables`, :mod:`.roofline_text` and :mod:`.textfmt`; :mod:`.run` is the
command. :mod:`proxy.commands.plot` draws from the summary: :mod:`.run` imports it, and it
imports only :mod:`.summary` and :mod:`proxy.commands.errors`, so the imports run one way.
"""

from __future__ import annotations

from proxy.commands.errors import ReportError
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
