"""How the agent's listener reads requests: aiohttp's server settings for it.

All through ``web.Application(handler_args=...)``, the documented way to pass the keyword
arguments of aiohttp's web protocol (the ``AppRunner`` keywords), so the test servers get
them as production does:

- ``auto_decompress=False``: a request body is read as the bytes that arrived. aiohttp
  would otherwise inflate a ``Content-Encoding: gzip`` body while reading it, so the size
  limit saw the compressed length and llama-server got bytes the agent never sent, still
  labelled gzip. The analysis decodes a bounded copy itself
  (:mod:`proxy.core.content_coding`).
- ``max_line_size`` and ``max_field_size`` at ``[client] max_header_bytes``: aiohttp's
  limits are per line and per field only (its default request line is 8190 bytes); the
  relay refuses a header section over the total with a 431.
- ``keepalive_timeout`` at ``[client] read_timeout_s``: aiohttp's keep-alive timer runs from
  the connection's start (and from each response's end) and closes a connection that has no
  complete request head by then, so it is also the deadline of a head that stalls.
- ``logger``: aiohttp logs each request its parser refuses (a malformed request line, a
  smuggling attempt) at ERROR with a traceback; one line at DEBUG here, so no client can fill
  the log.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp.http import HttpProcessingError

from proxy.config import Config

__all__ = ["LISTENER_LOG", "listener_args"]


class _ParserRefusals(logging.Filter):
    """Turns aiohttp's record of a refused request head into one DEBUG line naming the
    parser's reason by its class (no traceback, none of the agent's bytes); any other
    record (a bug of ours) passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        refused = record.exc_info[1] if record.exc_info else None
        if isinstance(refused, HttpProcessingError):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.msg = f"{record.msg}: %s"
            args = record.args if isinstance(record.args, tuple) else ()
            record.args = (*args, type(refused).__name__)
            record.exc_info, record.exc_text = None, None
        return True


LISTENER_LOG = logging.getLogger("timing_proxy.listener")
"""The logger aiohttp's web protocol writes to for the agent's listener."""
LISTENER_LOG.addFilter(_ParserRefusals())


def listener_args(config: Config) -> dict[str, Any]:
    """The ``handler_args`` of the agent's application."""
    client = config.client
    args: dict[str, Any] = {
        "auto_decompress": False,
        "max_line_size": client.max_header_bytes,
        "max_field_size": client.max_header_bytes,
        "logger": LISTENER_LOG,
    }
    if client.read_timeout_s > 0:
        args["keepalive_timeout"] = client.read_timeout_s
    return args
