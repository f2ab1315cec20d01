"""A peer may run as several processes (a launcher and its server, worker threads are in the
process already): its CPU time and memory are those of the whole tree under the pid started."""

from __future__ import annotations

import contextlib
from pathlib import Path

from bench.overhead.processes import cpu_seconds


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its live descendants (from ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user+system, all threads) of ``pid`` and its live descendants: each
    process's CPU clock (ns; ``/proc/<pid>/stat`` ticks where the clock is not readable)."""
    total = 0.0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


def tree_rss_mib(pid: int) -> float:
    """Resident memory (``VmRSS``) of ``pid`` and its live descendants, MiB."""
    kib = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    kib += int(line.split()[1])
                    break
    return kib / 1024
