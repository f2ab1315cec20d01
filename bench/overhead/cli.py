"""The benchmark's command-line options: which paths and steps, the sizes of a full run and
the smaller ones of ``--quick``, and the hidden ``--role`` its own processes start with."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench.overhead.constants import BARE, LEAN, SPLICE, STEPS

DESCRIPTION = "Relay overhead of timing-proxy: direct vs proxied requests, interleaved, in one run."

#: Sizes left unset on the command line: (full run, --quick).
SIZE_DEFAULTS: dict[str, tuple[object, object]] = {
    "rounds": (2000, 300),
    "warmup": (100, 30),
    "paced_rounds": (8, 2),
    "robot_concurrency": ([50, 200], [50]),
    "robot_seconds": (6.0, 4.0),
    "tracker_reps": (7, 3),
}


def _paths_and_modes(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--role",
        choices=["bench", "upstream", BARE, LEAN, SPLICE],
        default="bench",
        help=argparse.SUPPRESS,
    )
    p.add_argument("--upstream", help=argparse.SUPPRESS)  # for the relay roles
    p.add_argument("--no-bare", action="store_true", help="skip the reference bare aiohttp relay")
    p.add_argument(
        "--no-lean",
        action="store_true",
        help="skip the reference lean relay (aiohttp server, httptools client; "
        "skipped anyway when httptools is not installed)",
    )
    p.add_argument("--no-splice", action="store_true", help="skip the reference TCP splice")
    p.add_argument(
        "--keep-streams-alive",
        action="store_true",
        help="the fake upstream keeps the connection after an event stream (real "
        "llama-server closes it; by default the fake does too)",
    )
    p.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run, ~40 s)")
    p.add_argument(
        "--out",
        type=Path,
        help="JSON results file (default: bench/results/relay_overhead-<UTC time>.json)",
    )
    p.add_argument(
        "--uvloop", action="store_true", help="also run a second proxy on uvloop (if importable)"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile the asyncio proxy with py-spy (long stream, "
        "robot load, back-to-back requests); writes "
        "bench/results/profile-*.{raw.txt,svg}",
    )
    p.add_argument(
        "--log-file",
        action="store_true",
        help="also make the proxy append its JSON log lines to a temp file",
    )
    p.add_argument(
        "--no-attribution",
        action="store_true",
        help="a diagnostic: the proxy with [accounting] attribution = false (the fake "
        "upstream answers /apply-template with 404, which the proxy retries per request)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--steps",
        type=lambda v: v.split(","),
        default=list(STEPS),
        help=f"comma-separated subset of {','.join(STEPS)} (default: all)",
    )


def _sizes(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sizes (defaults: full run; --quick lowers them)")
    g.add_argument("--rounds", type=int, help="latency rounds per kind (2000; quick 300)")
    g.add_argument("--warmup", type=int, help="warm-up requests per kind and path (100; 30)")
    g.add_argument(
        "--stream-tokens",
        type=int,
        default=20,
        help="tokens of the latency stream and plain body (20; 97 makes the 100-event "
        "stream of issue 15)",
    )
    g.add_argument(
        "--plain-tokens",
        type=int,
        help="tokens of the plain body, when not those of the stream (20 is the 645-byte "
        "JSON reply of bench/peers.py)",
    )
    g.add_argument("--paced-rounds", type=int, help="paced streams per path (8; 2)")
    g.add_argument("--paced-tokens", type=int, default=200, help="events per paced stream")
    g.add_argument("--paced-interval-ms", type=float, default=5.0)
    g.add_argument("--long-tokens", type=int, default=20_000)
    g.add_argument(
        "--long-runs", type=int, default=7, help="runs per path; the headline is the median (7)"
    )
    g.add_argument(
        "--robot-concurrency",
        type=lambda v: [int(x) for x in v.split(",")],
        help="concurrent 30 tok/s streams, comma-separated levels (50,200; 50)",
    )
    g.add_argument("--robot-seconds", type=float, help="robot load per path and level (6; 4)")
    g.add_argument("--robot-tokens", type=int, default=60, help="tokens per robot request")
    g.add_argument("--tracker-reps", type=int, help="in-process tracker repetitions (7; 3)")
    g.add_argument("--profile-seconds", type=int, default=10)
    g.add_argument("--profile-rate", type=int, default=200)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options; sizes not given take the full-run or the ``--quick`` default."""
    p = argparse.ArgumentParser(
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _paths_and_modes(p)
    _sizes(p)
    args = p.parse_args(argv)
    for name, (full, quick) in SIZE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args
