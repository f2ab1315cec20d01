"""Lines that show in the test run's output through pytest's capture (CI reads them)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

__all__ = ["terminal_log"]


def terminal_log(config: pytest.Config, prefix: str) -> Callable[[str], None]:
    """A logger writing ``[prefix] message`` lines to the terminal, past output capture."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if capman is None or reporter is None:  # e.g. xdist workers
        return lambda msg: print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)

    def log(msg: str) -> None:
        with capman.global_and_fixture_disabled():
            reporter.write_line(f"[{prefix}] {msg}")

    return log
