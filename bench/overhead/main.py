"""The entry point behind ``bench/relay_overhead.py``: a server role (the fake upstream or
a reference relay, started by the run itself), or a whole run, written to JSON and printed
as Markdown."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from bench.overhead.cli import parse_args
from bench.overhead.constants import BARE, LEAN, SPLICE
from bench.overhead.results import save_run


def run_role(args: argparse.Namespace) -> None:
    """Serve the role ``args.role`` until SIGTERM (each imported only in its own process)."""
    if args.role == "upstream":
        from bench.overhead.upstream import run_upstream

        run_upstream(args.keep_streams_alive)
    elif args.role == BARE:
        from bench.overhead.bare_relay import run_bare_relay

        run_bare_relay(args.upstream, 0)
    elif args.role == LEAN:
        from bench.overhead.lean_relay import run_lean_relay

        run_lean_relay(args.upstream, 0)
    elif args.role == SPLICE:
        from bench.overhead.tcp_splice import run_tcp_splice

        run_tcp_splice(args.upstream, 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a role, or the benchmark: the JSON file, then the report on stdout."""
    args = parse_args(argv)
    if args.role != "bench":
        run_role(args)
        return 0
    from bench.overhead.report import report
    from bench.overhead.run import run_bench

    res = asyncio.run(run_bench(args))
    save_run(res, report(res), "relay_overhead", args.out)
    return 0
