#!/usr/bin/env python3
"""timing-proxy's cost on the relay path, in one interleaved run against a fast fake
llama-server on loopback: direct, a bare aiohttp relay (the reference), timing-proxy (and
with ``--baseline DIR`` the timing-proxy of the checkout DIR), then the analysis cost per
event. Options, report and method: bench/README.md and docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``bench``, ``tests``, ``proxy``

from bench.overhead.run import arg_parser, parse_sizes

#: Sizes left unset on the command line: (full run, --quick).
SIZES: dict[str, tuple[int, int]] = {
    "rounds": (3000, 200),
    "warmup": (50, 5),
    "long_runs": (7, 1),
    "long_tokens": (20_000, 2_000),
    "tracker_reps": (7, 1),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = arg_parser(
        "timing-proxy's added latency over direct and over a bare aiohttp relay, the long "
        "stream's rate, the analysis cost per event.",
        "relay_overhead",
        SIZES,
    )
    p.add_argument("--role", choices=["upstream", "bare-relay"], help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)  # for the bare-relay role
    p.add_argument("--baseline", type=Path, metavar="DIR", help="also the checkout DIR's proxy")
    return parse_sizes(p, argv, SIZES)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a role, or run: the JSON file, then the report on stdout."""
    args = parse_args(argv)
    if args.role:  # a server of the run, in a process of its own
        from bench.overhead import servers

        if args.role == "upstream":
            servers.run_upstream()
        else:
            servers.run_bare_relay(args.upstream)
        return 0
    from bench.overhead.machine import save_run
    from bench.overhead.procs import ROOT
    from bench.overhead.report import BASELINE, PROXY, report
    from bench.overhead.run import RELAYS, baseline_path, run_paths
    from bench.overhead.tracker_cost import tracker_cpu

    base = {BASELINE: args.baseline} if args.baseline else {}
    paths = RELAYS | {name: baseline_path(tree) for name, tree in base.items()}
    res = asyncio.run(run_paths(args, paths, "bench/relay_overhead.py"))
    if args.tracker_reps > 0:
        print("[bench] in-process analysis", file=sys.stderr, flush=True)
        costs = tracker_cpu(args.long_tokens, args.tracker_reps, {PROXY: ROOT} | base)
        res["tracker"], res["tracker_baseline"] = costs[PROXY], costs.get(BASELINE)
    save_run(res, report(res), "relay_overhead", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
