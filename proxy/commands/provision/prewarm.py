"""``python -m proxy.commands.provision``: ensure every artefact and print where it is.

CI runs it before the tests to pre-warm the cache; a warm cache makes it take seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from proxy.commands.provision.build import chat_template_path, ensure_llama_server
from proxy.commands.provision.cache import ENV_CACHE, ProvisionError, cache_root
from proxy.commands.provision.model import ensure_model

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Ensure llama-server, the chat template and the model; print their paths and timings."""
    parser = argparse.ArgumentParser(
        prog="python -m proxy.commands.provision", description=main.__doc__
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help=f"cache root (default: ${ENV_CACHE} or ~/.cache/timing-proxy)",
    )
    args = parser.parse_args(argv)
    root: Path = args.root or cache_root()

    def log(msg: str) -> None:
        print(f"[provision] {msg}", flush=True)

    log(f"cache root: {root}")
    steps: list[tuple[str, Callable[[], Path]]] = [
        ("llama-server", lambda: ensure_llama_server(root, log=log)),
        ("chat template", lambda: chat_template_path(root, log=log)),
        ("model", lambda: ensure_model(root, log=log)),
    ]
    total = time.monotonic()
    for name, step in steps:
        t0 = time.monotonic()
        try:
            path = step()
        except (ProvisionError, OSError) as exc:
            print(f"[provision] {name}: FAILED: {exc}", file=sys.stderr, flush=True)
            return 1
        log(f"{name}: {path} ({time.monotonic() - t0:.1f} s)")
    log(f"done in {time.monotonic() - total:.1f} s")
    return 0
