"""The benches' processes: start and stop them, wait until they answer, read the CPU time and
memory of each one's process tree. Everything listens on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.commands.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "bench" / "relay_overhead.py"  # its hidden --role starts the servers below
RESULTS_DIR = ROOT / "bench" / "results"
HOST = "127.0.0.1"
PY = sys.executable


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) of process ``pid``: its CPU clock (ns), or
    ``/proc/<pid>/stat`` ticks where the clock cannot be read."""
    try:
        return time.clock_gettime((~pid << 3) | 2)  # CPUCLOCK_SCHED process clock of pid
    except OSError:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants (a launcher and its server count as one path)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


@dataclass
class Proc:
    """One started process, the URL it serves, and a timing-proxy's admin URL."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str
    admin_url: str = ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu(self) -> float:
        """CPU seconds of the process and its live descendants."""
        total = 0.0
        for p in tree_pids(self.pid):
            with contextlib.suppress(OSError):  # it ended meanwhile
                total += cpu_seconds(p)
        return total

    def rss_mib(self) -> float:
        """Resident memory (``VmRSS``) of the process and its live descendants, MiB."""
        kib = 0
        for p in tree_pids(self.pid):
            with contextlib.suppress(OSError), open(f"/proc/{p}/status") as fh:
                kib += next((int(x.split()[1]) for x in fh if x.startswith("VmRSS:")), 0)
        return kib / 1024

    def stop(self) -> None:
        """SIGINT, then SIGKILL after 10 s: this process only, by its id."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def start_role(role: str, *args: str) -> Proc:
    """``bench/relay_overhead.py --role ROLE ARGS``; wait for the ``PORT n`` it prints."""
    popen = subprocess.Popen(
        [PY, str(ENTRY), "--role", role, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert popen.stdout is not None
    line = popen.stdout.readline().decode()
    if not line.startswith("PORT "):
        popen.kill()
        raise RuntimeError(f"{role} failed to start: {line!r}")
    return Proc(role, popen, f"http://{HOST}:{int(line.split()[1])}")


def start_proxy(
    name: str,
    upstream: str,
    tmp: Path,
    log_file: Path | None = None,
    config: str = "",
    tree: Path = ROOT,
) -> Proc:
    """``python -m proxy serve`` of ``tree`` as a user runs it (the JSON log line per request
    on, stdout to /dev/null; ``log_file`` also keeps it), a pool for 200 streams, ``config``
    added."""
    (tmp / f"{name}.toml").write_text("[upstream]\nmax_connections = 256\n" + config)
    port, admin_port = free_port(HOST), free_port(HOST)
    args = ["serve", "--config", str(tmp / f"{name}.toml"), "--upstream", upstream]
    args += ["--listen", f"{HOST}:{port}", "--admin-listen", f"{HOST}:{admin_port}"]
    args += ["--log-file", str(log_file)] if log_file is not None else []
    popen = subprocess.Popen(
        [PY, "-m", "proxy", *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    return Proc(name, popen, f"http://{HOST}:{port}", f"http://{HOST}:{admin_port}")


async def wait_ready(session: Any, proc: Proc, url: str, timeout: float = 20.0) -> None:  # noqa: ASYNC109 - a readiness deadline
    """Poll ``GET url`` until ``proc`` answers; fail if it exits or ``timeout`` passes."""
    import aiohttp

    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}")
        with contextlib.suppress(OSError, aiohttp.ClientConnectionError):
            async with session.get(url) as resp:
                await resp.read()
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} not ready after {timeout} s")
        await asyncio.sleep(0.05)
