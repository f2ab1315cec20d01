"""OpenTelemetry traces, opt-in: one span per finished record, sent over OTLP/HTTP (docs/otel.md).

A record sink. Each record becomes one span named after the GenAI semantic conventions
(``chat gemma-3-270m``), placed on the wall clock (start: the request's arrival, ``ts``; end:
start + ``e2e_ms``), with the conventions' ``gen_ai.*``, ``server.*``, ``http.*`` and
``error.type`` attributes and every non-null record field as ``timing_proxy.<field>``. Two
child spans, ``prefill`` and ``decode``, sit where the dashboard draws them; the first token
and the completed tool call are span events.

The SDK's :class:`~opentelemetry.sdk.trace.export.BatchSpanProcessor` sends the spans from its
own thread, so a slow or unreachable collector never holds the relay. The queue is bounded
(``[otel] max_queue_size`` spans) and admission is decided here, before a span is made: the
sink keeps the count of spans handed to the processor and not yet handed to the exporter,
and a record whose spans do not fit is dropped whole and counted (the SDK would drop the
oldest queued span silently). Export failures are counted per span. ``/metrics`` shows the
three counts through :class:`OtelSpanCollector`.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.config import Config, OtelConfig, parse_labels
from proxy.core.record import Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.tracker import Observation

__all__ = [
    "PROVIDER",
    "OtelSink",
    "OtelSpanCollector",
    "otel_enabled",
    "otel_resource",
    "otel_sink_for",
    "traces_endpoint",
]

PROVIDER = "llama.cpp"
"""``gen_ai.provider.name``: the semantic conventions' registry has no value for llama.cpp, and
they ask for a custom one then."""

_OPERATIONS = {
    "chat_completions": "chat",
    "responses": "chat",
    "messages": "chat",
    "completions": "text_completion",
}
"""The record's ``api`` -> ``gen_ai.operation.name`` (``other`` has none: an HTTP span)."""

_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
"""Where each API takes the output budget (Chat Completions old and new, Responses, native)."""

_ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_BATCH = 512
"""The SDK's default export batch (lowered to the queue's size when that is smaller)."""
_NS = 1_000_000
"""Nanoseconds per millisecond."""
_MAX_ATTRIBUTES = 256
"""The SDK keeps 128 attributes per span by default; a full record has more fields."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

Scalar = str | bool | int | float
Value = Scalar | tuple[Scalar, ...]
Attributes = dict[str, Value]


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


@dataclass(frozen=True, slots=True)
class _Child:
    """A child span or an event, in ms from the request's arrival."""

    name: str
    start_ms: float
    end_ms: float | None = None
    attributes: Attributes = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything one record's spans hold, before any span is made."""

    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: Attributes
    children: tuple[_Child, ...]
    events: tuple[_Child, ...]
    error: str | None


def _start_ns(record: Record) -> int:
    """The request's arrival as epoch ns, from ``ts`` (ISO, ms); when a record has none (a
    log from another harness): now minus its ``e2e_ms``."""
    if record.ts:
        try:
            when = datetime.fromisoformat(record.ts)
        except ValueError:
            pass
        else:
            when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
            return (when - _EPOCH) // _MICROSECOND * 1000
    return time.time_ns() - int((record.e2e_ms or 0.0) * _NS)


def _scalar(value: object) -> Value | None:
    """A record value as an attribute: numbers, strings and bools as they are, a list of one
    such type as an array; anything else (the divergence text, which is prompt text) is
    left out, as are non-finite floats."""
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list) and value:
        types = {type(v) for v in value}
        if len(types) == 1 and types <= {int, str, bool, float}:
            return tuple(value)
    return None


def record_attributes(record: Record) -> Attributes:
    """Every non-null field of the record as ``timing_proxy.<field>``."""
    out: Attributes = {}
    for name, value in record.to_dict().items():
        converted = _scalar(value)
        if converted is not None:
            out[f"timing_proxy.{name}"] = converted
    return out


def _request_parameters(body: Mapping[str, Any] | None) -> Attributes:
    """``gen_ai.request.max_tokens`` and ``temperature``/``top_p`` from the request body."""
    if not body:
        return {}
    out: Attributes = {}
    for key in _MAX_TOKENS_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out["gen_ai.request.max_tokens"] = value
            break
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[f"gen_ai.request.{key}"] = float(value)
    return out


def _gen_ai_attributes(
    operation: str, record: Record, facts: RequestFacts, obs: Observation | None
) -> Attributes:
    """The GenAI semantic conventions' attributes of a model call."""
    candidates: dict[str, Value | None] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": facts.model,
        "gen_ai.response.model": obs.model if obs is not None else None,
        "gen_ai.usage.input_tokens": record.prompt_tokens,
        "gen_ai.usage.output_tokens": record.predicted_n,
        "gen_ai.usage.cache_read.input_tokens": record.cache_n,
        "gen_ai.response.finish_reasons": (record.finish_reason,) if record.finish_reason else None,
    }
    out = _present(candidates)
    out.update(_request_parameters(facts.body))
    return out


def _http_attributes(record: Record, server: tuple[str, int]) -> Attributes:
    candidates: dict[str, Value | None] = {
        "server.address": server[0],
        "server.port": server[1],
        "http.request.method": record.method,
        "url.path": record.path,
        "http.response.status_code": record.status,
    }
    return _present(candidates)


def _prefill_end(record: Record, prefill: float) -> float:
    """Where the prefill ends on the wall clock, as the dashboard's ``geometry()`` puts it:
    at the first token (the earliest of ``ttfb_ms``, ``ttft_ms`` and ``e2e_ms - decode_ms``
    that is not before the prefill itself could have ended)."""
    candidates = [record.ttfb_ms, record.ttft_ms]
    if record.e2e_ms is not None and record.decode_ms is not None:
        candidates.append(record.e2e_ms - record.decode_ms)
    fitting = [c for c in candidates if c is not None and c >= prefill - 0.5]
    return max(min(fitting), prefill) if fitting else prefill


def phases(record: Record) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """The prefill and decode as (start, end) ms from the request's arrival, each None when
    unknown; the dashboard's geometry (llama-server's durations, ended or started at the
    first token on the proxy's clock)."""
    prefill_ms = record.prefill_ms
    decode_ms = record.decode_ms
    anchor: float | None = None
    prefill: tuple[float, float] | None = None
    if prefill_ms is not None and prefill_ms >= 0:
        anchor = _prefill_end(record, prefill_ms)
        prefill = (anchor - prefill_ms, anchor)
    elif record.ttft_ms is not None:
        anchor = record.ttft_ms
    if decode_ms is None and record.decode_wall_ms is not None and record.ttft_ms is not None:
        decode_ms = record.decode_wall_ms
        anchor = record.ttft_ms if anchor is None else anchor
    if anchor is None or decode_ms is None or decode_ms < 0:
        return prefill, None
    return prefill, (anchor, anchor + decode_ms)


def _children(record: Record) -> tuple[_Child, ...]:
    """The prefill and decode child spans (their token counts as ``timing_proxy.*`` only: a
    backend that sums ``gen_ai.usage.*`` over a trace would count them twice)."""
    prefill, decode = phases(record)
    out: list[_Child] = []
    if prefill is not None:
        attrs = {
            "timing_proxy.prompt_n": record.prompt_n,
            "timing_proxy.cache_n": record.cache_n,
            "timing_proxy.prefill_ms": record.prefill_ms,
            "timing_proxy.schema_prefill_ms": record.schema_prefill_ms,
        }
        out.append(_Child("prefill", *prefill, _present(attrs)))
    if decode is not None:
        attrs = {
            "timing_proxy.predicted_n": record.predicted_n,
            "timing_proxy.decode_ms": record.decode_ms,
            "timing_proxy.decode_tok_s": record.decode_tok_s,
        }
        out.append(_Child("decode", *decode, _present(attrs)))
    return tuple(out)


def _present(attrs: Mapping[str, Value | None]) -> Attributes:
    return {k: v for k, v in attrs.items() if v is not None}


def _events(record: Record) -> tuple[_Child, ...]:
    out: list[_Child] = []
    if record.ttft_ms is not None:
        out.append(_Child("first token", record.ttft_ms))
    if record.tool_call_ms is not None and record.tool_calls:
        attrs = {
            "timing_proxy.tool_calls": record.tool_calls,
            "timing_proxy.tool_call_tokens": record.tool_call_tokens,
            "timing_proxy.tool_call_valid": record.tool_call_valid,
        }
        out.append(_Child("tool call complete", record.tool_call_ms, None, _present(attrs)))
    return tuple(out)


def span_name(record: Record, facts: RequestFacts) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}`` for a model call (the operation
    alone without a model); the HTTP method for any other request (its path, which a client
    chooses, stays out of the name to keep names few)."""
    operation = _OPERATIONS.get(record.api or "")
    if operation is None:
        return record.method or "HTTP"
    model = facts.model or record.model
    return f"{operation} {model}" if model else operation


def _plan(
    record: Record,
    facts: RequestFacts,
    obs: Observation | None,
    server: tuple[str, int],
    children: tuple[_Child, ...],
) -> _Plan:
    start = _start_ns(record)
    attributes = _http_attributes(record, server)
    operation = _OPERATIONS.get(record.api or "")
    if operation is not None:
        attributes.update(_gen_ai_attributes(operation, record, facts, obs))
    error = str(record.outcome) if record.outcome is not Outcome.COMPLETED else None
    if error is not None:
        attributes["error.type"] = error
    attributes.update(record_attributes(record))
    return _Plan(
        name=span_name(record, facts),
        kind=SpanKind.CLIENT,
        start_ns=start,
        end_ns=start + int((record.e2e_ms or 0.0) * _NS),
        attributes=attributes,
        children=children,
        events=_events(record),
        error=error,
    )


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
    ) -> None:
        """``schedule_delay_ms``: how long the processor waits to fill a batch (None: the
        SDK's ``OTEL_BSP_SCHEDULE_DELAY`` or 5 s)."""
        self._counts = _Counts()
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
        children = _children(record)
        n = 1 + len(children)
        if self._closed:
            with self._counts.lock:
                self._counts.dropped += n
            return
        if self._counts.admit(n, self._bound):  # before the rest is built: a drop is cheap
            self._emit(_plan(record, facts, obs, self._server, children))

    def _emit(self, plan: _Plan) -> None:
        root = self._tracer.start_span(
            plan.name, kind=plan.kind, attributes=plan.attributes, start_time=plan.start_ns
        )
        if not root.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): nothing is queued
            with self._counts.lock:
                self._counts.accepted -= 1 + len(plan.children)
            return
        if plan.error is not None:
            root.set_status(Status(StatusCode.ERROR, plan.error))
        context = set_span_in_context(root)
        for child in plan.children:
            span = self._tracer.start_span(
                child.name,
                context=context,
                kind=SpanKind.INTERNAL,
                attributes=child.attributes,
                start_time=plan.start_ns + int(child.start_ms * _NS),
            )
            span.end(plan.start_ns + int((child.end_ms or child.start_ms) * _NS))
        for event in plan.events:
            root.add_event(
                event.name, event.attributes, timestamp=plan.start_ns + int(event.start_ms * _NS)
            )
        root.end(plan.end_ns)

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
    )
