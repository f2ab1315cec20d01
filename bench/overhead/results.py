"""A benchmark run's end: its JSON file under ``bench/results/`` (the Markdown report kept in
it as ``markdown``), and the report on stdout with where the file went."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.overhead.constants import RESULTS_DIR, ROOT


def save_run(res: dict[str, Any], text: str, name: str, out: Path | None) -> Path:
    """Write ``res`` with the report ``text`` to ``out`` (default
    ``bench/results/<name>-<UTC>.json``), print the report and the file's path."""
    out = out or RESULTS_DIR / f"{name}-{res['timestamp'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    res["markdown"] = text
    out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(text)
    shown = out.resolve()
    print(f"\nResults: {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}")
    return out
