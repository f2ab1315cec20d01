"""Names and targets the relay-overhead benchmark shares: the checkout, the loopback host,
the issue's targets, the step names and the names of the reference paths."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "bench" / "relay_overhead.py"  # the script users run; the roles re-run it
RESULTS_DIR = ROOT / "bench" / "results"
HOST = "127.0.0.1"  # never anything else
PY = sys.executable

# Targets from the issue.
TARGET_ADDED_P50_MS = 0.3
TARGET_ADDED_P99_MS = 1.0
TARGET_THROUGHPUT_RATIO = 0.9
TARGET_STREAMS_PER_CORE = 200  # "hundreds" of concurrent 30 tok/s streams: at least 200
ROBOT_RATE = 30.0  # tokens (events) per second of one robot stream
STEPS = ("latency", "event_delay", "throughput", "robots", "tracker")
BARE = "bare-relay"  # reference: a minimal aiohttp relay, no analysis (not timing-proxy)
SPLICE = "tcp-splice"  # reference: bytes copied between two sockets, no HTTP at all
LEAN = "lean-relay"  # reference: aiohttp server + an httptools upstream client, no analysis
REFERENCES = frozenset({BARE, SPLICE, LEAN})
