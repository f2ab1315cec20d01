"""``timing-proxy explain`` end to end: probe the server, send the variants, print the table."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from proxy.commands.bench import PromptSet
from proxy.commands.explain.client import ExplainError, Http, Json
from proxy.commands.explain.output import (
    Progress,
    header,
    load_average,
    table,
    write_document,
)
from proxy.commands.explain.terms import terms
from proxy.commands.explain.variants import (
    Measure,
    count_schema_tokens,
    image_variants,
    plan,
    probe,
    request_body,
    tool_variants,
)
from proxy.core.timestamps import iso_utc

__all__ = ["ExplainOptions", "run_explain"]

NO_TOOL_SUPPORT = (
    "the served chat template has no tool support (/props chat_template_caps."
    "supports_tools false): tools never reach the model; start llama-server with a "
    "tool-capable template (--jinja with the model's own, or --chat-template-file)"
)


@dataclass(frozen=True, slots=True)
class ExplainOptions:
    """What ``timing-proxy explain`` was asked to do."""

    upstream: str
    prompts: PromptSet
    runs: int = 3
    model: str = "default"
    json_path: str | None = None
    timeout_s: float = 900.0


def run_explain(
    opts: ExplainOptions,
    *,
    progress: IO[str] | None = sys.stderr,
    say: Callable[[str], None] = print,
) -> Json:
    """Run the experiment; prints the table and returns the document (also ``--json``)."""
    if opts.runs < 1:
        raise ExplainError("--runs must be at least 1")
    started = iso_utc()
    http = Http(opts.upstream, opts.timeout_s)
    bodies = {p.name: request_body(opts.prompts, p, opts.model) for p in opts.prompts.prompts}
    first_tool = next((bodies[p.name] for p in opts.prompts.prompts if p.tools), None)
    server = probe(http, first_tool)
    chosen = plan(opts.prompts, opts.model, server)
    if not chosen.tool and not chosen.image:
        raise ExplainError("the prompt set has no tool prompt (and no image prompt to measure)")
    if chosen.tool and not server.supports_tools:
        raise ExplainError(NO_TOOL_SUPPORT)
    tool_bodies = {p.name: bodies[p.name] for p in chosen.tool}
    schema_tokens = count_schema_tokens(http, tool_bodies)
    load_start = load_average()
    say(header(opts.upstream, opts.runs, chosen, load_start))
    m = Measure(http, Progress(progress, chosen.variants_per_run() * opts.runs).step)
    for run in range(1, opts.runs + 1):
        for prompt in chosen.tool:
            tool_variants(m, run, prompt, tool_bodies[prompt.name], server)
        for prompt in chosen.image:
            image_variants(m, run, prompt, bodies[prompt.name])
    rows = terms(m.measurements, schema_tokens, server)
    load_end = load_average()
    say(table(rows, load_end))
    doc: Json = {
        "started": started,
        "upstream": opts.upstream,
        "model": opts.model,
        "runs": opts.runs,
        "load": {"cpus": os.cpu_count(), "start": load_start, "end": load_end},
        "server": server.to_dict(),
        "schema_tokens": schema_tokens,
        "terms": [row.to_dict() for row in rows],
        "measurements": m.measurements,
    }
    if opts.json_path:
        write_document(opts.json_path, doc)
    return doc
