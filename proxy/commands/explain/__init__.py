"""``timing-proxy explain``: an experiment against a running llama-server that measures what
each cause behind a tool call's time costs on this board, and so what each fix would save.

The rooms: :mod:`.variants` says what is sent for each prompt and keeps every measurement,
over :mod:`.client` (JSON over HTTP, a streamed tool call); :mod:`.terms` turns the
measurements into the table's terms (the arithmetic is :mod:`proxy.core.experiment`);
:mod:`.output` shows them (progress, header, table) and writes the ``--json`` file;
:mod:`.run` is the command.
"""

from __future__ import annotations

from proxy.commands.explain.client import ExplainError, Streamed
from proxy.commands.explain.run import ExplainOptions, run_explain
from proxy.commands.explain.variants import DEFAULT_MAX_TOKENS, request_body

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ExplainError",
    "ExplainOptions",
    "Streamed",
    "request_body",
    "run_explain",
]
