"""proxy.core.spans without the SDK: where a record's span starts on an injected wall clock,
and a plan that holds the record's numbers and no prompt text."""

from __future__ import annotations

import dataclasses

from proxy.core.record import Outcome
from proxy.core.spans import child_spans, span_plan
from tests.fakes import FakeClock
from tests.serve.test_otel import tool_facts, tool_record

SERVER = ("llama-host.invalid", 8080)
NOW_NS = 1_800_000_000_000_000_000
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def wall_clock() -> FakeClock:
    """A wall clock at ``NOW_NS`` (read through ``FakeClock.ns``), counting its reads."""
    return FakeClock(NOW_NS / NS_PER_S)


def test_a_record_without_ts_ends_now() -> None:
    """A record without ``ts`` (another harness's log) starts at the clock's now less its
    ``e2e_ms``, so its span ends now."""
    record = tool_record(ts=None)
    clock = wall_clock()
    plan = span_plan(
        record, tool_facts(), None, server=SERVER, children=child_spans(record), now_ns=clock.ns
    )
    assert clock.reads == 1
    assert plan.start_ns == NOW_NS - int(412.125 * NS_PER_MS)
    assert plan.end_ns == NOW_NS


def test_a_record_with_ts_never_reads_the_clock() -> None:
    """A record with ``ts`` starts at it; the clock is not read."""
    record = tool_record()
    clock = wall_clock()
    plan = span_plan(
        record, tool_facts(), None, server=SERVER, children=child_spans(record), now_ns=clock.ns
    )
    assert clock.reads == 0
    assert plan.start_ns == 1_796_067_732_345_000_000  # 2026-11-30T19:42:12.345Z
    assert plan.end_ns - plan.start_ns == int(412.125 * NS_PER_MS)


def test_a_completed_record_has_no_error_and_no_prompt_text() -> None:
    """A completed call's plan has no error and no ``error.type``; the divergence text (prompt
    text) is in no attribute; a failed call's outcome is its error."""
    record = tool_record()
    plan = span_plan(record, tool_facts(), None, server=SERVER, children=(), now_ns=wall_clock().ns)
    assert plan.error is None
    assert "error.type" not in plan.attributes
    assert not any("prompt text" in str(v) for v in plan.attributes.values())
    assert plan.attributes["timing_proxy.prefill_ms"] == 52.0
    failed = dataclasses.replace(record, outcome=Outcome.UPSTREAM_ERROR)
    failed_plan = span_plan(
        failed, tool_facts(), None, server=SERVER, children=(), now_ns=wall_clock().ns
    )
    assert failed_plan.error == "upstream_error"
    assert failed_plan.attributes["error.type"] == "upstream_error"
