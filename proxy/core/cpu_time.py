"""The upstream process's CPU time from ``/proc`` texts: pure, the reading is the caller's.

``/proc/PID/stat`` gives ``utime`` and ``stime`` (fields 14 and 15, in clock ticks: 100 per
second on Linux, ``os.sysconf("SC_CLK_TCK")``), summed over every thread of the process.
Readings are taken every sampling interval and stamped with the proxy's clock; the CPU time
of a request over ``[t0, t1]`` is the difference of the readings interpolated at ``t1`` and
``t0`` (``proxy.core.tegrastats.value_at``), None unless a reading is at or before ``t0`` and
one at or after ``t1``. Its resolution is one tick (10 ms) spread over the interval.

To find the process by the port it listens on, ``listening_inodes`` reads ``/proc/net/tcp``
and ``/proc/net/tcp6`` (state ``0A`` is LISTEN) and ``socket_inode`` reads the targets of the
``/proc/*/fd/*`` links (``socket:[INODE]``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.core.tegrastats import value_at

__all__ = ["cpu_ms", "cpu_ms_between", "listening_inodes", "socket_inode", "stat_ticks"]

_TCP_LISTEN = "0A"
_SOCKET_RE = re.compile(r"^socket:\[(\d+)\]$")


def stat_ticks(text: str) -> int:
    """``utime + stime`` in clock ticks from the text of ``/proc/PID/stat``.

    The command name (field 2) is in parentheses and may hold spaces and parentheses itself,
    so the fields are counted from the last ``)``. Raises ValueError on a malformed text.
    """
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 13:
        raise ValueError("not a /proc/PID/stat text")
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of the line, 1-based


def cpu_ms(ticks: int, clock_ticks_per_s: int) -> float:
    """Clock ticks as milliseconds."""
    return ticks * 1000.0 / clock_ticks_per_s


def cpu_ms_between(readings: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """CPU milliseconds spent over ``[t0, t1]`` from (time, cumulative CPU ms) readings."""
    if t1 < t0:
        return None
    start = value_at(readings, t0)
    end = value_at(readings, t1)
    if start is None or end is None:
        return None
    return round(max(end - start, 0.0), 3)


def listening_inodes(text: str, port: int) -> set[int]:
    """Inodes of the sockets listening on ``port`` in a ``/proc/net/tcp`` or ``tcp6`` text."""
    inodes: set[int] = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _TCP_LISTEN:
            continue
        _, _, hex_port = fields[1].rpartition(":")
        try:
            if int(hex_port, 16) == port:
                inodes.add(int(fields[9]))
        except ValueError:
            continue
    return inodes


def socket_inode(link: str) -> int | None:
    """The inode of a ``/proc/PID/fd/N`` link target ``socket:[INODE]``; None for others."""
    m = _SOCKET_RE.match(link)
    return int(m.group(1)) if m else None
