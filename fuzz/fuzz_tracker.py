#!/usr/bin/env python3
"""Coverage-guided fuzzing of the timing tracker (``proxy.core.tracker.StreamTracker``).

Input layout (``fuzz.checks.decode_tracker_input``): a flags byte (bit 0: SSE, else a JSON
body; bit 1: a small event cap), a byte for the count of cut points and the dialect, two
bytes per cut, then the body.
Invariants (``fuzz.checks.check_tracker``): ``feed``/``finish`` never raise and the analysis
never fails inside; ``bytes_seen`` and ``response_bytes`` are the input length; on a constant
clock the observation is the same whole and cut; every field has its declared type; the
record built from it logs, reads back, counts in /stats and feeds the metrics.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.harness import instrumented, main

with instrumented():
    from fuzz import checks


def test_one_input(data: bytes) -> None:
    """One fuzzer input: decode it and check the tracker's invariants."""
    stream, cuts, sse, cap, dialect = checks.decode_tracker_input(data)
    checks.check_tracker(stream, cuts, sse, max_event_bytes=cap, dialect=dialect)


def seeds() -> Iterator[bytes]:
    """Every recorded llama-server response body, as SSE or JSON per its Content-Type, read
    through the dialect of its request's path."""
    from proxy.core.dialects import DIALECTS, dialect_for
    from tests.fakes import all_recordings, load_recording

    for name in all_recordings():
        rec = load_recording(name)
        sse = (rec.header("Content-Type") or "").startswith("text/event-stream")
        at = 9 * DIALECTS.index(dialect_for(rec.request_path))
        yield bytes([int(sse), 2 + at, 9, 0, 120, 0]) + rec.body
        yield bytes([int(sse) | 2 | 8, 1 + at, 33, 0]) + rec.body


if __name__ == "__main__":
    main(test_one_input, seeds)
