"""The machine a run measures on (versions, commit, how busy it is: all processes, from
``/proc/stat``), the exact command line, and a run's end: its JSON file and its report."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.overhead.procs import PY, RESULTS_DIR, ROOT


def machine_cpu() -> float:
    """Machine-wide busy CPU seconds so far (all processes)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / os.sysconf("SC_CLK_TCK")  # user nice sys irq sirq


def first_line(cmd: list[str], default: str | None = None) -> str | None:
    """The first line of a read-only command's output (``git``, ``node``), or ``default``."""
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return default
    return out.stdout.strip() or default


def machine_info() -> dict[str, Any]:
    """CPUs, kernel, Python, aiohttp, Node, the commit and whether ``proxy/`` differs from it."""
    import aiohttp

    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        model = next((x.split(":", 1)[1].strip() for x in fh if x.startswith("model name")), "?")
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "node": first_line(["node", "--version"]),
        "git_commit": first_line(["git", "rev-parse", "--short", "HEAD"]),
        "proxy_dir_modified": bool(first_line(["git", "status", "--porcelain", "--", "proxy"], "")),
        "load_average": os.getloadavg(),
    }


def command_line(script: str) -> str:
    """The command that started this run, relative to the checkout where it can be."""
    rel = os.path.relpath(PY, ROOT)
    return shlex.join([PY if rel.startswith("..") else rel, script, *sys.argv[1:]])


def save_run(res: dict[str, Any], text: str, name: str, out: Path | None) -> Path:
    """Write ``res`` with its report ``text`` (as ``markdown``) to ``out``, default
    ``bench/results/<name>-<UTC>.json``; print the report and where the file went."""
    out = out or RESULTS_DIR / f"{name}-{res['timestamp'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    res["markdown"] = text
    out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    shown = out.resolve()
    print(f"{text}\n\nResults: {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}")
    return out
