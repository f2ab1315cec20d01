"""The options of ``bench/peers.py``: which peers, the sizes of a full run and of ``--quick``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench.peers.launch import PATHS

DESCRIPTION = (
    "timing-proxy beside the proxies a user would pick instead, in front of the same fast "
    "fake llama-server, interleaved in one run."
)

#: Sizes left unset on the command line: (full run, --quick).
SIZE_DEFAULTS: dict[str, tuple[int, int]] = {
    "rounds": (1000, 40),
    "warmup": (20, 3),
    "long_runs": (5, 1),
    "long_tokens": (20_000, 2_000),
}


def _peer_list(value: str) -> list[str]:
    names = [x.strip() for x in value.split(",") if x.strip()]
    unknown = [x for x in names if x not in PATHS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}"
        )
    return [x for x in PATHS if x in names]  # the table's order


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options; sizes not given take the full-run or the ``--quick`` default."""
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument(
        "--peers",
        type=_peer_list,
        default=list(PATHS),
        help=f"comma-separated subset of {','.join(PATHS)} (default: all; direct always runs)",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run (small sizes, ~2 min)")
    p.add_argument(
        "--install-only", action="store_true", help="install the chosen peers, then exit"
    )
    p.add_argument("--out", type=Path, help="JSON file (default bench/results/peers-<UTC>.json)")
    p.add_argument("--seed", type=int, default=1)
    g = p.add_argument_group("sizes (defaults: full run; --quick lowers them)")
    g.add_argument("--rounds", type=int, help="latency rounds per kind (1000; quick 40)")
    g.add_argument("--warmup", type=int, help="warm-up requests per kind and path (20; 3)")
    g.add_argument("--block", type=int, default=25, help="rounds per block of one kind (25)")
    g.add_argument(
        "--stream-tokens", type=int, default=97, help="tokens of the stream (97 = 100 events)"
    )
    g.add_argument(
        "--plain-tokens", type=int, default=20, help="tokens of the JSON reply (20 = 645 bytes)"
    )
    g.add_argument("--long-tokens", type=int, help="tokens of the long stream (20000; 2000)")
    g.add_argument("--long-runs", type=int, help="long streams per path, 0: none (5; 1)")
    args = p.parse_args(argv)
    for name, (full, quick) in SIZE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args
