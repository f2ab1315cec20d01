"""The GenAI conventions' newer span attributes (stream, time to first chunk, reasoning and
image token counts), each present only where the record has the value, and the opt-in server
view (``[otel] server_spans``): a SERVER span with queue, prefill and decode children
(docs/otel.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from proxy.config import load_config
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.server_spans import (
    LATENCY_DECODE,
    LATENCY_E2E,
    LATENCY_FIRST_TOKEN,
    LATENCY_INFERENCE,
    LATENCY_PREFILL,
    LATENCY_QUEUE,
    server_child_spans,
)
from proxy.core.spans import PartKind, child_spans, span_count, span_plan
from proxy.core.tracker import Observation
from proxy.serve.otel import OtelSink, otel_resource, otel_sink_for

SERVER = ("llama-host.invalid", 8080)
UPSTREAM = "http://llama-host.invalid:8080"  # only named in attributes, never resolved
NS = 1_000_000

STREAM = "gen_ai.request.stream"
FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
REASONING = "gen_ai.usage.reasoning.output_tokens"
IMAGE = "gen_ai.usage.image.input_tokens"


def call_record(**changes: Any) -> Record:
    """A streamed chat call with reasoning and an image, timed by llama-server."""
    base = Record(
        id="fedcba9876543210",
        ts="2026-11-30T19:42:12.345Z",
        method="POST",
        path="/v1/chat/completions",
        model="qwen3-vl",
        stream=True,
        kind=Kind.CHAT,
        api="chat_completions",
        status=200,
        ttfb_ms=130.0,
        ttft_ms=180.0,
        e2e_ms=900.0,
        prefill_ms=110.0,
        decode_ms=760.0,
        prompt_n=400,
        cache_n=64,
        predicted_n=60,
        prompt_tokens=464,
        overhead_ms=70.0,
        reasoning_tokens=24,
        image_tokens=256,
        finish_reason="stop",
    )
    return dataclasses.replace(base, **changes)


def call_facts(**changes: Any) -> RequestFacts:
    base = RequestFacts(
        kind=Kind.CHAT,
        model="qwen3-vl",
        stream=True,
        body={"model": "qwen3-vl", "stream": True},
        api="chat_completions",
    )
    return dataclasses.replace(base, **changes)


def attributes(record: Record) -> dict[str, Any]:
    plan = span_plan(record, call_facts(), None, server=SERVER, children=(), now_ns=lambda: 0)
    return dict(plan.attributes)


class TestNewAttributes:
    def test_the_names_are_the_conventions(self) -> None:
        """The attribute names are the conventions' own strings (those the docs list)."""
        attrs = attributes(call_record())
        assert {STREAM, FIRST_CHUNK, CACHE_READ, REASONING, IMAGE} <= attrs.keys()

    def test_a_streamed_call_has_every_value_the_record_has(self) -> None:
        """A streamed call: ``stream`` true, time to first chunk = ``ttft_ms`` in seconds,
        cache read = ``cache_n``, reasoning = ``reasoning_tokens``, image input =
        ``image_tokens``."""
        attrs = attributes(call_record())
        assert attrs[STREAM] is True
        assert attrs[FIRST_CHUNK] == pytest.approx(0.180)
        assert attrs[CACHE_READ] == 64
        assert attrs[REASONING] == 24
        assert attrs[IMAGE] == 256

    def test_a_non_streamed_call_has_no_time_to_first_chunk(self) -> None:
        """A non-streamed call says ``stream`` false and has no time to first chunk, though
        the record has a ``ttft_ms`` (the conventions ask for it on streams only)."""
        attrs = attributes(call_record(stream=False))
        assert attrs[STREAM] is False
        assert FIRST_CHUNK not in attrs

    def test_values_the_record_lacks_are_absent(self) -> None:
        """No reasoning count, no image, no cache count, no stream flag, no first token: none
        of their attributes (no zero, no null)."""
        record = call_record(
            reasoning_tokens=None, image_tokens=None, cache_n=None, stream=None, ttft_ms=None
        )
        attrs = attributes(record)
        assert not {STREAM, FIRST_CHUNK, CACHE_READ, REASONING, IMAGE} & attrs.keys()
        assert attrs["gen_ai.usage.input_tokens"] == 464

    def test_a_request_that_is_no_model_call_has_no_gen_ai_attribute(self) -> None:
        """``GET /health`` (api other) carries no ``gen_ai.*`` attribute, the new ones
        included, even with a ``stream`` value in its record."""
        record = call_record(api="other", method="GET", path="/health", stream=False)
        assert not [k for k in attributes(record) if k.startswith("gen_ai.")]


class TestServerSpansPlan:
    def test_server_span_holds_queue_prefill_and_decode(self) -> None:
        """With the server view, the CLIENT span has one SERVER child named like it, from the
        arrival to the decode's end, whose children are queue (arrival to the prefill's
        start), prefill and decode in that order."""
        record = call_record()
        (server,) = server_child_spans(record, call_facts(), None, server=SERVER)
        assert server.kind is PartKind.SERVER
        assert server.name == "chat qwen3-vl"
        assert [c.name for c in server.children] == ["queue", "prefill", "decode"]
        queue, prefill, decode = server.children
        assert all(c.kind is PartKind.INTERNAL for c in server.children)
        assert (queue.start_ms, queue.end_ms) == (0.0, prefill.start_ms)
        assert queue.end_ms == pytest.approx(20.0)  # the prefill ends at ttfb_ms 130, lasts 110
        assert (server.start_ms, server.end_ms) == (0.0, decode.end_ms)
        assert span_count((server,)) == 4

    def test_server_span_latencies_in_seconds_and_no_usage(self) -> None:
        """The SERVER span carries the phases as ``gen_ai.latency.*`` seconds and the
        operation and models, but no ``gen_ai.usage.*`` (the CLIENT span has them)."""
        record = call_record()
        obs = Observation(model="qwen3-vl-served")
        (server,) = server_child_spans(record, call_facts(), obs, server=SERVER)
        attrs = server.attributes
        expected = {
            LATENCY_QUEUE: 0.020,
            LATENCY_PREFILL: 0.110,
            LATENCY_DECODE: 0.760,
            LATENCY_INFERENCE: 0.870,
            LATENCY_FIRST_TOKEN: 0.180,
            LATENCY_E2E: 0.900,
        }
        assert {k: attrs[k] for k in expected} == pytest.approx(expected)
        assert attrs["gen_ai.response.model"] == "qwen3-vl-served"
        assert attrs["server.address"] == "llama-host.invalid"
        assert not [k for k in attrs if k.startswith("gen_ai.usage.")]

    def test_no_server_span_where_llama_server_did_not_time_the_call(self) -> None:
        """A call that never reached llama-server (no prefill, no decode) and a request that
        is no model call get no SERVER span: the same (empty) children as without the
        option."""
        unreached = call_record(
            outcome=Outcome.UPSTREAM_UNREACHABLE,
            status=None,
            ttfb_ms=None,
            ttft_ms=None,
            prefill_ms=None,
            decode_ms=None,
        )
        health = call_record(api="other", method="GET", path="/health")
        for record in (unreached, health):
            got = server_child_spans(record, call_facts(), None, server=SERVER)
            assert got == child_spans(record)
            assert not [p for p in got if p.kind is PartKind.SERVER]

    def test_a_prefill_starting_at_the_arrival_has_no_queue(self) -> None:
        """A prefill that starts at the request's arrival leaves no queue child."""
        record = call_record(ttfb_ms=110.0, ttft_ms=110.0)
        (server,) = server_child_spans(record, call_facts(), None, server=SERVER)
        assert [c.name for c in server.children] == ["prefill", "decode"]
        assert LATENCY_QUEUE not in server.attributes


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@contextmanager
def _sink(exporter: InMemorySpanExporter, *, server_spans: bool) -> Iterator[OtelSink]:
    sink = OtelSink(
        exporter,
        resource=otel_resource("timing-proxy", {}),
        upstream_url=UPSTREAM,
        max_queue_size=64,
        schedule_delay_ms=50,
        server_spans=server_spans,
    )
    yield sink
    sink.shutdown(timeout_s=5)


def _spans(sink: OtelSink, exporter: InMemorySpanExporter, record: Record) -> list[ReadableSpan]:
    sink(record, call_facts(), None)
    assert sink.flush(timeout_s=5)
    return list(exporter.get_finished_spans())


class TestServerSpansExported:
    def test_off_no_server_span(self, exporter: InMemorySpanExporter) -> None:
        """Without the option, no span is SERVER: prefill and decode are the CLIENT span's
        children, and there is no queue span."""
        with _sink(exporter, server_spans=False) as sink:
            spans = _spans(sink, exporter, call_record())
            assert sorted(s.name for s in spans) == ["chat qwen3-vl", "decode", "prefill"]
            assert not [s for s in spans if s.kind is SpanKind.SERVER]
            (root,) = [s for s in spans if s.parent is None]
            assert root.context is not None
            assert {s.parent.span_id for s in spans if s.parent} == {root.context.span_id}

    def test_on_server_span_under_the_client_span(self, exporter: InMemorySpanExporter) -> None:
        """With the option, the CLIENT span's one child is the SERVER span, and queue,
        prefill and decode are the SERVER span's children, placed on the wall clock."""
        with _sink(exporter, server_spans=True) as sink:
            exported = _spans(sink, exporter, call_record())
            root = [s for s in exported if s.kind is SpanKind.CLIENT]
            server = [s for s in exported if s.kind is SpanKind.SERVER]
            assert len(root) == 1 and len(server) == 1
            assert server[0].name == root[0].name == "chat qwen3-vl"
            assert root[0].context is not None and server[0].context is not None
            assert server[0].parent is not None
            assert server[0].parent.span_id == root[0].context.span_id
            spans = {s.name: s for s in exported if s.kind is SpanKind.INTERNAL}
            for name in ("queue", "prefill", "decode"):
                parent = spans[name].parent
                assert parent is not None and parent.span_id == server[0].context.span_id
            start = root[0].start_time or 0
            assert ((spans["queue"].end_time or 0) - start) / NS == pytest.approx(20.0)
            assert (sink.exported(), sink.dropped()) == (5, 0)

    @pytest.mark.parametrize(("server_spans", "spans"), [(None, 3), (False, 3), (True, 5)])
    def test_config_key_reaches_the_sink(
        self, refusing_url: str, server_spans: bool | None, spans: int
    ) -> None:
        """``[otel] server_spans`` is off when unset; ``true`` makes the configured sink send
        five spans for a timed call (CLIENT, SERVER, queue, prefill, decode) instead of three
        (queued: the batch waits for the SDK's schedule delay)."""
        # the export to the refusing endpoint gives up at its 0.1 s deadline instead of
        # retrying for 5 s in the SDK's thread (whose retries draw from the global random
        # state while later tests run: hypothesis takes that for a strategy using it)
        otel: dict[str, object] = {"endpoint": refusing_url, "export_timeout_s": 0.1}
        if server_spans is not None:
            otel["server_spans"] = server_spans
        config = load_config(None, {"otel": otel, "upstream": {"url": UPSTREAM}})
        assert config.otel.server_spans is bool(server_spans)
        sink = otel_sink_for(config)
        assert sink is not None
        sink(call_record(), call_facts(), None)
        assert sink.queued() == spans
        sink.shutdown(timeout_s=5)  # returns once the export has failed, its thread done
