"""structlog set-up: JSON lines rendered by orjson, to the log file if any, and stdout.

The recipe is structlog's ``docs/performance.md`` one (orjson serializer, bytes output,
UTC ISO timestamps). Each line is one event; ``request_completed`` carries the record's
fields flat at the top level, so ``tail -f requests.jsonl | jq`` works. Prompts,
completions and credentials are never passed to a logger. How each line reaches its
outputs, and what a failed write does: :mod:`proxy.serve.log_outputs`.

``request_completed``, one line per request, does not go through structlog's processors
when this module's set-up is the one in force (:func:`write_record_line`): orjson renders
the record dataclass itself between the keys the processors would add, to the same bytes
(same keys in the same order, same timestamp format), in under a third of the time.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import IO, Any

import orjson
import structlog
from structlog.contextvars import get_contextvars
from structlog.typing import Processor

from proxy.core.record import Record
from proxy.serve.log_outputs import LogOutputs, Output, stdout_stream

__all__ = [
    "TeeBytesLogger",
    "configure_logging",
    "dropped_lines",
    "get_logger",
    "reopen_log_file",
    "write_record_line",
]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class TeeBytesLogger:
    """Writes each rendered line, whole, to every output (unbuffered), so tailing sees
    whole lines."""

    def __init__(self, outputs: LogOutputs) -> None:
        self.outputs = outputs

    def msg(self, message: bytes) -> None:
        """Write one line."""
        self.outputs.write(message + b"\n")

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def configure_logging(
    level: str = "info", file: str | None = None, stream: IO[bytes] | None = None
) -> LogOutputs:
    """Configure structlog globally: lines to ``file`` (opened here: an ``OSError`` naming
    it when it cannot be), then to ``stream`` (stdout by default). The caller closes the
    returned outputs at exit."""
    outputs = [Output("stdout", stream if stream is not None else stdout_stream())]
    if file:
        opened = open(file, "ab", buffering=0)  # noqa: SIM115 - closed by LogOutputs.close
        outputs.insert(0, Output("file", opened, file, must_start=True))
    tee = TeeBytesLogger(LogOutputs(outputs))

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
    return tee.outputs


def dropped_lines() -> dict[str, int]:
    """Lines each output (``file``, ``stdout``) dropped since :func:`configure_logging`;
    empty when it was not called."""
    direct = _direct
    return direct.tee.outputs.dropped() if direct is not None else {}


def reopen_log_file() -> None:
    """Reopen the log file at its path (logrotate's ``postrotate kill -HUP``) and say so in
    the new file; nothing without one."""
    direct = _direct
    if direct is not None:
        for path in direct.tee.outputs.reopen():
            get_logger().info("log_file_reopened", path=path)


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
