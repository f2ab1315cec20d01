"""structlog set-up: JSON lines rendered by orjson, to stdout and optionally a file.

The recipe is structlog's ``docs/performance.md`` one (orjson serializer, bytes output,
UTC ISO timestamps). Each line is one event; ``request_completed`` carries the record's
fields flat at the top level, so ``tail -f requests.jsonl | jq`` works. Prompts,
completions and credentials are never passed to a logger.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import orjson
import structlog

__all__ = ["TeeBytesLogger", "configure_logging", "get_logger"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class TeeBytesLogger:
    """Writes each rendered line to every sink and flushes, so tailing sees whole lines."""

    def __init__(self, sinks: list[IO[bytes]]) -> None:
        self._sinks = sinks

    def msg(self, message: bytes) -> None:
        """Write one line."""
        line = message + b"\n"
        for sink in self._sinks:
            sink.write(line)
            sink.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def configure_logging(
    level: str = "info", file: str | None = None, stream: IO[bytes] | None = None
) -> list[IO[bytes]]:
    """Configure structlog globally; returns the opened sinks (the caller closes files)."""
    sinks: list[IO[bytes]] = [stream if stream is not None else sys.stdout.buffer]
    if file:
        sinks.append(open(file, "ab"))  # noqa: SIM115 - closed by the caller at shutdown
    tee = TeeBytesLogger(sinks)

    def factory(*_args: Any) -> TeeBytesLogger:
        return tee

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
    return sinks


def get_logger() -> Any:
    """The project's logger."""
    return structlog.get_logger("timing-proxy")
