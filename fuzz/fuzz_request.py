#!/usr/bin/env python3
"""Coverage-guided fuzzing of the request analysis (``proxy.core.request.analyse_request``).

Input layout (``fuzz.checks.decode_request_input``): a method byte, a path byte, then the
body. Invariants (``fuzz.checks.check_request``): no exception; every field of the facts has
its declared type; a tool request can be keyed and hashed by the accounting; the record of
the request serialises.
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
    """One fuzzer input: decode it and check the request analysis."""
    method, path, body = checks.decode_request_input(data)
    checks.check_request(method, path, body)


def seeds() -> Iterator[bytes]:
    """The request bodies of every recording, sent as POSTs to the chat path."""
    from tests.fakes import all_recordings, load_recording

    for name in all_recordings():
        body = load_recording(name).request_body
        if body:
            yield bytes([0, 0]) + body
    yield bytes([0, 0]) + b'{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}'


if __name__ == "__main__":
    main(test_one_input, seeds)
