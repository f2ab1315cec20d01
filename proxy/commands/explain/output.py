"""What ``explain`` shows and keeps: the progress bar, the header and the machine's load, the
table, and the ``--json`` file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO

from proxy.commands.explain.client import Json
from proxy.commands.explain.variants import Plan
from proxy.core.experiment import Term, render_table

__all__ = ["Progress", "header", "load_average", "table", "write_document"]


class Progress:
    """A bar with what is left, estimated from the requests done so far."""

    def __init__(self, out: IO[str] | None, total: int) -> None:
        self.out, self.total, self.done = out, total, 0
        self.started = time.monotonic()

    def step(self, label: str) -> None:
        self.done += 1
        if self.out is None:
            return
        width = 30
        filled = width * self.done // self.total
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.total - self.done)
        self.out.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{label:<34} ~{_duration(left)} left "
        )
        if self.done == self.total:
            self.out.write("\n")
        self.out.flush()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages (None where there are none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - no load average on this platform
        return None


def header(upstream: str, runs: int, plan: Plan, load: list[float] | None) -> str:
    """What is measured, and the machine's load at the start."""
    where = f"explain: {upstream}, {runs} run(s) of {len(plan.tool)} tool prompt(s)"
    if plan.image:
        where += f" and {len(plan.image)} image prompt(s)"
    return f"{where}\n{_load_line(load, 'at start')}\n"


def table(rows: list[Term], load: list[float] | None) -> str:
    """The terms' table, and the machine's load at the end."""
    return render_table(rows) + _load_line(load, "at the end")


def _load_line(load: list[float] | None, when: str) -> str:
    cpus = os.cpu_count()
    if load is None:
        return f"machine: {cpus} CPUs, load average unknown"
    return f"machine: {cpus} CPUs, load average {load[0]} / {load[1]} / {load[2]} {when}"


def write_document(path: str, doc: Json) -> None:
    """The document as indented JSON at ``path``."""
    Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
