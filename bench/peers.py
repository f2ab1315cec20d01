#!/usr/bin/env python3
"""timing-proxy beside its peers: direct, the bare aiohttp relay, timing-proxy, LiteLLM's
proxy, the Portkey gateway, kvprof's tap and mitmproxy in reverse mode, in front of the same
fast fake llama-server, interleaved in one run.

    .venv/bin/python bench/peers.py [--quick] [--peers timing-proxy,kvprof,...]
                                    [--out FILE]

Each peer is installed on first use into its own virtualenv or ``node_modules`` under
``$TIMING_PROXY_CACHE/peers`` (default ``~/.cache/timing-proxy/peers``); one that cannot be
installed or started is skipped and its row says why. The peers' installs and launchers are
``bench/peers/install.py``; the run is ``bench/overhead``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``bench``, ``tests``, ``proxy``

from bench.overhead.machine import save_run
from bench.overhead.run import RELAYS, arg_parser, parse_sizes, run_paths
from bench.peers.install import PEERS
from bench.peers.report import report

PATHS = RELAYS | PEERS
"""Every path but ``direct``, in the order the table shows them."""
#: Sizes left unset on the command line: (full run, --quick).
SIZES: dict[str, tuple[int, int]] = {
    "rounds": (1000, 40),
    "warmup": (20, 3),
    "long_runs": (5, 1),
    "long_tokens": (20_000, 2_000),
}


def _peer_list(value: str) -> list[str]:
    names = [x.strip() for x in value.split(",") if x.strip()]
    if unknown := [x for x in names if x not in PATHS]:
        raise argparse.ArgumentTypeError(
            f"unknown: {', '.join(unknown)}; one of {', '.join(PATHS)}"
        )
    return [x for x in PATHS if x in names]  # the table's order


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = arg_parser(
        "timing-proxy beside the proxies a user would pick instead, in front of the same fast "
        "fake llama-server, interleaved in one run.",
        "peers",
        SIZES,
    )
    p.add_argument(
        "--peers",
        type=_peer_list,
        default=list(PATHS),
        help=f"a subset of {','.join(PATHS)} (default: all; direct always runs)",
    )
    return parse_sizes(p, argv, SIZES)


def main(argv: Sequence[str] | None = None) -> int:
    """Run, write the JSON file and print the report."""
    args = parse_args(argv)
    res = asyncio.run(run_paths(args, {n: PATHS[n] for n in args.peers}, "bench/peers.py"))
    save_run(res, report(res), "peers", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
