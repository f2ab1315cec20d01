"""Shared runner of the fuzz harnesses: atheris (libFuzzer) when installed, else a plain loop.

A harness module defines ``test_one_input(data: bytes)`` (raises on a broken invariant) and a
``seeds()`` generator, imports the code under test inside ``with instrumented():`` and calls
``main(test_one_input, seeds)``. Command line:

* ``python fuzz/fuzz_sse.py [libFuzzer flags] [CORPUS_DIR ...]``: coverage-guided with atheris,
  e.g. ``-max_total_time=120 -print_final_stats=1``; an empty corpus directory is first filled
  with the seeds (recordings of a real llama-server and hand-made edge cases).
* ``python fuzz/fuzz_sse.py --plain=SECONDS [-runs=N] [-seed=S]``: no atheris needed; random
  mutations of the seeds, no coverage feedback. The final lines have the same shape as
  libFuzzer's (``stat::number_of_executed_units: N``), so callers parse either.

Nothing here imports :mod:`proxy`: it must be imported under ``instrumented()`` to be traced.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["REPO", "atheris_available", "instrumented", "main"]

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make ``proxy``, ``fuzz``, ``tests`` importable
    sys.path.insert(0, str(REPO))

atheris: Any
try:
    atheris = importlib.import_module("atheris")
except ImportError:  # pragma: no cover - depends on the environment
    atheris = None

#: Byte strings that the plain loop splices in (libFuzzer gets ``fuzz/llama.dict``).
TOKENS: tuple[bytes, ...] = (
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"\r\r",
    b"data:",
    b"data: ",
    b"event: ",
    b"id: ",
    b"retry: ",
    b":",
    b"\xef\xbb\xbf",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"[DONE]",
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e308",
    b"18446744073709551615",
    b'"choices":',
    b'"delta":',
    b'"message":',
    b'"tool_calls":',
    b'"index":',
    b'"function":',
    b'"name":',
    b'"arguments":',
    b'"timings":',
    b'"usage":',
    b'"prompt_n":',
    b'"cache_n":',
    b'"predicted_n":',
    b'"prompt_ms":',
    b'"error":',
    b'"finish_reason":',
    b'"content":"x"',
    b'"model":',
    b'"tools":',
    b'"stream":true',
    b"[" * 300,
)


def _plain_mode(argv: list[str]) -> float | None:
    """Seconds of plain fuzzing asked for (``--plain=S``, or any run without atheris)."""
    for arg in argv[1:]:
        if arg.startswith("--plain="):
            return float(arg.split("=", 1)[1])
    if atheris is None:
        return float(_flag(argv, "max_total_time") or 10.0)
    return None


def _flag(argv: list[str], name: str) -> str | None:
    for arg in argv[1:]:
        if arg.startswith(f"-{name}="):
            return arg.split("=", 1)[1]
    return None


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """Trace the :mod:`proxy` modules imported inside the block (a no-op in plain mode)."""
    if atheris is None or _plain_mode(sys.argv) is not None:
        yield
        return
    with atheris.instrument_imports(include=["proxy"]):
        yield


def atheris_available() -> bool:
    """True when atheris can be imported here."""
    return atheris is not None


def _seed_corpus(argv: list[str], seeds: Callable[[], Iterable[bytes]]) -> None:
    """Fill every empty corpus directory named on the command line with the seeds."""
    for arg in argv[1:]:
        if arg.startswith("-"):
            continue
        folder = Path(arg)
        if folder.is_dir() and not any(folder.iterdir()):
            for seed in seeds():
                name = hashlib.sha1(seed).hexdigest()  # a file name, not security
                (folder / name).write_bytes(seed)


def _mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(7)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:  # flip a bit
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert a token
            buf[pos:pos] = rng.choice(TOKENS)
        elif op == 2 and buf:  # delete a run
            del buf[pos : pos + rng.randint(1, 64)]
        elif op == 3:  # insert random bytes
            buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 4 and buf:  # truncate
            del buf[pos:]
        elif op == 5:  # splice another input
            other = rng.choice(corpus)
            a = rng.randint(0, len(other))
            buf[pos:pos] = other[a : a + rng.randint(0, 512)]
        elif op == 6 and buf:  # repeat a slice
            a = rng.randrange(len(buf))
            piece = bytes(buf[a : a + rng.randint(1, 32)])
            buf[pos:pos] = piece * rng.randint(2, 200)
    return bytes(buf[: 1 << 16])


def _plain(
    test_one_input: Callable[[bytes], None],
    seeds: Callable[[], Iterable[bytes]],
    seconds: float,
    runs: int | None,
    seed: int,
) -> None:
    rng = random.Random(seed)
    corpus = [*seeds()] or [b""]
    start = time.monotonic()
    n = 0
    print(
        f"INFO: plain mode (no coverage feedback), seed {seed}, {len(corpus)} seeds",
        file=sys.stderr,
    )
    inputs: Iterator[bytes] = iter(corpus)
    while time.monotonic() - start < seconds and (runs is None or n < runs):
        data = next(inputs, None)
        if data is None:
            data = _mutate(rng, rng.choice(corpus), corpus)
            if rng.random() < 0.05 and len(corpus) < 2000:
                corpus.append(data)
        n += 1
        try:
            test_one_input(data)
        except Exception:
            traceback.print_exc()
            crash = Path(f"crash-{hashlib.sha1(data).hexdigest()}")
            crash.write_bytes(data)
            print(
                f"==ERROR: plain fuzzer: uncaught exception; input written to {crash}",
                file=sys.stderr,
            )
            sys.exit(1)
    elapsed = time.monotonic() - start
    print(f"#{n}\tDONE   plain execs: {n} in {elapsed:.1f} s", file=sys.stderr)
    print(f"stat::number_of_executed_units: {n}", file=sys.stderr)
    print(f"Done {n} runs in {int(elapsed)} second(s)", file=sys.stderr)


def _announce_known_bugs(test_one_input: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """Wrap the target: say once per known bug when an input hits it (and is let through)."""
    announced: set[str] = set()

    def run(data: bytes) -> None:
        test_one_input(data)
        checks = sys.modules.get("fuzz.checks")
        if checks is not None and len(checks.TOLERATED) > len(announced):
            for bug in set(checks.TOLERATED) - announced:
                announced.add(bug)
                print(
                    f"INFO: known bug hit (tolerated): {bug}; TIMING_PROXY_FUZZ_STRICT=1 "
                    "stops on it",
                    file=sys.stderr,
                    flush=True,
                )

    return run


def main(test_one_input: Callable[[bytes], None], seeds: Callable[[], Iterable[bytes]]) -> None:
    """Run the harness per the command line (see the module docstring)."""
    argv = list(sys.argv)
    test_one_input = _announce_known_bugs(test_one_input)
    plain = _plain_mode(argv)
    if plain is not None:
        runs = _flag(argv, "runs") or _flag(argv, "atheris_runs")
        seed = _flag(argv, "seed")
        _plain(
            test_one_input,
            seeds,
            plain,
            int(runs) if runs else None,
            int(seed) if seed else int.from_bytes(os.urandom(4), "little"),
        )
        return
    assert atheris is not None
    _seed_corpus(argv, seeds)
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()
