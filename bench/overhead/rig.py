"""The rig a step measures: the fake upstream, the relays in front of it, the client
sessions, the shared random order, and a snapshot of everyone's CPU clocks."""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import Any

from bench.overhead.client import PATH
from bench.overhead.processes import Proc


@dataclass
class Bench:
    """The running paths (``direct`` and every relay) and the client's sessions."""

    args: argparse.Namespace
    upstream: Proc
    proxies: dict[str, Proc]  # mode -> proxy process
    session: Any
    plain_session: Any  # plain requests get their own pool: streams end with a close
    rng: random.Random

    @property
    def modes(self) -> list[str]:
        return ["direct", *self.proxies]

    def url(self, mode: str) -> str:
        base = self.upstream.url if mode == "direct" else self.proxies[mode].url
        return base + PATH

    def cpu_all(self) -> dict[str, float]:
        """CPU seconds so far of the upstream, this client and every relay."""
        out = {"upstream": self.upstream.cpu(), "client": time.process_time()}
        out.update({m: p.cpu() for m, p in self.proxies.items()})
        return out

    def shuffled_modes(self) -> list[str]:
        """Every path, in a fresh random order (one round)."""
        order = self.modes[:]
        self.rng.shuffle(order)
        return order
