"""llama-server's side of a model call as spans (``[otel] server_spans``, off by default).

The GenAI semantic conventions define only the caller's CLIENT span; the open proposals for
server-side GenAI spans put a SERVER span for the model server under it, with the engine's
phases (queue, prefill, decode) as its children, leave token usage to the CLIENT span (a
backend that sums ``gen_ai.usage.*`` over a trace would count it twice), and give the phases'
durations, in seconds, under the ``gen_ai.latency.*`` names that vLLM and SGLang already put on
their spans. This module builds that view from the record: pure, like :mod:`proxy.core.spans`.
"""

from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import http_attributes, server_attributes, url_attributes

from proxy.core.record import Record
from proxy.core.request import RequestFacts
from proxy.core.spans import (
    PROVIDER,
    Attributes,
    PartKind,
    SpanPart,
    Value,
    child_spans,
    operation,
    phases,
    present,
    span_name,
)
from proxy.core.tracker import Observation

__all__ = [
    "LATENCY_DECODE",
    "LATENCY_E2E",
    "LATENCY_FIRST_TOKEN",
    "LATENCY_INFERENCE",
    "LATENCY_PREFILL",
    "LATENCY_QUEUE",
    "server_child_spans",
]

LATENCY_QUEUE = "gen_ai.latency.time_in_queue"
LATENCY_PREFILL = "gen_ai.latency.time_in_model_prefill"
LATENCY_DECODE = "gen_ai.latency.time_in_model_decode"
LATENCY_INFERENCE = "gen_ai.latency.time_in_model_inference"
LATENCY_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
LATENCY_E2E = "gen_ai.latency.e2e"
"""The proposal's latency names (no release of ``opentelemetry-semantic-conventions`` has
them): seconds."""


def _seconds(span: tuple[float, float] | None) -> float | None:
    return (span[1] - span[0]) / 1000.0 if span is not None else None


def _ms_to_s(ms: float | None) -> float | None:
    return ms / 1000.0 if ms is not None else None


def _latencies(
    record: Record,
    queue: tuple[float, float] | None,
    prefill: tuple[float, float] | None,
    decode: tuple[float, float] | None,
) -> Attributes:
    inference = (
        (prefill[1] - prefill[0] + decode[1] - decode[0]) / 1000.0
        if prefill is not None and decode is not None
        else None
    )
    candidates: dict[str, Value | None] = {
        LATENCY_QUEUE: _seconds(queue),
        LATENCY_PREFILL: _seconds(prefill),
        LATENCY_DECODE: _seconds(decode),
        LATENCY_INFERENCE: inference,
        LATENCY_FIRST_TOKEN: _ms_to_s(record.ttft_ms),
        LATENCY_E2E: _ms_to_s(record.e2e_ms),
    }
    return present(candidates)


def _server_attributes(
    name: str, record: Record, facts: RequestFacts, obs: Observation | None, server: tuple[str, int]
) -> Attributes:
    candidates: dict[str, Value | None] = {
        gen_ai.GEN_AI_OPERATION_NAME: name,
        gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
        gen_ai.GEN_AI_REQUEST_MODEL: facts.model,
        gen_ai.GEN_AI_RESPONSE_MODEL: obs.model if obs is not None else None,
        server_attributes.SERVER_ADDRESS: server[0],
        server_attributes.SERVER_PORT: server[1],
        http_attributes.HTTP_REQUEST_METHOD: record.method,
        url_attributes.URL_PATH: record.path,
        http_attributes.HTTP_RESPONSE_STATUS_CODE: record.status,
    }
    return present(candidates)


def server_child_spans(
    record: Record, facts: RequestFacts, obs: Observation | None, *, server: tuple[str, int]
) -> tuple[SpanPart, ...]:
    """The CLIENT span's children with the server view on: one SERVER span (named as the
    CLIENT span, from the request's arrival to the decode's end) holding ``queue`` (from the
    arrival to the prefill's start: the relay, llama-server's wait for a slot and its
    tokenizing, which llama-server does not report apart), ``prefill`` and ``decode``. A
    request that is no model call, or that llama-server did not time, keeps
    :func:`~proxy.core.spans.child_spans` (none then, or the phases it has)."""
    name = operation(record)
    prefill, decode = phases(record)
    if name is None or (prefill is None and decode is None):
        return child_spans(record)
    queue = (0.0, prefill[0]) if prefill is not None and prefill[0] > 0 else None
    children = child_spans(record)
    if queue is not None:
        overhead = present({"timing_proxy.overhead_ms": record.overhead_ms})
        children = (SpanPart("queue", *queue, overhead), *children)
    end = max(part.end_ms or part.start_ms for part in children)
    attributes = _server_attributes(name, record, facts, obs, server)
    attributes.update(_latencies(record, queue, prefill, decode))
    server_span = SpanPart(
        span_name(record, facts), 0.0, end, attributes, PartKind.SERVER, children
    )
    return (server_span,)
