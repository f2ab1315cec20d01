"""A stand-in for NVIDIA's ``tegrastats``: prints real-format Orin Nano lines (JetPack 6: the
date-time stamp first, ``VDD_IN``/``VDD_CPU_GPU_CV``/``VDD_SOC`` in mW) every ``--interval``
milliseconds, flushing each, at a known constant ``VDD_IN`` power.

The line is a real one (an Orin Nano's, idle) with the ``VDD_IN`` current value replaced by
``--power-mw`` and the RAM used replaced by the line's sequence number, so a test can tell how
many lines were printed. ``--lines N`` exits with ``--exit-code`` after N lines (a dying
sampler); ``--once-marker PATH`` exits at once with status 1 when PATH does not exist yet, and
creates it (a sampler that fails on its first start only). ``--on-signal PID_FILE`` writes its
pid there and prints one line at once, then one more on each ``SIGUSR1`` instead of every
interval: a test decides when each sample arrives, whatever the machine's load.

Run: ``python tests/fake_tegrastats.py --interval 100 --power-mw 5000``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

LINE = (
    "{stamp} RAM {ram}/7620MB (lfb 9x4MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [1%@729,4%@729,8%@729,4%@729,5%@729,4%@729] GR3D_FREQ 37% "
    "cpu@44.156C soc2@43.781C soc0@44.687C gpu@45.968C tj@45.968C soc1@45.312C "
    "VDD_IN {power}mW/5263mW VDD_CPU_GPU_CV 717mW/717mW VDD_SOC 1794mW/1794mW"
)


def fake_tegrastats(folder: Path, *args: str, name: str = "tegrastats") -> Path:
    """An executable ``name`` in ``folder`` running this fake with ``args`` (the path a
    sampler or ``[board] tegrastats_path`` is given)."""
    path = folder / name
    extra = " ".join(args)
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{__file__}" {extra} "$@"\n')
    path.chmod(0o755)
    return path


class Stepped:
    """This fake with ``--on-signal``: one line at start, then one each time :meth:`step` is
    called, whatever the interval the sampler asks. A test decides when each sample arrives,
    so a loaded machine cannot make one late."""

    def __init__(self, folder: Path, *args: str) -> None:
        self._pid_file = folder / "tegrastats.pid"
        self.path = fake_tegrastats(folder, f"--on-signal {self._pid_file}", *args)

    def step(self) -> None:
        """Print the next line (after the sampler has read the last one: signals of the same
        kind sent before the fake takes the first count once)."""
        os.kill(int(self._pid_file.read_text()), signal.SIGUSR1)


STEPPED_INTERVAL_MS = 10_000
"""The interval a stepped fake's sampler is given: it waits two of them (20 s) for the sample
that closes a request, and no line comes unless the test steps the fake."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--interval", type=int, default=1000, help="milliseconds")
    parser.add_argument("--power-mw", type=int, default=5000)
    parser.add_argument("--lines", type=int, default=0, help="exit after N lines (0: never)")
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--once-marker", type=Path, default=None)
    parser.add_argument("--on-signal", type=Path, default=None, metavar="PID_FILE")
    args = parser.parse_args(argv)
    if args.once_marker is not None and not args.once_marker.exists():
        args.once_marker.touch()
        print("fake tegrastats: failing on the first start", flush=True)
        return 1
    if args.on_signal is not None:
        return on_signal(args.on_signal, args.power_mw)
    start = time.monotonic()
    n = 0
    while not args.lines or n < args.lines:
        n += 1
        print_line(n, args.power_mw)
        time.sleep(max(0.0, start + n * args.interval / 1000.0 - time.monotonic()))
    return int(args.exit_code)


def print_line(n: int, power_mw: int) -> None:
    """The ``n``-th line, flushed."""
    stamp = time.strftime("%m-%d-%Y %H:%M:%S")
    print(LINE.format(stamp=stamp, ram=n, power=power_mw), flush=True)


def on_signal(pid_file: Path, power_mw: int) -> int:
    """One line now, then one per ``SIGUSR1``, until killed."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # taken by sigwait, in order
    pid_file.write_text(str(os.getpid()))
    n = 1
    print_line(n, power_mw)
    while True:
        signal.sigwait({signal.SIGUSR1})
        n += 1
        print_line(n, power_mw)


if __name__ == "__main__":
    sys.exit(main())
