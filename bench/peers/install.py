"""Each peer's own install, outside the checkout: a virtualenv (PyPI) or a ``node_modules``
(npm) under ``$TIMING_PROXY_CACHE/peers/<name>`` (default ``~/.cache/timing-proxy/peers``),
built on first use and reused while its marker names the same requirement.

A peer that cannot be installed raises :class:`PeerUnavailable` with the reason (the tail of
the installer's log), so the run skips it and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from proxy.commands.provision.cache import cache_root, locked, tail

INSTALL_TIMEOUT = 1200.0
MARKER = ".timing-proxy-peer"


class PeerUnavailable(RuntimeError):
    """A peer that cannot be installed or started here; the message says why (one line)."""


def _log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def peers_root() -> Path:
    """Where every peer's install lives."""
    return cache_root() / "peers"


def _installed(home: Path, requirement: str, check: Path) -> bool:
    marker = home / MARKER
    return marker.is_file() and marker.read_text() == requirement and check.exists()


def _run_logged(cmd: list[str], log_file: Path, cwd: Path | None = None) -> None:
    """Run ``cmd`` with its output in ``log_file``; PeerUnavailable with the log's tail if it
    fails or cannot run."""
    try:
        with log_file.open("ab") as out:
            done = subprocess.run(
                cmd,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=INSTALL_TIMEOUT,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
                check=False,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{cmd[0]}: {exc}") from exc
    if done.returncode != 0:
        last = tail(log_file, 3).replace("\n", " / ")
        raise PeerUnavailable(f"`{' '.join(cmd[-3:])}` failed ({log_file}): {last}")


def ensure_venv(name: str, requirement: str, executable: str) -> Path:
    """The ``bin/<executable>`` of the peer's virtualenv with ``requirement``, built once."""
    home = peers_root() / name
    exe = home / "bin" / executable
    with locked(peers_root() / "locks" / f"{name}.lock", _log, f"{name} install"):
        if _installed(home, requirement, exe):
            return exe
        started = time.monotonic()
        _log(f"installing {requirement} into {home} (once)")
        home.parent.mkdir(parents=True, exist_ok=True)
        log_file = home.parent / f"{name}-install.log"
        log_file.write_text("")
        _run_logged([sys.executable, "-m", "venv", "--clear", str(home)], log_file)
        _run_logged([str(home / "bin" / "python"), "-m", "pip", "install", requirement], log_file)
        if not exe.exists():
            raise PeerUnavailable(f"{requirement} installed no {executable}")
        (home / MARKER).write_text(requirement)
        _log(f"{name}: installed in {time.monotonic() - started:.0f} s")
        return exe


def ensure_npm(
    name: str, package: str, version: str, entry: str, overrides: dict[str, str] | None = None
) -> Path:
    """The file ``node_modules/<package>/<entry>`` of the peer's npm install of
    ``package@version`` (with npm ``overrides`` of its dependencies' versions), made once."""
    home = peers_root() / name
    path = home / "node_modules" / package / entry
    spec = f"{package}@{version}"
    manifest = json.dumps({"private": True, "overrides": overrides or {}}, sort_keys=True)
    with locked(peers_root() / "locks" / f"{name}.lock", _log, f"{name} install"):
        if _installed(home, spec + " " + manifest, path):
            return path
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            raise PeerUnavailable("node/npm not on PATH")
        started = time.monotonic()
        _log(f"installing {spec} into {home} (once)")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        (home / "package.json").write_text(manifest + "\n")
        log_file = home.parent / f"{name}-install.log"
        log_file.write_text("")
        _run_logged([npm, "install", "--no-audit", "--no-fund", spec], log_file, cwd=home)
        if not path.exists():
            raise PeerUnavailable(f"{spec} installed no {entry}")
        (home / MARKER).write_text(spec + " " + manifest)
        _log(f"{name}: installed in {time.monotonic() - started:.0f} s")
        return path
