"""A llama-server process on 127.0.0.1, started and stopped for the demo, tests and benchmarks.

``LlamaServer.start`` waits until ``GET /health`` answers 200. A server that dies before that
raises ``LlamaServerError`` at once (never after the start timeout) with a first line that
says what happened and where the log is. A crash by SIGILL, SIGSEGV or SIGBUS at start is
the mark of a binary using CPU instructions the machine advertises but does not let a
process use (AMX or AVX-512 in some VMs); the server is then started once more with
``--no-repack`` (no extra CPU buffer types: neither repacked weights nor AMX), and if that
crashes too the error names the signal and the fix.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from proxy.commands.errors import LlamaServerError
from proxy.commands.ports import free_port
from proxy.commands.provision.cache import Log, tail

__all__ = [
    "CPU_CRASH_SIGNALS",
    "LlamaServer",
    "LlamaServerCrash",
    "LlamaServerError",
    "crash_message",
    "signal_name",
]

NO_REPACK = ("--no-repack", "-nr")
"""llama-server's flag (long and short) against the extra CPU buffer types (repack, AMX)."""
ALIAS = ("--alias", "-a")
"""llama-server's flag (long and short) naming the model in the API."""

CPU_CRASH_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS})
"""Signals that, at start-up, mean an instruction the CPU advertises but will not run."""

CPU_CAUSE = (
    "the binary uses CPU instructions this machine advertises but does not let a process use "
    "(AMX/AVX-512 in some VMs)"
)
REBUILD_FIX = "rebuild it portable (python -m proxy.commands.provision builds with GGML_NATIVE=OFF)"


class LlamaServerCrash(LlamaServerError):
    """llama-server was killed by a signal before it became ready."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def signal_name(signum: int) -> str:
    """``SIGILL (Illegal instruction)`` for 4; ``signal 99`` for a number with no name."""
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"signal {signum}"
    description = signal.strsignal(sig)
    return f"{sig.name} ({description})" if description else sig.name


def crash_message(signum: int, log_path: Path, *, no_repack: bool) -> str:
    """The one line for a llama-server killed by ``signum`` before it became ready.

    For SIGILL, SIGSEGV and SIGBUS it names the cause and the fix; ``no_repack`` says the
    server already ran with ``--no-repack``, so only the rebuild is left to suggest.
    """
    head = f"llama-server was killed by {signal_name(signum)} before becoming ready"
    if signum not in CPU_CRASH_SIGNALS:
        return f"{head}; log: {log_path}"
    if no_repack:
        return f"{head}, even with --no-repack: {CPU_CAUSE}; {REBUILD_FIX}; log: {log_path}"
    return (
        f"{head}: {CPU_CAUSE}; {REBUILD_FIX} or start llama-server with --no-repack; "
        f"log: {log_path}"
    )


def _has_flag(args: Sequence[str], names: Sequence[str]) -> bool:
    """True if ``args`` holds one of ``names``, alone or as ``--name=value``."""
    return any(arg in names or arg.split("=", 1)[0] in names for arg in args)


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _stderr_log(message: str) -> None:
    print(f"[llama-server] {message}", file=sys.stderr, flush=True)


class LlamaServer:
    """A llama-server subprocess on 127.0.0.1, for tests and benchmarks.

    >>> with LlamaServer(binary, model, template) as server:  # doctest: +SKIP
    ...     urllib.request.urlopen(server.url + "/health")

    Output goes to ``log_path``, in ``log_dir`` or else a fresh temporary directory (kept
    after ``stop`` for post-mortems); a failed ``start`` raises ``LlamaServerError``. The API
    names the model ``alias`` (default: the model file's stem, ``gemma-3-270m-q4_k_m``)
    unless ``extra_args`` already give ``--alias``; ``log`` receives the one-line notes
    (default: stderr).
    """

    host = "127.0.0.1"

    def __init__(
        self,
        binary: Path | str,
        model: Path | str,
        template: Path | str | None = None,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        ctx: int = 4096,
        parallel: int = 1,
        log_dir: Path | str | None = None,
        alias: str | None = None,
        log: Log | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.model = Path(model)
        self.template = Path(template) if template is not None else None
        self._auto_port = port is None
        self.port: int = port if port is not None else free_port()
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.alias = self.model.stem if alias is None else alias
        self.ctx = ctx
        self.parallel = parallel
        if log_dir is None:
            log_dir = tempfile.mkdtemp(prefix="llama-server-")
        self.log_path = Path(log_dir) / "llama-server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._say: Log = log or _stderr_log

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8080`` (no trailing slash)."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The argv used to start the server."""
        cmd = [str(self.binary), "-m", str(self.model)]
        if self.template is not None:
            cmd += ["--chat-template-file", str(self.template)]
        if self.alias and not _has_flag(self.extra_args, ALIAS):
            cmd += ["--alias", self.alias]
        cmd += [
            "--host", self.host, "--port", str(self.port),
            "-c", str(self.ctx), "-np", str(self.parallel), "--metrics",
            *self.extra_args,
        ]  # fmt: skip
        return cmd

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        return tail(self.log_path, lines)

    def start(self, timeout: float = 120.0) -> Self:
        """Start the server and wait until ``GET /health`` answers 200.

        A crash by SIGILL/SIGSEGV/SIGBUS before that starts it once more with
        ``--no-repack`` (unless it had it already), saying so in one line.
        """
        if self.running:
            raise LlamaServerError(f"llama-server already running at {self.url}")
        try:
            return self._start_on_a_port(timeout)
        except LlamaServerCrash as crash:
            if crash.signum not in CPU_CRASH_SIGNALS or _has_flag(self.extra_args, NO_REPACK):
                raise
            self._say(
                f"llama-server was killed by {signal.Signals(crash.signum).name} at start "
                "(CPU instructions this machine will not run): starting it again with --no-repack"
            )
        self.extra_args = (*self.extra_args, "--no-repack")
        return self._start_on_a_port(timeout)

    def _start_on_a_port(self, timeout: float) -> Self:
        """Start and wait; pick another port (twice at most) if ours was taken meanwhile."""
        for attempt in range(3):
            self._spawn()
            try:
                self._wait_ready(timeout)
                return self
            except LlamaServerError:
                lost_port = "couldn't bind" in self.log_tail()
                self.stop()
                if not (lost_port and self._auto_port and attempt < 2):
                    raise
                self.port = free_port()  # someone took the port between pick and bind
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("ab")
        self._log_file.write(f"$ {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            self._close_log()
            raise LlamaServerError(f"cannot start {self.binary}: {exc}") from exc

    def _exit_error(self, rc: int) -> LlamaServerError:
        """The error for a server that exited with ``rc`` before it became ready."""
        log_tail = self.log_tail()
        if rc < 0:
            no_repack = _has_flag(self.extra_args, NO_REPACK)
            message = crash_message(-rc, self.log_path, no_repack=no_repack)
            return LlamaServerCrash(f"{message}\n{log_tail}", -rc)
        last = _last_line(log_tail)
        said = f" ({last})" if last else ""
        return LlamaServerError(
            f"llama-server exited with code {rc} before becoming ready{said}; "
            f"log: {self.log_path}\n{log_tail}"
        )

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            rc = self.process.poll()
            if rc is not None:
                raise self._exit_error(rc)
            if self._healthy():
                return
            if time.monotonic() >= deadline:
                raise LlamaServerError(
                    f"llama-server not ready after {timeout:g} s at {self.url}; "
                    f"log: {self.log_path}\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                status: int = resp.status
                return status == 200
        except urllib.error.HTTPError as exc:
            exc.close()
            return False
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server, SIGKILL it after ``timeout`` seconds; idempotent."""
        proc, self.process = self.process, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            else:
                proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LlamaServer {self.url} {state} model={self.model.name}>"
