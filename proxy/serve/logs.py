"""structlog set-up: JSON lines rendered by orjson, to stdout and optionally a file.

The recipe is structlog's ``docs/performance.md`` one (orjson serializer, bytes output,
UTC ISO timestamps). Each line is one event; ``request_completed`` carries the record's
fields flat at the top level, so ``tail -f requests.jsonl | jq`` works. Prompts,
completions and credentials are never passed to a logger.

``request_completed``, one line per request, does not go through structlog's processors
when this module's set-up is the one in force (:func:`write_record_line`): orjson renders
the record dataclass itself between the keys the processors would add, to the same bytes
(same keys in the same order, same timestamp format), in under a third of the time.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

import orjson
import structlog
from structlog.contextvars import get_contextvars
from structlog.typing import Processor

from proxy.core.record import Record

__all__ = ["TeeBytesLogger", "configure_logging", "get_logger", "write_record_line"]

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

    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(serializer=orjson.dumps),
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
    global _direct  # the set-up in force is global, as structlog's own is
    _direct = _DirectLines(tee, processors, _LEVELS[level])
    return sinks


class _DirectLines:
    """What :func:`write_record_line` needs of the set-up :func:`configure_logging` made."""

    def __init__(self, tee: TeeBytesLogger, processors: list[Processor], level: int) -> None:
        self.tee = tee
        self.processors = processors
        """The list given to structlog, and below a copy of its contents: while it is still
        the configured one, unchanged (``structlog.testing.capture_logs`` swaps its contents,
        another ``configure`` the list), lines go direct."""
        self.chain = list(processors)
        self.level = level


_direct: _DirectLines | None = None

_TAILS = {  # structlog sets "event" after the keyword arguments, then level and timestamp
    logging.INFO: b',"event":"request_completed","level":"info","timestamp":"',
    logging.WARNING: b',"event":"request_completed","level":"warning","timestamp":"',
}


def _fallback(obj: Any) -> Any:
    """structlog's JSON fallback for a value orjson cannot write: ``__structlog__`` or repr."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


def write_record_line(record: Record, *, warning: bool = False) -> bool:
    """Write ``record`` as its ``request_completed`` line at info (or warning) level, the
    bytes structlog's processors of :func:`configure_logging` would write, without them.

    Returns False, having written nothing, when that set-up is not the one in force (never
    configured, replaced, or context variables bound): the caller logs through structlog.
    """
    direct = _direct
    if direct is None or get_contextvars():
        return False
    processors = structlog.get_config()["processors"]
    if processors is not direct.processors or processors != direct.chain:
        return False
    level = logging.WARNING if warning else logging.INFO
    if level < direct.level:
        return True  # filtered out, as the filtering logger would
    body = orjson.dumps(record, default=_fallback)
    stamp = datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")
    direct.tee.msg(body[:-1] + _TAILS[level] + stamp.encode() + b'"}')
    return True


def get_logger() -> Any:
    """The project's logger."""
    return structlog.get_logger("timing-proxy")
