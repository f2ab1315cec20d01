"""A record as OpenTelemetry spans, before any span is made: names, attributes, children, events.

Pure: the span follows the GenAI semantic conventions (``gen_ai.*``, ``server.*``, ``http.*``,
``error.type``; the names are the ``opentelemetry-semantic-conventions`` package's constants)
plus every non-null record field as ``timing_proxy.<field>``; the prefill and decode children
sit where the dashboard draws them. ``proxy.serve.otel`` turns a :class:`SpanPlan` into SDK
spans.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import (
    error_attributes,
    http_attributes,
    server_attributes,
    url_attributes,
)

from proxy.core.record import Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.tracker import Observation

__all__ = [
    "GEN_AI_USAGE_IMAGE_INPUT_TOKENS",
    "NS_PER_MS",
    "PROVIDER",
    "Attributes",
    "PartKind",
    "SpanPart",
    "SpanPlan",
    "child_spans",
    "operation",
    "phases",
    "present",
    "record_attributes",
    "span_count",
    "span_name",
    "span_plan",
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

GEN_AI_USAGE_IMAGE_INPUT_TOKENS = "gen_ai.usage.image.input_tokens"
"""The conventions' per-modality input count for images: no release of
``opentelemetry-semantic-conventions`` has a constant for it; OpenTelemetry's own GenAI utils
(``opentelemetry-util-genai``) emit this name."""

_SAMPLING = (
    ("temperature", gen_ai.GEN_AI_REQUEST_TEMPERATURE),
    ("top_p", gen_ai.GEN_AI_REQUEST_TOP_P),
)

NS_PER_MS = 1_000_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

Scalar = str | bool | int | float
Value = Scalar | tuple[Scalar, ...]
Attributes = dict[str, Value]


class PartKind(enum.StrEnum):
    """A child span's kind: ``internal`` (a phase) or ``server`` (llama-server's side)."""

    INTERNAL = "internal"
    SERVER = "server"


@dataclass(frozen=True, slots=True)
class SpanPart:
    """A child span (``end_ms`` set) or an event, in ms from the request's arrival; a child
    span may have children of its own."""

    name: str
    start_ms: float
    end_ms: float | None = None
    attributes: Attributes = field(default_factory=dict)
    kind: PartKind = PartKind.INTERNAL
    children: tuple[SpanPart, ...] = ()


def span_count(parts: Iterable[SpanPart]) -> int:
    """How many spans ``parts`` are, their children's children included."""
    return sum(1 + span_count(part.children) for part in parts)


@dataclass(frozen=True, slots=True)
class SpanPlan:
    """Everything one record's spans hold: the root span (kind ``CLIENT``), its children
    and events; ``error`` is the outcome when the request did not complete."""

    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes
    children: tuple[SpanPart, ...]
    events: tuple[SpanPart, ...]
    error: str | None


def _start_ns(record: Record, now_ns: Callable[[], int]) -> int:
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
    return now_ns() - int((record.e2e_ms or 0.0) * NS_PER_MS)


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


def present(attrs: Mapping[str, Value | None]) -> Attributes:
    """The attributes that have a value."""
    return {k: v for k, v in attrs.items() if v is not None}


def _seconds(ms: float | None) -> float | None:
    return ms / 1000.0 if ms is not None else None


def _request_parameters(body: Mapping[str, Any] | None) -> Attributes:
    """``gen_ai.request.max_tokens`` and ``temperature``/``top_p`` from the request body."""
    if not body:
        return {}
    out: Attributes = {}
    for key in _MAX_TOKENS_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] = value
            break
    for key, name in _SAMPLING:
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def _gen_ai_attributes(
    operation: str, record: Record, facts: RequestFacts, obs: Observation | None
) -> Attributes:
    """The GenAI semantic conventions' attributes of a model call: each one the record has
    (the time to the first chunk for a streamed response only, as the conventions ask)."""
    candidates: dict[str, Value | None] = {
        gen_ai.GEN_AI_OPERATION_NAME: operation,
        gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
        gen_ai.GEN_AI_REQUEST_MODEL: facts.model,
        gen_ai.GEN_AI_REQUEST_STREAM: record.stream,
        gen_ai.GEN_AI_RESPONSE_MODEL: obs.model if obs is not None else None,
        gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: _seconds(record.ttft_ms)
        if record.stream
        else None,
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: record.prompt_tokens,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: record.predicted_n,
        gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: record.cache_n,
        gen_ai.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: record.reasoning_tokens,
        GEN_AI_USAGE_IMAGE_INPUT_TOKENS: record.image_tokens,
        gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: (record.finish_reason,)
        if record.finish_reason
        else None,
    }
    out = present(candidates)
    out.update(_request_parameters(facts.body))
    return out


def _http_attributes(record: Record, server: tuple[str, int]) -> Attributes:
    candidates: dict[str, Value | None] = {
        server_attributes.SERVER_ADDRESS: server[0],
        server_attributes.SERVER_PORT: server[1],
        http_attributes.HTTP_REQUEST_METHOD: record.method,
        url_attributes.URL_PATH: record.path,
        http_attributes.HTTP_RESPONSE_STATUS_CODE: record.status,
    }
    return present(candidates)


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


def child_spans(record: Record) -> tuple[SpanPart, ...]:
    """The prefill and decode child spans (their token counts as ``timing_proxy.*`` only: a
    backend that sums ``gen_ai.usage.*`` over a trace would count them twice)."""
    prefill, decode = phases(record)
    out: list[SpanPart] = []
    if prefill is not None:
        attrs = {
            "timing_proxy.prompt_n": record.prompt_n,
            "timing_proxy.cache_n": record.cache_n,
            "timing_proxy.prefill_ms": record.prefill_ms,
            "timing_proxy.schema_prefill_ms": record.schema_prefill_ms,
        }
        out.append(SpanPart("prefill", *prefill, present(attrs)))
    if decode is not None:
        attrs = {
            "timing_proxy.predicted_n": record.predicted_n,
            "timing_proxy.decode_ms": record.decode_ms,
            "timing_proxy.decode_tok_s": record.decode_tok_s,
        }
        out.append(SpanPart("decode", *decode, present(attrs)))
    return tuple(out)


def _events(record: Record) -> tuple[SpanPart, ...]:
    out: list[SpanPart] = []
    if record.ttft_ms is not None:
        out.append(SpanPart("first token", record.ttft_ms))
    if record.tool_call_ms is not None and record.tool_calls:
        attrs = {
            "timing_proxy.tool_calls": record.tool_calls,
            "timing_proxy.tool_call_tokens": record.tool_call_tokens,
            "timing_proxy.tool_call_valid": record.tool_call_valid,
        }
        out.append(SpanPart("tool call complete", record.tool_call_ms, None, present(attrs)))
    return tuple(out)


def operation(record: Record) -> str | None:
    """``gen_ai.operation.name`` of the record's call; None for a request that is no model
    call."""
    return _OPERATIONS.get(record.api or "")


def span_name(record: Record, facts: RequestFacts) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}`` for a model call (the operation
    alone without a model); the HTTP method for any other request (its path, which a client
    chooses, stays out of the name to keep names few)."""
    name = operation(record)
    if name is None:
        return record.method or "HTTP"
    model = facts.model or record.model
    return f"{name} {model}" if model else name


def span_plan(
    record: Record,
    facts: RequestFacts,
    obs: Observation | None,
    *,
    server: tuple[str, int],
    children: tuple[SpanPart, ...],
    now_ns: Callable[[], int],
) -> SpanPlan:
    """The record's spans: ``server`` is the upstream's host and port, ``children`` its
    :func:`child_spans`, ``now_ns`` the wall clock (epoch ns) for a record without ``ts``."""
    start = _start_ns(record, now_ns)
    attributes = _http_attributes(record, server)
    name = operation(record)
    if name is not None:
        attributes.update(_gen_ai_attributes(name, record, facts, obs))
    error = str(record.outcome) if record.outcome is not Outcome.COMPLETED else None
    if error is not None:
        attributes[error_attributes.ERROR_TYPE] = error
    attributes.update(record_attributes(record))
    return SpanPlan(
        name=span_name(record, facts),
        start_ns=start,
        end_ns=start + int((record.e2e_ms or 0.0) * NS_PER_MS),
        attributes=attributes,
        children=children,
        events=_events(record),
        error=error,
    )
