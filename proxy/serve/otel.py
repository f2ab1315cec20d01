"""OpenTelemetry traces, opt-in: each finished record's spans, sent over OTLP/HTTP (docs/otel.md).

A record sink. What a record's spans hold is :mod:`proxy.core.spans`; here they are made with
the SDK and queued. The SDK's :class:`~opentelemetry.sdk.trace.export.BatchSpanProcessor`
sends them from its own thread, so a slow or unreachable collector never holds the relay.
The queue is bounded (``[otel] max_queue_size`` spans) and admission is decided here, before
a span is made: the sink keeps the count of spans handed to the processor and not yet handed
to the exporter, and a record whose spans do not fit is dropped whole and counted (the SDK
would drop the oldest queued span silently). Export failures are counted per span.
``/metrics`` shows the three counts through :class:`OtelSpanCollector`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.config import Config, OtelConfig, parse_labels
from proxy.core.record import Record
from proxy.core.request import RequestFacts
from proxy.core.server_spans import server_child_spans
from proxy.core.spans import (
    NS_PER_MS,
    PROVIDER,
    PartKind,
    SpanPart,
    SpanPlan,
    child_spans,
    phases,
    span_count,
    span_plan,
)
from proxy.core.tracker import Observation

__all__ = [
    "PROVIDER",
    "OtelSink",
    "OtelSpanCollector",
    "otel_enabled",
    "otel_resource",
    "otel_sink_for",
    "phases",
    "traces_endpoint",
]

_ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_BATCH = 512
"""The SDK's default export batch (lowered to the queue's size when that is smaller)."""
_MAX_ATTRIBUTES = 256
"""The SDK keeps 128 attributes per span by default; a full record has more fields."""
_KINDS = {PartKind.INTERNAL: SpanKind.INTERNAL, PartKind.SERVER: SpanKind.SERVER}


def otel_enabled(config: OtelConfig, environ: Mapping[str, str] = os.environ) -> bool:
    """Traces are on when ``[otel] endpoint`` or an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variable is
    set, and ``OTEL_SDK_DISABLED`` is not ``true``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(config.endpoint) or any(environ.get(name, "").strip() for name in _ENV_ENDPOINTS)


def traces_endpoint(endpoint: str) -> str | None:
    """The OTLP/HTTP traces URL for ``[otel] endpoint`` (the collector's base URL, or already
    its ``/v1/traces``); None for "": the exporter then reads the standard variables."""
    if not endpoint:
        return None
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


def _version() -> str:
    try:
        return metadata.version("timing-proxy")
    except metadata.PackageNotFoundError:
        return "unknown"


def otel_resource(service_name: str, labels: Mapping[str, str]) -> Resource:
    """``service.name``, ``service.version`` and the fleet's labels (as they are named in
    ``[fleet] labels``, so ``robot`` on a span matches ``robot`` on a metric); whatever
    ``OTEL_RESOURCE_ATTRIBUTES`` adds is kept, the values given here win."""
    return Resource.create(
        {"service.name": service_name, "service.version": _version(), **dict(labels)}
    )


@dataclass(slots=True)
class _Counts:
    """Span counts, shared by the sink (the event loop's thread) and the exporter (the
    processor's thread)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: int = 0
    submitted: int = 0
    exported: int = 0
    failed: int = 0
    dropped: int = 0

    def admit(self, n: int, bound: int) -> bool:
        """Take ``n`` spans into the queue if they fit under ``bound``; else count them
        dropped."""
        with self.lock:
            if self.accepted - self.submitted + n > bound:
                self.dropped += n
                return False
            self.accepted += n
            return True


class _CountingExporter(SpanExporter):
    """The real exporter, counting what it was handed and how each batch ended."""

    def __init__(self, inner: SpanExporter, counts: _Counts) -> None:
        self._inner = inner
        self._counts = counts

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        n = len(spans)
        with self._counts.lock:
            self._counts.submitted += n
        try:
            result = self._inner.export(spans)
        except Exception:  # an exporter must not kill the processor's thread
            result = SpanExportResult.FAILURE
        with self._counts.lock:
            if result is SpanExportResult.SUCCESS:
                self._counts.exported += n
            else:
                self._counts.failed += n
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _server(upstream_url: str) -> tuple[str, int]:
    parts = urlsplit(upstream_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


class OtelSink:
    """The record sink that turns each record into spans and queues them for the exporter.

    ``dropped()``: spans not queued because the queue was full (or the sink shut down), plus
    those still queued at shutdown; ``failed()``: spans whose export failed (the collector
    down, slow past ``export_timeout_s``, or refusing them); ``exported()``: spans the
    collector took.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        resource: Resource,
        upstream_url: str,
        max_queue_size: int = 2048,
        export_timeout_s: float = 5.0,
        schedule_delay_ms: float | None = None,
        server_spans: bool = False,
    ) -> None:
        """``schedule_delay_ms``: how long the processor waits to fill a batch (None: the
        SDK's ``OTEL_BSP_SCHEDULE_DELAY`` or 5 s); ``server_spans``: llama-server's side as a
        SERVER span with queue, prefill and decode children (:mod:`proxy.core.server_spans`)."""
        self._counts = _Counts()
        self._server_spans = server_spans
        self._bound = max_queue_size
        self._timeout_s = export_timeout_s
        self._server = _server(upstream_url)
        self._closed = False
        self._processor = BatchSpanProcessor(
            _CountingExporter(exporter, self._counts),
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_ms,
            max_export_batch_size=min(_BATCH, max_queue_size),
            export_timeout_millis=export_timeout_s * 1000,
        )
        self._provider = TracerProvider(
            resource=resource,
            span_limits=SpanLimits(max_span_attributes=_MAX_ATTRIBUTES),
            shutdown_on_exit=False,  # shutdown() is bounded; an exit hook would wait 30 s
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("timing_proxy", _version())

    def __call__(self, record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        children = (
            server_child_spans(record, facts, obs, server=self._server)
            if self._server_spans
            else child_spans(record)
        )
        n = 1 + span_count(children)
        if self._closed:
            with self._counts.lock:
                self._counts.dropped += n
            return
        if self._counts.admit(n, self._bound):  # before the rest is built: a drop is cheap
            plan = span_plan(
                record, facts, obs, server=self._server, children=children, now_ns=time.time_ns
            )
            self._emit(plan)

    def _emit(self, plan: SpanPlan) -> None:
        root = self._tracer.start_span(
            plan.name, kind=SpanKind.CLIENT, attributes=plan.attributes, start_time=plan.start_ns
        )
        if not root.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): nothing is queued
            with self._counts.lock:
                self._counts.accepted -= 1 + span_count(plan.children)
            return
        if plan.error is not None:
            root.set_status(Status(StatusCode.ERROR, plan.error))
        self._emit_children(plan.children, root, plan.start_ns)
        for event in plan.events:
            root.add_event(
                event.name,
                event.attributes,
                timestamp=plan.start_ns + int(event.start_ms * NS_PER_MS),
            )
        root.end(plan.end_ns)

    def _emit_children(self, parts: tuple[SpanPart, ...], parent: Span, start_ns: int) -> None:
        """Each part as a span under ``parent``, its own children under it."""
        context = set_span_in_context(parent)
        for part in parts:
            span = self._tracer.start_span(
                part.name,
                context=context,
                kind=_KINDS[part.kind],
                attributes=part.attributes,
                start_time=start_ns + int(part.start_ms * NS_PER_MS),
            )
            self._emit_children(part.children, span, start_ns)
            span.end(start_ns + int((part.end_ms or part.start_ms) * NS_PER_MS))

    def dropped(self) -> int:
        """Spans that never reached the exporter (queue full, shut down)."""
        return self._counts.dropped

    def failed(self) -> int:
        """Spans whose export failed."""
        return self._counts.failed

    def exported(self) -> int:
        """Spans the collector accepted."""
        return self._counts.exported

    def queued(self) -> int:
        """Spans queued and not yet handed to the exporter."""
        with self._counts.lock:
            return self._counts.accepted - self._counts.submitted

    def flush(self, timeout_s: float | None = None) -> bool:
        """Export what is queued now; False when that took longer than the bound
        (``export_timeout_s`` unless given). Blocks the caller: not on the event loop."""
        return _bounded(self._processor.force_flush, timeout_s or self._timeout_s)

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Stop taking records, export what is queued within the bound (``export_timeout_s``
        unless given) and count what is left as dropped. True when it all finished in time.
        Blocks the caller up to the bound: from the event loop, ``await aclose()``."""
        if self._closed:
            return True
        self._closed = True
        done = _bounded(self._provider.shutdown, timeout_s or self._timeout_s)
        with self._counts.lock:
            self._counts.dropped += self._counts.accepted - self._counts.submitted
            self._counts.accepted = self._counts.submitted
        return done

    async def aclose(self, timeout_s: float | None = None) -> bool:
        """:meth:`shutdown` in a thread, for the app's cleanup."""
        return await asyncio.to_thread(self.shutdown, timeout_s)


def _bounded(call: Callable[[], object], timeout_s: float) -> bool:
    """Run ``call`` in a daemon thread; wait for it at most ``timeout_s``. True if it ended."""
    thread = threading.Thread(target=call, name="timing-proxy-otel", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return not thread.is_alive()


class OtelSpanCollector(Collector):
    """``timing_proxy_otel_spans_total{result="exported|failed|dropped"}`` for a registry."""

    def __init__(self, sink: OtelSink) -> None:
        self._sink = sink

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "timing_proxy_otel_spans",
            "Spans by what became of them: exported (the collector took them), failed (the "
            "export failed: collector down, slow or refusing), dropped (the bounded queue was "
            "full, or they were still queued at shutdown).",
            labels=["result"],
        )
        family.add_metric(["exported"], self._sink.exported())
        family.add_metric(["failed"], self._sink.failed())
        family.add_metric(["dropped"], self._sink.dropped())
        yield family


def otel_sink_for(config: Config, environ: Mapping[str, str] = os.environ) -> OtelSink | None:
    """The sink ``[otel]`` asks for (OTLP/HTTP protobuf); None when traces are off."""
    otel = config.otel
    if not otel_enabled(otel, environ):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(
        endpoint=traces_endpoint(otel.endpoint), timeout=otel.export_timeout_s
    )
    return OtelSink(
        exporter,
        resource=otel_resource(otel.service_name, parse_labels(config.fleet.labels)),
        upstream_url=config.upstream.url,
        max_queue_size=otel.max_queue_size,
        export_timeout_s=otel.export_timeout_s,
        server_spans=otel.server_spans,
    )
