"""The machine a run measures on: versions, the code's commit, the exact command line, and
how busy the whole machine is (all processes, from /proc/stat)."""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

from bench.overhead.constants import ENTRY, PY, ROOT


def machine_cpu() -> dict[str, float]:
    """Machine-wide busy and steal CPU seconds so far (all processes, from /proc/stat)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal
    return {"busy": (f[0] + f[1] + f[2] + f[5] + f[6]) / tick, "steal": f[7] / tick}


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def _uvloop_version() -> str | None:
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return str(getattr(uvloop, "__version__", "?"))


def _git(*args: str) -> str | None:  # read-only git queries
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict[str, Any]:
    """CPUs, kernel, Python and library versions, the commit and whether proxy/ differs."""
    import aiohttp
    import orjson

    status = _git("status", "--porcelain", "--", "proxy")
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "orjson": orjson.__version__,
        "uvloop": _uvloop_version(),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "proxy_dir_modified": bool(status) if status is not None else None,
    }


def command_line() -> str:
    """The command that started this run, relative to the checkout where it can be."""
    try:
        py = os.path.relpath(PY, ROOT) if not os.path.relpath(PY, ROOT).startswith("..") else PY
    except ValueError:
        py = PY
    script = os.path.relpath(ENTRY, ROOT)
    return shlex.join([py, script, *sys.argv[1:]])
