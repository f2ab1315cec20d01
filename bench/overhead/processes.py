"""The benchmark's processes: start and stop the fake upstream, the proxies and the
reference relays (each a role of ``bench/relay_overhead.py``), wait until they answer,
and read their CPU clocks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.overhead.constants import BARE, ENTRY, HOST, LEAN, PY, ROOT, SPLICE
from proxy.commands.ports import free_port


def cpu_seconds(pid: int) -> float:
    """CPU time (user+system, all threads) of process ``pid``, in seconds, ns resolution."""
    try:
        return time.clock_gettime((~pid << 3) | 2)  # CPUCLOCK_SCHED process clock of pid
    except OSError:  # fall back to /proc (10 ms ticks)
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Proc:
    """One started process and the URL it serves."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str
    admin_url: str = ""
    """A timing-proxy's admin listener (``/stats``); empty for the references."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def start_role(name: str, *args: str) -> Proc:
    """Run ``bench/relay_overhead.py --role ARGS`` and wait for the ``PORT n`` it prints."""
    popen = subprocess.Popen(
        [PY, str(ENTRY), "--role", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert popen.stdout is not None
    line = popen.stdout.readline().decode()
    if not line.startswith("PORT "):
        popen.kill()
        raise RuntimeError(f"{name} failed to start: {line!r}")
    return Proc(name, popen, f"http://{HOST}:{int(line.split()[1])}")


def start_upstream(keep_streams_alive: bool) -> Proc:
    extra = ["--keep-streams-alive"] if keep_streams_alive else []
    return start_role("upstream", "upstream", *extra)


def start_reference(name: str, upstream: str) -> Proc:
    """Start the reference relay ``name`` (BARE, LEAN or SPLICE) in front of ``upstream``."""
    assert name in (BARE, LEAN, SPLICE)
    return start_role(name, name, "--upstream", upstream)


UVLOOP_LAUNCHER = (
    "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); "
    "from proxy.commands.cli import main; sys.exit(main(sys.argv[1:]))"
)


def start_proxy(
    name: str, upstream: str, config: Path, log_file: Path | None, uvloop: bool
) -> Proc:
    """Start ``python -m proxy serve`` (on uvloop if asked), stdout to /dev/null."""
    port, admin_port = free_port(HOST), free_port(HOST)
    args = ["serve", "--config", str(config), "--listen", f"{HOST}:{port}", "--upstream", upstream]
    args += ["--admin-listen", f"{HOST}:{admin_port}"]
    if log_file is not None:
        args += ["--log-file", str(log_file)]
    cmd = [PY, "-c", UVLOOP_LAUNCHER, *args] if uvloop else [PY, "-m", "proxy", *args]
    popen = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return Proc(name, popen, f"http://{HOST}:{port}", f"http://{HOST}:{admin_port}")


async def wait_ready(session: Any, proc: Proc, path: str, timeout: float = 20.0) -> None:  # noqa: ASYNC109 - a readiness poll deadline
    """Poll ``GET path`` until ``proc`` answers; fail if it exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}")
        try:
            async with session.get(proc.url + path) as resp:
                await resp.read()
                return
        except OSError:
            pass
        except Exception as exc:  # aiohttp.ClientConnectorError etc.
            if "connect" not in type(exc).__name__.lower():
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} not ready after {timeout} s")
        await asyncio.sleep(0.05)


def uses_uvloop(pid: int) -> bool:
    """True if uvloop is mapped in process ``pid``."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as fh:
        return "uvloop" in fh.read()
    return False
