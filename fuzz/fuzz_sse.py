#!/usr/bin/env python3
"""Coverage-guided fuzzing of the SSE framer (``proxy.core.sse.SSEFramer``).

Input layout (``fuzz.checks.decode_sse_input``): a cap selector byte (>= 128: a cap of 1..128
bytes, else the default 8 MiB), a count of cut points, two bytes per cut, then the stream.
Invariants (``fuzz.checks.check_framer``): no exception; the same events and counters whole
and cut at the chosen points; ``buffered`` never above the cap; below the cap, the events of
the spec-literal oracle. See fuzz/README.md for how to run it.
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
    """One fuzzer input: decode it and check the framer's invariants."""
    stream, cuts, cap = checks.decode_sse_input(data)
    checks.check_framer(stream, cuts, cap)


def seeds() -> Iterator[bytes]:
    """Real llama-server SSE bodies and hand-made edge cases, with a few header variants."""
    from tests.fakes import all_recordings, load_recording

    bodies = [load_recording(n).body for n in all_recordings()]
    bodies += [
        b"\xef\xbb\xbfdata: a\r\n\r\ndata: b\r\rid: 1\nretry: 12\n\n",
        b": ping\n\nevent: e\ndata: x\ndata: y\n\n",
        b"data: " + b"z" * 300 + b"\n\ndata: ok\n\n",
        b"retry: " + b"9" * 5000 + b"\n\n",
    ]
    for body in bodies:
        yield bytes([0, 3, 1, 0, 7, 0, 200, 0]) + body
        yield bytes([0x80 | 63, 2, 5, 0, 90, 0]) + body


if __name__ == "__main__":
    main(test_one_input, seeds)
