"""OpenTelemetry traces: one span per record with the GenAI conventions' attributes and the
record's fields, prefill/decode child spans on the wall clock, a bounded queue whose drops are
counted, and a dead collector that costs the sink nothing (docs/otel.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from proxy.config import Config, OtelConfig, load_config
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import RequestFacts, analyse_request
from proxy.core.tracker import Observation
from proxy.serve.keys import SINKS
from proxy.serve.otel import (
    PROVIDER,
    OtelSink,
    OtelSpanCollector,
    otel_enabled,
    otel_resource,
    otel_sink_for,
    phases,
    traces_endpoint,
)
from tests.conftest import ProxyFactory
from tests.fakes import load_recording, replay

UPSTREAM = "http://llama-host.invalid:8080"  # only named in attributes, never resolved
NS = 1_000_000
POLL_S = 0.02  # how often the receiver's thread looks for its shutdown (http.server: 0.5 s)
Memory = tuple[OtelSink, InMemorySpanExporter]


def _epoch_ns(ts: str) -> int:
    when = datetime.fromisoformat(ts)
    return round(when.timestamp() * 1000) * NS


def tool_record(**changes: Any) -> Record:
    """A streamed tool call as the relay records one (every kind of field filled)."""
    base = Record(
        id="0123456789abcdef",
        ts="2026-11-30T19:42:12.345Z",
        method="POST",
        path="/v1/chat/completions",
        model="gemma-3-270m",
        stream=True,
        kind=Kind.TOOL,
        api="chat_completions",
        status=200,
        ttfb_ms=61.5,
        ttft_ms=95.25,
        e2e_ms=412.125,
        decode_wall_ms=300.0,
        prefill_ms=52.0,
        decode_ms=333.5,
        prompt_n=180,
        cache_n=40,
        predicted_n=21,
        prompt_tokens=220,
        decode_tok_s=59.97,
        tool_calls=1,
        tool_call_valid=True,
        tool_call_ms=405.0,
        tool_call_tokens=21,
        schema_hash="abc123",
        schema_tokens=90,
        schema_prefill_ms=21.0,
        schema_cached=False,
        image_tokens_each=[256, 128],
        diverged_text={"before": "prompt text", "after": "other text"},
        finish_reason="tool_calls",
    )
    return dataclasses.replace(base, **changes)


def tool_facts(**changes: Any) -> RequestFacts:
    base = RequestFacts(
        kind=Kind.TOOL,
        model="gemma",
        stream=True,
        tool_names=frozenset({"move"}),
        body={"model": "gemma", "max_tokens": 48, "temperature": 0, "top_p": 0.9},
        api="chat_completions",
    )
    return dataclasses.replace(base, **changes)


def served(model: str = "gemma-3-270m-served") -> Observation:
    return Observation(model=model)


@pytest.fixture
def memory() -> Iterator[Memory]:
    """A sink exporting to the SDK's in-memory exporter, with the fleet's labels."""
    exporter = InMemorySpanExporter()
    sink = OtelSink(
        exporter,
        resource=otel_resource("timing-proxy", {"robot": "arm-3", "site": "lab"}),
        upstream_url=UPSTREAM,
        max_queue_size=64,
        schedule_delay_ms=50,
    )
    yield sink, exporter
    sink.shutdown(timeout_s=5)


def spans_of(
    memory: Memory,
    record: Record,
    facts: RequestFacts,
    obs: Observation | None,
) -> dict[str, ReadableSpan]:
    """Send one record through the sink; its spans by name (the root under ``root``)."""
    sink, exporter = memory
    exporter.clear()
    sink(record, facts, obs)
    assert sink.flush(timeout_s=5)
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1
    out = {s.name: s for s in spans if s.parent is not None}
    out["root"] = roots[0]
    return out


def offset_ms(span_time: int | None, start: int) -> float:
    assert span_time is not None
    return (span_time - start) / NS


class TestTheSpan:
    def test_name_kind_and_wall_clock_times(self, memory: Memory) -> None:
        """The span is named ``{operation} {request model}``, is a CLIENT span (the proxy's
        call to llama-server, which ``server.address`` names), starts at ``ts`` and lasts
        ``e2e_ms``."""
        record = tool_record()
        root = spans_of(memory, record, tool_facts(), served())["root"]
        assert root.name == "chat gemma"
        assert root.kind is SpanKind.CLIENT
        assert record.ts is not None and record.e2e_ms is not None
        assert root.start_time == _epoch_ns(record.ts)
        assert offset_ms(root.end_time, root.start_time or 0) == pytest.approx(record.e2e_ms)
        assert root.status.status_code is StatusCode.UNSET

    def test_gen_ai_attributes(self, memory: Memory) -> None:
        """The GenAI conventions' attributes: operation, provider, request and response
        model, token usage (input = prompt_tokens incl. cache, output = predicted_n, cache
        read = cache_n), finish reasons as an array, request parameters, the upstream as
        server.address/port and the HTTP status."""
        record, facts = tool_record(), tool_facts()
        attrs = spans_of(memory, record, facts, served("served-name"))["root"].attributes
        assert attrs is not None
        assert facts.body is not None
        expected = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": facts.model,
            "gen_ai.response.model": "served-name",
            "gen_ai.usage.input_tokens": record.prompt_tokens,
            "gen_ai.usage.output_tokens": record.predicted_n,
            "gen_ai.usage.cache_read.input_tokens": record.cache_n,
            "gen_ai.response.finish_reasons": (record.finish_reason,),
            "gen_ai.request.max_tokens": facts.body["max_tokens"],
            "gen_ai.request.temperature": float(facts.body["temperature"]),
            "gen_ai.request.top_p": facts.body["top_p"],
            "server.address": "llama-host.invalid",
            "server.port": 8080,
            "http.request.method": record.method,
            "url.path": record.path,
            "http.response.status_code": record.status,
        }
        assert {k: attrs.get(k) for k in expected} == expected
        assert "error.type" not in attrs

    def test_every_non_null_record_field_is_a_timing_proxy_attribute(self, memory: Memory) -> None:
        """Each non-null scalar field is ``timing_proxy.<field>`` with its value, a list of
        ints is an array, a dict (the divergence text: prompt text) is left out, and null
        fields are absent."""
        record = tool_record()
        attrs = spans_of(memory, record, tool_facts(), served())["root"].attributes
        assert attrs is not None
        for name, value in record.to_dict().items():
            key = f"timing_proxy.{name}"
            if value is None or isinstance(value, dict):
                assert key not in attrs, key
            elif isinstance(value, list):
                assert attrs[key] == tuple(value), key
            else:
                assert attrs[key] == value, key
        assert record.image_tokens_each is not None
        assert attrs["timing_proxy.image_tokens_each"] == tuple(record.image_tokens_each)

    def test_resource_holds_service_and_fleet_labels(self, memory: Memory) -> None:
        """The resource names the service, its version and the fleet's labels, under the
        names ``[fleet] labels`` gives them."""
        root = spans_of(memory, tool_record(), tool_facts(), served())["root"]
        resource = root.resource.attributes
        assert resource["service.name"] == "timing-proxy"
        assert resource["service.version"]
        assert (resource["robot"], resource["site"]) == ("arm-3", "lab")

    def test_failure_sets_error_type_and_status(self, memory: Memory) -> None:
        """A request that did not complete: ``error.type`` is its outcome and the span's
        status is ERROR, described by the outcome."""
        record = tool_record(
            outcome=Outcome.UPSTREAM_UNREACHABLE,
            status=502,
            error="ClientConnectorError",
            ttfb_ms=None,
            ttft_ms=None,
            prefill_ms=None,
            decode_ms=None,
            decode_wall_ms=None,
            tool_call_ms=None,
            tool_calls=None,
        )
        spans = spans_of(memory, record, tool_facts(), None)
        root = spans["root"]
        assert root.attributes is not None
        assert root.attributes["error.type"] == str(Outcome.UPSTREAM_UNREACHABLE)
        assert root.status.status_code is StatusCode.ERROR
        assert root.status.description == str(Outcome.UPSTREAM_UNREACHABLE)
        assert set(spans) == {"root"}  # nothing measured: no phases
        assert root.events == ()

    def test_completions_are_text_completion(self, memory: Memory) -> None:
        """A completion endpoint's record is a ``text_completion`` operation."""
        record = tool_record(api="completions", kind=Kind.OTHER, path="/completion")
        facts = tool_facts(api="completions", kind=Kind.OTHER, model=None)
        root = spans_of(memory, record, facts, None)["root"]
        assert root.name == f"text_completion {record.model}"
        assert root.attributes is not None
        assert root.attributes["gen_ai.operation.name"] == "text_completion"

    def test_other_requests_are_plain_http_spans(self, memory: Memory) -> None:
        """A request that is no model call (``/health``) is named by its method alone and has
        no ``gen_ai.*`` attribute."""
        record = Record(id="1", ts="2026-11-30T19:42:12.000Z", method="GET", path="/health")
        record = dataclasses.replace(record, status=200, e2e_ms=1.5)
        facts = RequestFacts(kind=Kind.OTHER)
        root = spans_of(memory, record, facts, None)["root"]
        assert root.name == "GET"
        assert root.attributes is not None
        assert not [k for k in root.attributes if k.startswith("gen_ai.")]
        assert root.attributes["url.path"] == "/health"


class TestPhases:
    def test_stream_prefill_ends_at_the_first_byte_and_decode_follows(self, memory: Memory) -> None:
        """For a stream the prefill child span ends at the first token (``ttfb_ms``, the
        earliest fitting candidate) and lasts ``prefill_ms``; the decode starts there and
        lasts ``decode_ms``; both are children of the request's span."""
        record = tool_record()
        assert record.ttfb_ms is not None and record.prefill_ms is not None
        assert record.decode_ms is not None
        spans = spans_of(memory, record, tool_facts(), served())
        root, prefill, decode = spans["root"], spans["prefill"], spans["decode"]
        t0 = root.start_time or 0
        assert offset_ms(prefill.end_time, t0) == pytest.approx(record.ttfb_ms)
        assert offset_ms(prefill.start_time, t0) == pytest.approx(
            record.ttfb_ms - record.prefill_ms
        )
        assert offset_ms(decode.start_time, t0) == pytest.approx(record.ttfb_ms)
        assert offset_ms(decode.end_time, t0) == pytest.approx(record.ttfb_ms + record.decode_ms)
        for child in (prefill, decode):
            assert child.parent is not None
            assert child.parent.span_id == root.context.span_id
            assert child.kind is SpanKind.INTERNAL
        assert prefill.attributes is not None and decode.attributes is not None
        assert prefill.attributes["timing_proxy.prompt_n"] == record.prompt_n
        assert decode.attributes["timing_proxy.predicted_n"] == record.predicted_n
        assert not [k for k in [*prefill.attributes, *decode.attributes] if "gen_ai" in k]

    def test_non_stream_prefill_ends_at_e2e_minus_decode(self, memory: Memory) -> None:
        """A non-streamed response's first byte is its whole body: the prefill ends at
        ``e2e_ms - decode_ms`` instead, as the dashboard draws it."""
        record = tool_record(stream=False, ttfb_ms=400.0, ttft_ms=None, e2e_ms=401.0)
        assert record.decode_ms is not None and record.prefill_ms is not None
        spans = spans_of(memory, record, tool_facts(stream=False), served())
        t0 = spans["root"].start_time or 0
        end = 401.0 - record.decode_ms
        assert offset_ms(spans["prefill"].end_time, t0) == pytest.approx(end)
        assert offset_ms(spans["decode"].start_time, t0) == pytest.approx(end)

    def test_events_first_token_and_tool_call(self, memory: Memory) -> None:
        """The first token and the completed tool call are events at ``ttft_ms`` and
        ``tool_call_ms`` from the request's arrival."""
        record = tool_record()
        root = spans_of(memory, record, tool_facts(), served())["root"]
        t0 = root.start_time or 0
        events = {e.name: e for e in root.events}
        assert offset_ms(events["first token"].timestamp, t0) == pytest.approx(record.ttft_ms)
        call = events["tool call complete"]
        assert offset_ms(call.timestamp, t0) == pytest.approx(record.tool_call_ms)
        assert call.attributes is not None
        assert call.attributes["timing_proxy.tool_call_tokens"] == record.tool_call_tokens

    def test_phases_match_the_dashboard_geometry_without_server_timings(self) -> None:
        """Without llama-server's timings the decode is the wall clock's, from the first
        token, and there is no prefill span."""
        record = tool_record(prefill_ms=None, decode_ms=None, ttft_ms=90.0, decode_wall_ms=200.0)
        assert phases(record) == (None, (90.0, 290.0))
        assert phases(tool_record(prefill_ms=None, decode_ms=None, ttft_ms=None)) == (None, None)


class _Gate(SpanExporter):
    """An exporter that holds every export until released: a collector that hangs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


class TestQueue:
    def test_queue_bound_respected_and_drops_counted(self) -> None:
        """With the exporter stuck, the queue holds at most ``max_queue_size`` spans; every
        record that does not fit is dropped whole and counted; once the collector answers,
        every span was either exported or counted as dropped."""
        gate = _Gate()
        bound = 16
        sink = OtelSink(
            gate,
            resource=Resource.create({}),
            upstream_url=UPSTREAM,
            max_queue_size=bound,
            schedule_delay_ms=10,
        )
        per_record = 3  # the request's span, prefill and decode
        records = 40
        for _ in range(records):
            sink(tool_record(), tool_facts(), None)
            assert sink.queued() <= bound
        assert sink.dropped() > 0
        assert sink.dropped() % per_record == 0  # whole records
        gate.release.set()
        assert sink.flush(timeout_s=10)
        assert sink.exported() + sink.dropped() == records * per_record
        assert gate.spans == sink.exported()
        assert sink.failed() == 0
        assert sink.shutdown(timeout_s=5)

    def test_after_shutdown_records_are_dropped_and_counted(self, memory: Memory) -> None:
        """A record that arrives after shutdown is counted as dropped, not lost silently."""
        sink, exporter = memory
        assert sink.shutdown(timeout_s=5)
        sink(tool_record(), tool_facts(), None)
        assert sink.dropped() == 3
        assert exporter.get_finished_spans() == ()

    def test_sampled_out_spans_never_hold_the_queue(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With ``OTEL_TRACES_SAMPLER=always_off`` nothing is queued, and the queue's count
        does not grow (it would otherwise fill and drop everything once sampling changed)."""
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
        exporter = InMemorySpanExporter()
        sink = OtelSink(exporter, resource=Resource.create({}), upstream_url=UPSTREAM)
        for _ in range(10):
            sink(tool_record(), tool_facts(), None)
        assert (sink.queued(), sink.dropped()) == (0, 0)
        assert sink.shutdown(timeout_s=5)
        assert exporter.get_finished_spans() == ()

    def test_dead_collector_costs_the_sink_nothing(self, refusing_url: str) -> None:
        """A collector whose port refuses connections: 1000 records pass through the sink
        without an exception, well within a generous bound (the export runs in the SDK's
        thread), the drops are counted as the bounded queue fills, the failed exports are
        counted, and shutdown returns within its bound."""
        config = _config(refusing_url, max_queue_size=32, export_timeout_s=0.5)
        sink = otel_sink_for(config)
        assert sink is not None
        started = time.monotonic()
        for _ in range(1000):
            sink(tool_record(), tool_facts(), None)
        elapsed = time.monotonic() - started
        assert elapsed < 20.0, elapsed  # ~0.1 s here; only a blocking export would cost more
        assert sink.dropped() > 0
        assert sink.queued() <= 32
        assert sink.flush(timeout_s=10)
        assert sink.failed() > 0
        assert sink.exported() == 0
        started = time.monotonic()
        sink.shutdown(timeout_s=2)
        assert time.monotonic() - started < 5.0
        assert sink.failed() + sink.dropped() == 3000


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: decodes each ExportTraceServiceRequest it is posted."""

    received: list[tuple[str, ExportTraceServiceRequest]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.received.append((self.path, request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[str, ExportTraceServiceRequest]]]]:
    """A local OTLP/HTTP endpoint and what it received."""
    received: list[tuple[str, ExportTraceServiceRequest]] = []
    handler = type("Handler", (_Receiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def _config(endpoint: str, **otel: object) -> Config:
    return load_config(
        None,
        {
            "otel": {"endpoint": endpoint, **otel},
            "fleet": {"labels": "robot=arm-3,site=lab"},
            "upstream": {"url": UPSTREAM},
        },
    )


class TestWiring:
    def test_spans_reach_an_otlp_endpoint_with_the_fleet_resource(self, receiver: Any) -> None:
        """Through the real OTLP/HTTP exporter: the spans are posted to
        ``{endpoint}/v1/traces`` as protobuf, under one resource carrying the service name and
        the fleet's labels, and counted as exported."""
        url, received = receiver
        sink = otel_sink_for(_config(url))
        assert sink is not None
        sink(tool_record(), tool_facts(), served())
        assert sink.shutdown(timeout_s=10)
        assert [path for path, _ in received] == ["/v1/traces"]
        (resource_spans,) = received[0][1].resource_spans
        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        assert resource["service.name"] == "timing-proxy"
        assert (resource["robot"], resource["site"]) == ("arm-3", "lab")
        names = sorted(s.name for scope in resource_spans.scope_spans for s in scope.spans)
        assert names == ["chat gemma", "decode", "prefill"]
        assert (sink.exported(), sink.failed(), sink.dropped()) == (3, 0, 0)

    def test_off_unless_an_endpoint_is_configured(self) -> None:
        """No ``[otel] endpoint`` and no OTLP variable: no sink. A variable alone turns it
        on; ``OTEL_SDK_DISABLED=true`` turns it off."""
        assert otel_sink_for(Config(), environ={}) is None
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
        assert otel_enabled(OtelConfig(), env)
        assert otel_enabled(OtelConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/x"})
        assert not otel_enabled(OtelConfig(), {**env, "OTEL_SDK_DISABLED": "true"})
        assert otel_enabled(OtelConfig(endpoint="http://collector:4318"), {})

    def test_traces_endpoint(self) -> None:
        """``[otel] endpoint`` is the collector's base URL (``/v1/traces`` is added) or
        already the traces URL; "" leaves the choice to the OTLP variables."""
        assert traces_endpoint("http://c:4318") == "http://c:4318/v1/traces"
        assert traces_endpoint("http://c:4318/") == "http://c:4318/v1/traces"
        assert traces_endpoint("http://c:6006/v1/traces") == "http://c:6006/v1/traces"
        assert traces_endpoint("") is None

    def test_collector_exposes_the_counts(self) -> None:
        """``timing_proxy_otel_spans_total{result}`` reads the sink's three counts."""
        gate = _Gate()
        sink = OtelSink(gate, resource=Resource.create({}), upstream_url=UPSTREAM, max_queue_size=3)
        sink(tool_record(), tool_facts(), None)
        sink(tool_record(), tool_facts(), None)  # the queue holds one record: dropped
        registry = CollectorRegistry()
        registry.register(OtelSpanCollector(sink))

        def value(result: str) -> float | None:
            return registry.get_sample_value("timing_proxy_otel_spans_total", {"result": result})

        assert value("dropped") == sink.dropped() == 3
        gate.release.set()
        assert sink.flush(timeout_s=10)
        assert value("exported") == sink.exported() == 3
        assert value("failed") == 0
        sink.shutdown(timeout_s=5)

    async def test_records_of_the_relay_become_spans(self, fake: Any, make_proxy: Any) -> None:
        """Appended to the app's sinks, the sink turns the relay's own record of a replayed
        llama-server tool stream into a span whose times and attributes are the record's."""
        proxy_factory: ProxyFactory = make_proxy
        upstream, server = fake
        recording = load_recording("tool_stream")
        upstream.script = replay(recording)
        proxy = await proxy_factory(str(server.make_url("")).rstrip("/"))
        exporter = InMemorySpanExporter()
        sink = OtelSink(
            exporter, resource=Resource.create({}), upstream_url=proxy.config.upstream.url
        )
        proxy.app[SINKS].append(sink)
        resp = await proxy.client.post(recording.request_path, data=recording.request_body)
        await resp.read()
        deadline = time.monotonic() + 5
        while not proxy.captured.records:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        record = proxy.captured.last
        assert sink.shutdown(timeout_s=5)
        root = next(s for s in exporter.get_finished_spans() if s.parent is None)
        facts = analyse_request("POST", recording.request_path, recording.request_body)
        assert root.name == (f"chat {facts.model}" if facts.model else "chat")
        assert root.attributes is not None
        assert root.attributes["timing_proxy.id"] == record.id
        assert root.attributes["timing_proxy.kind"] == "tool"
        assert root.attributes["gen_ai.usage.output_tokens"] == record.predicted_n
        assert record.e2e_ms is not None
        assert offset_ms(root.end_time, root.start_time or 0) == pytest.approx(record.e2e_ms)
