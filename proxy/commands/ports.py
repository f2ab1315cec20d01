"""Loopback ports for the processes the commands and tests start."""

from __future__ import annotations

import socket

__all__ = ["free_port", "port_or_free"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the kernel's pick; another process may take it
    before it is bound again, so callers that start servers retry on a bind failure)."""
    return port_or_free(0, host)


def port_or_free(port: int, host: str = "127.0.0.1") -> int:
    """``port`` if it is free on ``host``, else (or for 0) a free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            sock.bind((host, 0))
        return int(sock.getsockname()[1])
