"""Board telemetry beside the relay: a sampler, a bounded ring of stamped samples, and the
record fields of one request's wall interval (docs/board.md).

Two samplers, chosen by ``[board] telemetry``:

- **tegrastats** runs ``tegrastats --interval N`` as a child process, reads its lines as they
  come (stdout and stderr together; lines that are not samples are kept as the last error
  text), stamps each with the injected clock on arrival (the relay's clock,
  ``time.perf_counter`` by default) and parses it (``proxy.core.tegrastats``).
- **proc** reads the upstream process's ``/proc/PID/stat`` every interval (a read of a few
  hundred bytes on the loop: it takes microseconds). The process is ``[board] upstream_pid``,
  or the one listening on the upstream URL's port (:mod:`proxy.serve.upstream_pid`).

A sampler that dies (exits, stops printing for ``max(2 s, 10 intervals)``, cannot start) is
started again after an exponential back-off (``backoff_s`` doubling up to ``backoff_cap_s``);
the outage is logged once (``telemetry_sampler_down``) and its end once
(``telemetry_sampler_recovered``, after ``healthy_s`` of samples). Nothing here blocks the
relay: ``sample`` (the request's :class:`~proxy.core.partials.BoardFields`) is awaited after
the exchange, and waits at most two intervals for the sample that closes the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from proxy.config import BoardConfig, Config
from proxy.core.cpu_time import cpu_ms, cpu_ms_between, stat_ticks
from proxy.core.partials import BoardFields, fields_of
from proxy.core.tegrastats import TegraSample, board_fields, parse_line
from proxy.serve.tasks import spawn
from proxy.serve.upstream_pid import find_pid_by_port, local_port

__all__ = [
    "ProcTelemetry",
    "TegrastatsTelemetry",
    "Telemetry",
    "backoff_delay",
    "find_pid_by_port",
    "telemetry_for",
]

T = TypeVar("T")
Clock = Callable[[], float]
_ERROR_CHARS = 200


def backoff_delay(failures: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before the next start after ``failures`` failed runs in a row."""
    return min(cap_s, base_s * 2.0 ** min(failures, 64))


class _SamplerDied(Exception):
    """The sampler stopped; the message says why."""


class Telemetry(ABC):
    """What the relay, ``/metrics`` and ``/stats`` use of a sampler."""

    mode: str

    @abstractmethod
    async def start(self) -> None:
        """Start sampling in the background (returns at once)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop sampling and end the child process, if any."""

    @abstractmethod
    async def sample(self, t0: float, t1: float, tokens: int | None) -> BoardFields:
        """The record fields for a request over ``[t0, t1]`` (the injected clock's seconds);
        ``tokens`` is the decoded token count (``predicted_n``)."""

    @abstractmethod
    def gauges(self) -> dict[str, float]:
        """The latest sample's gauges for ``/metrics``; empty while the sampler is down.

        tegrastats: ``power_w`` (input power, W), ``gpu_busy_pct``, ``ram_used_mb``,
        ``temp_max_c`` (each when the line has it); proc: ``upstream_cpu_s`` (the process's
        CPU seconds since it started)."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """Mode, state, samples kept, restarts and last error, for ``/stats``."""


class _Sampled(Telemetry, Generic[T]):
    """The ring, the sampler's life (restarts with back-off, logged once) and the waits."""

    def __init__(
        self,
        *,
        interval_ms: int,
        ring: int,
        clock: Clock,
        on_event: Callable[..., None] | None,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 30.0,
        healthy_s: float = 10.0,
    ) -> None:
        self._interval_s = interval_ms / 1000.0
        self._samples: deque[tuple[float, T]] = deque(maxlen=ring)
        self._clock = clock
        self._on_event = on_event or (lambda *a, **k: None)
        self._backoff_s = backoff_s
        self._backoff_cap_s = backoff_cap_s
        self._healthy_s = healthy_s
        self._state = "stopped"
        self._restarts = 0
        self._failures = 0
        self._outage = False
        self._last_error: str | None = None
        self._run_started = 0.0
        self._tick = asyncio.Event()
        self._keep: set[asyncio.Future[Any]] = set()
        self._task: asyncio.Task[None] | None = None

    # --- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn(self._supervise(), self._keep)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._state = "stopped"

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._state = "starting"
            self._run_started = loop.time()
            try:
                await self._run_once()
                error = "the sampler ended"
            except _SamplerDied as exc:
                error = str(exc)
            except Exception as exc:  # any failure of the child or the read: restart
                error = f"{type(exc).__name__}: {exc}"
            finally:
                await self._cleanup()
            delay = backoff_delay(self._failures, self._backoff_s, self._backoff_cap_s)
            self._failures += 1
            self._last_error = error[:_ERROR_CHARS]
            self._state = "restarting"
            if not self._outage:
                self._outage = True
                self._on_event(
                    "telemetry_sampler_down", mode=self.mode, error=self._last_error, retry_s=delay
                )
            await asyncio.sleep(delay)
            self._restarts += 1

    @abstractmethod
    async def _run_once(self) -> None:
        """Sample until the source fails: return or raise (``_SamplerDied`` says why)."""

    async def _cleanup(self) -> None:
        """Release what ``_run_once`` held (the child process)."""

    def _push(self, t: float, value: T) -> None:
        self._samples.append((t, value))
        self._state = "running"
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()
        if asyncio.get_running_loop().time() - self._run_started >= self._healthy_s:
            self._failures = 0
            if self._outage:
                self._outage = False
                self._on_event(
                    "telemetry_sampler_recovered", mode=self.mode, restarts=self._restarts
                )

    # --- reading ----------------------------------------------------------------------------

    async def _sample_after(self, t1: float) -> None:
        """Wait (two intervals at most) until a sample is at or after ``t1``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2.0 * self._interval_s
        while not (self._samples and self._samples[-1][0] >= t1):
            remaining = deadline - loop.time()
            if remaining <= 0 or self._state not in ("starting", "running"):
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._tick.wait()

    async def sample(self, t0: float, t1: float, tokens: int | None) -> BoardFields:
        await self._sample_after(t1)
        out = self._compute(list(self._samples), t0, t1, tokens)
        if all(value is None for value in fields_of(out).values()):
            return dataclasses.replace(out, telemetry_error=self._why_unknown())
        return out

    def _why_unknown(self) -> str:
        if self._state == "running":
            return "samples_do_not_cover_request"
        why = f": {self._last_error}" if self._last_error else ""
        return f"sampler_{self._state}{why}"

    @abstractmethod
    def _compute(
        self, samples: Sequence[tuple[float, T]], t0: float, t1: float, tokens: int | None
    ) -> BoardFields:
        """The record fields from the samples."""

    def gauges(self) -> dict[str, float]:
        if self._state != "running" or not self._samples:
            return {}
        return self._gauges(self._samples[-1][1])

    @abstractmethod
    def _gauges(self, latest: T) -> dict[str, float]:
        """The gauges of one sample."""

    def snapshot(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "state": self._state,
            "interval_ms": round(self._interval_s * 1000.0),
            "samples": len(self._samples),
            "ring": self._samples.maxlen,
            "restarts": self._restarts,
            "last_error": self._last_error,
        }


class TegrastatsTelemetry(_Sampled[TegraSample]):
    """``tegrastats --interval N`` as a child process: energy, power, GPU, RAM, temperature."""

    mode = "tegrastats"

    def __init__(self, path: str = "tegrastats", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._path = path
        self._proc: asyncio.subprocess.Process | None = None

    def _command(self) -> list[str]:
        return [self._path, "--interval", str(round(self._interval_s * 1000.0))]

    async def _run_once(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self._command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        stdout = self._proc.stdout
        assert stdout is not None
        stall_s = max(2.0, 10.0 * self._interval_s)
        other = ""
        while True:
            try:
                async with asyncio.timeout(stall_s):
                    line = await stdout.readline()
            except TimeoutError:
                raise _SamplerDied(f"{self._path} printed nothing for {stall_s:g} s") from None
            if not line:
                break
            t = self._clock()
            sample = parse_line(line.decode("utf-8", "replace"))
            if sample is None:
                other = line.decode("utf-8", "replace").strip() or other
            else:
                self._push(t, sample)
        status = await self._proc.wait()
        said = f": {other}" if other else ""
        raise _SamplerDied(f"{self._path} exited with status {status}{said}")

    async def _cleanup(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    def _compute(
        self,
        samples: Sequence[tuple[float, TegraSample]],
        t0: float,
        t1: float,
        tokens: int | None,
    ) -> BoardFields:
        return board_fields(samples, t0, t1, tokens)

    def _gauges(self, latest: TegraSample) -> dict[str, float]:
        values = {
            "power_w": None if latest.input_mw is None else latest.input_mw / 1000.0,
            "gpu_busy_pct": latest.gpu_busy_pct,
            "ram_used_mb": latest.ram_used_mb,
            "temp_max_c": latest.temp_max_c,
        }
        return {name: value for name, value in values.items() if value is not None}

    def snapshot(self) -> dict[str, Any]:
        latest = self._samples[-1][1] if self._samples else None
        return {**super().snapshot(), "input_rail": latest.input_rail if latest else None}


def _read_ticks(pid: int) -> int:
    """``utime + stime`` of ``pid`` (a few hundred bytes from /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise _SamplerDied(f"process {pid} is gone") from None
    return stat_ticks(text)


class ProcTelemetry(_Sampled[float]):
    """The upstream process's CPU time (``utime + stime``) from ``/proc/PID/stat``."""

    mode = "proc"

    def __init__(self, upstream_url: str, pid: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._given_pid = pid
        self._port = local_port(upstream_url)
        self._url = upstream_url
        self._pid: int | None = None
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")

    async def _find_pid(self) -> int:
        if self._given_pid:
            return self._given_pid
        if self._port is None:
            raise _SamplerDied(f"{self._url} is not on this host: set [board] upstream_pid")
        pid = await asyncio.to_thread(find_pid_by_port, self._port)
        if pid is None:
            raise _SamplerDied(
                f"no process of this user listens on port {self._port}: set [board] upstream_pid"
            )
        return pid

    async def _run_once(self) -> None:
        pid = await self._find_pid()
        if pid != self._pid:
            self._samples.clear()  # another process: its CPU time starts again from 0
        self._pid = pid
        while True:
            t = self._clock()
            self._push(t, cpu_ms(_read_ticks(pid), self._ticks_per_s))
            await asyncio.sleep(self._interval_s)

    def _compute(
        self, samples: Sequence[tuple[float, float]], t0: float, t1: float, tokens: int | None
    ) -> BoardFields:
        return BoardFields(upstream_cpu_ms=cpu_ms_between(samples, t0, t1))

    def _gauges(self, latest: float) -> dict[str, float]:
        return {"upstream_cpu_s": latest / 1000.0}

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "pid": self._pid}


def telemetry_for(
    config: Config | BoardConfig,
    upstream_url: str,
    clock: Clock = time.perf_counter,
    on_event: Callable[..., None] | None = None,
) -> Telemetry | None:
    """The sampler ``[board] telemetry`` asks for; None for ``off``, or ``auto`` without
    ``tegrastats`` on PATH."""
    board = config.board if isinstance(config, Config) else config
    mode = board.telemetry
    if mode == "auto":
        mode = "tegrastats" if shutil.which(board.tegrastats_path) else "off"
    common: dict[str, Any] = {
        "interval_ms": board.telemetry_interval_ms,
        "ring": board.telemetry_ring,
        "clock": clock,
        "on_event": on_event,
    }
    if mode == "tegrastats":
        return TegrastatsTelemetry(board.tegrastats_path, **common)
    if mode == "proc":
        return ProcTelemetry(upstream_url, board.upstream_pid, **common)
    return None
