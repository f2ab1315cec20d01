"""Where the JSON log lines go: the ``--log-file`` and stdout, each on its own.

Each line goes whole to the file first, then to stdout, and one output failing (a closed or
broken stdout, a full disk) never stops the other. A failed write is retried once; a line
still not written is dropped and counted (``timing_proxy_records_dropped_total{sink}`` on
``/metrics``) and said on stderr, in one warning line per output at most every
:data:`WARN_EVERY_S`, with how many were dropped since the last (and once more at exit for
those not said yet). Never a traceback per line. A line cut short by a failure is ended before
the next one, so two lines never run together.

The file's first line must be written: when it cannot be (a full disk, an unwritable file),
that write raises an ``OSError`` naming the file, and ``serve`` stops with one line. After
that, a failure is counted, not fatal. :meth:`LogOutputs.reopen` (on ``SIGHUP``) opens the
file again at its path, for logrotate's rename and ``postrotate kill -HUP``.
"""

from __future__ import annotations

import errno
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any

import orjson

__all__ = ["WARN_EVERY_S", "LogOutputs", "Output", "stdout_stream"]

WARN_EVERY_S = 60.0
"""At most one warning on stderr per output in this many seconds."""

Clock = Callable[[], float]


def stdout_stream() -> IO[bytes] | None:
    """The process's stdout for bytes, unbuffered where it can be (a failed write then
    leaves nothing behind to be written twice); None when stdout is closed."""
    text = sys.stdout
    buffer: Any = getattr(text, "buffer", None) if text is not None else None
    stream: IO[bytes] | None = getattr(buffer, "raw", buffer)
    return stream


def _say(event: str, **fields: object) -> None:
    """One warning line on stderr, shaped as the log's lines; nothing if stderr is gone."""
    stamp = datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")
    line = orjson.dumps({**fields, "event": event, "level": "warning", "timestamp": stamp})
    try:
        sys.stderr.write(line.decode() + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _cause(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)


class Output:
    """One destination of the lines: ``stdout`` or ``file`` (at ``path``)."""

    def __init__(
        self,
        sink: str,
        stream: IO[bytes] | None,
        path: str | None = None,
        *,
        must_start: bool = False,
        clock: Clock = time.monotonic,
    ) -> None:
        self.sink = sink
        self.path = path
        self._stream = stream
        self._must_start = must_start
        """Until a line is written, a failure raises instead of being counted."""
        self._clock = clock
        self.dropped = 0
        self._unsaid = 0
        self._said_at: float | None = None
        self._cause = ""
        self._torn = False

    def write(self, line: bytes) -> bool:
        """Write ``line`` whole, retrying once; False when it was dropped (and counted)."""
        data = memoryview(b"\n" + line if self._torn else line)
        done = 0
        failure: BaseException | None = None
        for _ in range(2):  # a failed write is retried once, from where it stopped
            try:
                while done < len(data):
                    done += self._put(data[done:])
                if self._stream is not None:
                    self._stream.flush()
            except (OSError, ValueError) as exc:
                failure = exc
                continue
            self._torn, self._must_start = False, False
            return True
        if done:
            self._torn = data[done - 1] != ord("\n")
        assert failure is not None
        self._drop(failure)
        return False

    def _put(self, data: memoryview) -> int:
        if self._stream is None:
            raise OSError(errno.EBADF, "closed at start")
        written = self._stream.write(data)
        if not written:  # a non-blocking stream that took nothing
            raise BlockingIOError(errno.EAGAIN, "the output took nothing")
        return written

    def _drop(self, failure: BaseException) -> None:
        if self._must_start:
            self._must_start = False
            raise OSError(
                getattr(failure, "errno", None) or errno.EIO,
                f"cannot write the log file: {_cause(failure)}",
                self.path,
            ) from failure
        self.dropped += 1
        self._unsaid += 1
        self._cause = _cause(failure)
        now = self._clock()
        if self._said_at is None or now - self._said_at >= WARN_EVERY_S:
            self._said_at = now
            self.say()

    def say(self) -> None:
        """The warning for the lines dropped since the last one, if any."""
        if self._unsaid:
            where = {"path": self.path} if self.path is not None else {}
            _say(
                "records_dropped",
                sink=self.sink,
                **where,
                dropped=self._unsaid,
                dropped_total=self.dropped,
                cause=self._cause,
                at_most_every_s=WARN_EVERY_S,
            )
            self._unsaid = 0

    def reopen(self) -> bool:
        """Open the file at :attr:`path` again and write there from now on (the old one is
        closed); False, keeping the old one, when it cannot be opened (said on stderr)."""
        if self.path is None:
            return False
        try:
            fresh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            _say("log_reopen_failed", sink=self.sink, path=self.path, cause=_cause(exc))
            return False
        old, self._stream, self._torn = self._stream, fresh, False
        if old is not None:
            old.close()
        return True

    def close(self) -> None:
        """Say what was not said yet; close the file (stdout is left open)."""
        self.say()
        if self.path is not None and self._stream is not None:
            self._stream.close()


class LogOutputs:
    """The outputs of the log lines, written in order under one lock (the admin listener's
    thread logs too)."""

    def __init__(self, outputs: list[Output]) -> None:
        self.outputs = outputs
        self._lock = threading.Lock()

    def write(self, line: bytes) -> None:
        """Write one line (with its newline) to every output."""
        with self._lock:
            for output in self.outputs:
                output.write(line)

    def dropped(self) -> dict[str, int]:
        """Lines dropped so far, by sink."""
        with self._lock:
            return {output.sink: output.dropped for output in self.outputs}

    def reopen(self) -> list[str]:
        """Reopen the file outputs at their paths; the paths reopened."""
        with self._lock:
            return [o.path for o in self.outputs if o.path is not None and o.reopen()]

    def close(self) -> None:
        """Say the drops not said yet and close the file."""
        with self._lock:
            for output in self.outputs:
                output.close()
