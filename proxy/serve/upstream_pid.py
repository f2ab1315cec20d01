"""The process behind the upstream URL, found from ``/proc``: the proc telemetry's sampler
reads its CPU time (``docs/board.md``).

The port's listening sockets come from ``/proc/net/tcp{,6}``, their holder from the
``/proc/*/fd`` links; only processes of the proxy's own user, unless it is root, show their
fds. Blocking: callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit

from proxy.core.cpu_time import listening_inodes, socket_inode

__all__ = ["find_pid_by_port", "local_port"]

_LOCAL_HOSTS = frozenset({"localhost", "::1", "0.0.0.0", "::"})


def _pid_holding(proc: Path, inodes: set[int]) -> int | None:
    """The first process (not this one) with an fd on one of the socket ``inodes``."""
    own = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # another user's process, or it just ended
            continue
        if any(socket_inode(link) in inodes for link in links):
            return int(entry.name)
    return None


def find_pid_by_port(port: int, proc: Path = Path("/proc")) -> int | None:
    """The process listening on TCP ``port`` (IPv4 or IPv6), or None (blocking: /proc scan)."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            inodes |= listening_inodes((proc / "net" / name).read_text(encoding="ascii"), port)
    return _pid_holding(proc, inodes) if inodes else None


def local_port(url: str) -> int | None:
    """The port of ``url`` when its host is this machine's loopback or wildcard, else None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host not in _LOCAL_HOSTS and not host.startswith("127."):
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)
