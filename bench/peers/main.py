"""The entry point behind ``bench/peers.py``: install the peers only, or a whole run written
to ``bench/results/peers-<UTC>.json`` and printed as Markdown."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from collections.abc import Sequence

from bench.overhead.constants import PY, ROOT
from bench.overhead.results import save_run
from bench.peers.cli import parse_args
from bench.peers.install import PeerUnavailable
from bench.peers.launch import install
from bench.peers.report import report


def command_line(argv: Sequence[str]) -> str:
    """The command that started this run, relative to the checkout where it can be."""
    rel = os.path.relpath(PY, ROOT)
    py = PY if rel.startswith("..") else rel
    return shlex.join([py, "bench/peers.py", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    """Install only (``--install-only``), or run, write the JSON file and print the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.install_only:
        bad = 0
        for name in args.peers:
            try:
                install(name)
                print(f"{name}: installed")
            except PeerUnavailable as exc:
                bad += 1
                print(f"{name}: cannot be installed: {exc}")
        return 1 if bad else 0
    from bench.peers.run import run_peers

    res = asyncio.run(run_peers(args, command_line(argv)))
    save_run(res, report(res), "peers", args.out)
    return 0
