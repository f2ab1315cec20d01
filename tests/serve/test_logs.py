"""The ``request_completed`` line written without structlog's processors
(:func:`proxy.serve.logs.write_record_line`): the same bytes as through them."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import orjson
import pytest
import structlog
from structlog.contextvars import bound_contextvars
from structlog.testing import capture_logs

from proxy.core.record import Kind, Outcome, Record
from proxy.serve import logs
from proxy.serve.logs import configure_logging, get_logger, write_record_line

STAMP = re.compile(rb'"timestamp":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?Z)"')

RECORDS = [
    Record(id="a", ts="2026-12-01T00:00:00.000000Z", method="POST", path="/v1/chat/completions"),
    Record(
        id="b",
        ts="2026-12-01T00:00:00.000001Z",
        method="POST",
        path="/v1/messages",
        model="gemma — 270m",
        stream=True,
        kind=Kind.TOOL,
        api="messages",
        status=200,
        ttft_ms=12.345,
        e2e_ms=1e-3,
        prompt_n=2**53,
        cache_hit_ratio=0.0,
        overhead_ms=-0.5,
        tool_call_valid=False,
        diverged_text={"before": 'a "quoted"\nline', "after": "\u00e9\U0001f600"},
        image_tokens_each=[1, 2, 3],
        finish_reason="tool_calls",
    ),
    Record(
        id="c",
        ts=None,
        method="GET",
        path="/x",
        outcome=Outcome.UPSTREAM_UNREACHABLE,
        status=502,
        error="upstream unreachable: http://127.0.0.1:1/x: connection refused",
    ),
]


@pytest.fixture
def buffer() -> Iterator[io.BytesIO]:
    """structlog configured by :func:`configure_logging` into a buffer, restored after."""
    saved = structlog.get_config()
    saved_direct = logs._direct
    out = io.BytesIO()
    configure_logging("info", stream=out)
    try:
        yield out
    finally:
        structlog.configure(**saved)
        logs._direct = saved_direct


def _through_structlog(record: Record, warning: bool) -> None:
    log = get_logger()
    (log.warning if warning else log.info)("request_completed", **record.to_dict())


def _lines(out: io.BytesIO) -> list[bytes]:
    return out.getvalue().splitlines()


@pytest.mark.parametrize("warning", [False, True])
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.id)
def test_same_bytes_as_structlog(buffer: io.BytesIO, record: Record, warning: bool) -> None:
    """The direct line is byte for byte the line structlog's processors write for the same
    record and level (keys, order, escaping, numbers), the timestamps aside, which are both
    structlog's UTC ISO format with a Z."""
    _through_structlog(record, warning)
    assert write_record_line(record, warning=warning) is True
    old, new = _lines(buffer)
    assert STAMP.search(old) and STAMP.search(new)
    assert STAMP.sub(b"T", new) == STAMP.sub(b"T", old)
    parsed = orjson.loads(new)
    assert parsed["event"] == "request_completed"
    assert parsed["level"] == ("warning" if warning else "info")
    assert list(parsed)[-3:] == ["event", "level", "timestamp"]


def test_level_filter_is_kept() -> None:
    """At ``level = "warning"`` an info line is dropped (and counts as handled) while a
    warning line is written, as the filtering logger does."""
    saved, saved_direct = structlog.get_config(), logs._direct
    out = io.BytesIO()
    configure_logging("warning", stream=out)
    try:
        assert write_record_line(RECORDS[0]) is True
        assert out.getvalue() == b""
        assert write_record_line(RECORDS[2], warning=True) is True
        (line,) = _lines(out)
        assert orjson.loads(line)["id"] == "c"
    finally:
        structlog.configure(**saved)
        logs._direct = saved_direct


def test_structlog_used_when_the_setup_is_replaced(buffer: io.BytesIO) -> None:
    """Under ``capture_logs`` (another processor chain) or with context variables bound,
    nothing is written direct: the caller goes through structlog, which sees the event."""
    with capture_logs() as captured:
        assert write_record_line(RECORDS[0]) is False
        _through_structlog(RECORDS[0], False)
    assert [e["event"] for e in captured] == ["request_completed"]
    with bound_contextvars(job="x"):
        assert write_record_line(RECORDS[0]) is False
    assert write_record_line(RECORDS[0]) is True
    assert len(_lines(buffer)) == 1


def test_not_configured_means_structlog() -> None:
    """Before :func:`configure_logging` (in-process tests, other embedders) nothing is
    written direct."""
    saved = logs._direct
    logs._direct = None
    try:
        assert write_record_line(RECORDS[0]) is False
    finally:
        logs._direct = saved
