"""The paths of a run, each with its client sessions (the path's headers on every request),
and the shared random order of a round."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from bench.overhead.client import PATH
from bench.overhead.processes import Proc
from bench.peers.proctree import tree_cpu_seconds, tree_rss_mib

KINDS = ("stream", "plain")


@dataclass
class Target:
    """One path: ``direct`` (no process) or a relay process; a session per kind (streams end
    with the upstream closing the connection, so plain requests keep a pool of their own)."""

    name: str
    base_url: str
    proc: Proc | None
    sessions: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url + PATH

    def cpu(self) -> float:
        return tree_cpu_seconds(self.proc.pid) if self.proc else 0.0

    def rss_mib(self) -> float | None:
        return tree_rss_mib(self.proc.pid) if self.proc else None


@dataclass
class Rig:
    """The live paths (``direct`` first), the failures so far, and the random order."""

    targets: dict[str, Target]
    rng: random.Random
    failed: dict[str, str] = field(default_factory=dict)
    """Path -> why it left the run (it failed a request; its figures are dropped)."""

    def shuffled(self) -> list[Target]:
        order = list(self.targets.values())
        self.rng.shuffle(order)
        return order

    def drop(self, name: str, why: str) -> None:
        """Take ``name`` out of the run (never ``direct``: every figure is relative to it)."""
        if name == "direct":
            raise RuntimeError(f"direct path failed: {why}")
        self.targets.pop(name, None)
        self.failed[name] = why

    def cpu_all(self) -> dict[str, float]:
        return {n: t.cpu() for n, t in self.targets.items()}
