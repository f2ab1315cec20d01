"""The per-request record: the fixed field names and every derived value, computed once.

A :class:`Record` is the single source of truth: the log line, ``/stats``, ``/metrics``,
``report`` and the dashboard are views of records. Unknown values are ``None`` (``null`` in
JSON), never an invented zero.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
from dataclasses import dataclass
from typing import Any

from proxy.core.timings import ServerTimings, valid_count

__all__ = [
    "Kind",
    "Outcome",
    "Record",
    "ServerClock",
    "ServerTimings",
    "derive",
    "ms",
    "ratio",
    "server_clock",
    "valid_count",
]


class Kind(enum.StrEnum):
    """What the request was: a tool call request, a chat request or anything else."""

    TOOL = "tool"
    CHAT = "chat"
    OTHER = "other"


class Outcome(enum.StrEnum):
    """How the exchange ended (a closed set, after HAProxy's termination states)."""

    COMPLETED = "completed"
    CLIENT_CLOSED = "client_closed"
    CLIENT_STALLED = "client_stalled"
    CLIENT_TIMEOUT = "client_timeout"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_CLOSED_MID_STREAM = "upstream_closed_mid_stream"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_IDLE_TIMEOUT = "upstream_idle_timeout"
    REQUEST_TOO_LARGE = "request_too_large"
    BAD_REQUEST = "bad_request"
    SHUTDOWN_ABORTED = "shutdown_aborted"
    PROXY_ERROR = "proxy_error"


def ms(seconds: float | None) -> float | None:
    """Seconds to milliseconds, rounded to the microsecond; ``None`` stays ``None``."""
    return None if seconds is None else round(seconds * 1000.0, 3)


def ratio(num: float | None, den: float | None, scale: float = 1.0) -> float | None:
    """``scale * num / den``, or ``None`` when either is unknown or the divisor is not > 0."""
    if num is None or den is None or den <= 0:
        return None
    value = scale * num / den
    return round(value, 6) if math.isfinite(value) else None


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


@dataclass(frozen=True, slots=True)
class Record:
    """One proxied request. Field names are fixed: the README documents each formula."""

    # identity (the proxy always sets these; a log from another harness may lack them)
    id: str | None
    ts: str | None
    method: str | None
    path: str | None
    model: str | None = None
    stream: bool | None = None
    kind: Kind = Kind.OTHER
    api: str | None = None
    status: int | None = None
    outcome: Outcome = Outcome.COMPLETED
    error: str | None = None
    analysis_error: str | None = None
    # wall clock (ms since the proxy had the request)
    ttfb_ms: float | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    decode_wall_ms: float | None = None
    # llama-server's clock
    prefill_ms: float | None = None
    decode_ms: float | None = None
    prompt_n: int | None = None
    cache_n: int | None = None
    predicted_n: int | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    # derived
    prompt_tokens: int | None = None
    cache_hit_ratio: float | None = None
    overhead_ms: float | None = None
    prefill_share: float | None = None
    # tool calls
    tool_calls: int | None = None
    tool_call_valid: bool | None = None
    tool_call_ms: float | None = None
    tool_call_tokens: int | None = None
    tool_decode_tok_s: float | None = None
    tool_args_tokens: int | None = None
    tool_args_chars: int | None = None
    tool_args_tokens_source: str | None = None
    # setup (proxy/core/setup.py): what the request and the server made of the tools
    max_tokens: int | None = None
    tools_in_prompt: bool | None = None
    tool_call_truncated: bool | None = None
    reasoning_ms: float | None = None
    reasoning_tokens: int | None = None
    reasoning_share: float | None = None
    # tool schemas
    schema_hash: str | None = None
    schema_tools: int | None = None
    schema_tokens: int | None = None
    schema_tokens_source: str | None = None
    schema_cached: bool | None = None
    schema_prefill_ms: float | None = None
    schema_saved_ms: float | None = None
    schema_prefilled_again: bool | None = None
    accounting_error: str | None = None

    prefix_kind: str | None = None
    reusable_tokens: int | None = None
    cache_lost_tokens: int | None = None
    diverged_at: int | None = None
    diverged_section: str | None = None
    diverged_offset: int | None = None
    diverged_cost_ms: float | None = None
    prefill_cause: str | None = None
    prefill_lost_ms: float | None = None
    prefill_lost_tokens: int | None = None
    cache_lost_cause: str | None = None
    cache_lost_ms: float | None = None
    conversation: str | None = None
    turn: int | None = None
    diverged_text: dict[str, str] | None = None
    attribution_error: str | None = None
    # images (exact, from the counting endpoint: with the image parts minus without)
    images: int | None = None
    image_tokens: int | None = None
    image_tokens_each: list[int] | None = None
    images_cached: int | None = None
    image_prefill_ms: float | None = None
    # speculative decoding (llama-server's timings, only when it drafted)
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    draft_acceptance: float | None = None
    # the board during the request (tegrastats, or the upstream's CPU time from /proc)
    energy_mj: float | None = None
    energy_mj_per_token: float | None = None
    power_w_avg: float | None = None
    gpu_busy_pct: float | None = None
    ram_used_mb: float | None = None
    temp_max_c: float | None = None
    upstream_cpu_ms: float | None = None
    telemetry_error: str | None = None
    # roofline (estimates: weights read once per decoded token)
    decode_gbs: float | None = None
    roof_ratio: float | None = None
    # stream facts
    finish_reason: str | None = None
    events: int | None = None
    token_events: int | None = None
    request_bytes: int | None = None
    response_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as a flat JSON-ready mapping (enums as their string values)."""
        out = dict(zip(_NAMES, _values(self), strict=True))
        out["kind"] = str(self.kind)
        out["outcome"] = str(self.outcome)
        return out

    def replace(self, **changes: Any) -> Record:
        """A copy with ``changes``: ``dataclasses.replace`` in half the time (19 → 10 µs;
        a record is replaced two or three times on its way to the sinks). An unknown field
        name raises ``TypeError``, as there."""
        values = list(_values(self))
        for name, value in changes.items():
            index = _INDEX.get(name)
            if index is None:
                raise TypeError(f"Record has no field {name!r}")
            values[index] = value
        return Record(*values)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """Rebuild a record from a log line, ignoring keys that are not fields."""
        kwargs = {k: v for k, v in data.items() if k in _NAME_SET}
        kwargs["kind"] = Kind(kwargs.get("kind", "other"))
        kwargs["outcome"] = Outcome(kwargs.get("outcome", "completed"))
        return cls(**kwargs)


_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record))
"""The record's field names in declaration order (the log line's key order)."""
_NAME_SET = frozenset(_NAMES)
_INDEX = {name: i for i, name in enumerate(_NAMES)}
_values: Any = operator.attrgetter(*_NAMES)
"""All the field values of a record at once, as a tuple in :data:`_NAMES` order."""


@dataclass(frozen=True, slots=True)
class ServerClock:
    """The server-clock fields of a record and everything derived from them: part of the
    base record (:func:`proxy.core.assemble.build_record` places each by name)."""

    prefill_ms: float | None = None
    decode_ms: float | None = None
    prompt_n: int | None = None
    cache_n: int | None = None
    predicted_n: int | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    prompt_tokens: int | None = None
    cache_hit_ratio: float | None = None
    overhead_ms: float | None = None
    prefill_share: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    draft_acceptance: float | None = None


_CLOCK_NAMES = tuple(f.name for f in dataclasses.fields(ServerClock))


def server_clock(timings: ServerTimings | None, ttft_ms: float | None) -> ServerClock:
    """The server-clock fields and everything derived from them.

    ``prefill_tok_s`` and ``decode_tok_s`` use llama-server's own formulas: the first token
    closes the prompt timer, so decode divides by ``predicted_n - 1`` steps.
    """
    t = timings or ServerTimings()
    prompt_tokens = (
        t.prompt_n + t.cache_n if t.prompt_n is not None and t.cache_n is not None else None
    )
    decode_steps = t.predicted_n - 1 if t.predicted_n is not None else None
    total = (
        t.prompt_ms + t.predicted_ms
        if t.prompt_ms is not None and t.predicted_ms is not None
        else None
    )
    return ServerClock(
        prefill_ms=t.prompt_ms,
        decode_ms=t.predicted_ms,
        prompt_n=t.prompt_n,
        cache_n=t.cache_n,
        predicted_n=t.predicted_n,
        prefill_tok_s=ratio(t.prompt_n, t.prompt_ms, 1000.0),
        decode_tok_s=ratio(decode_steps, t.predicted_ms, 1000.0)
        if decode_steps is not None and decode_steps > 0
        else None,
        prompt_tokens=prompt_tokens,
        cache_hit_ratio=ratio(t.cache_n, prompt_tokens),
        overhead_ms=_sub(ttft_ms, t.prompt_ms),
        prefill_share=ratio(t.prompt_ms, total),
        draft_n=t.draft_n,
        draft_n_accepted=t.draft_n_accepted,
        draft_acceptance=ratio(t.draft_n_accepted, t.draft_n),
    )


def derive(timings: ServerTimings | None, ttft_ms: float | None) -> dict[str, Any]:
    """:func:`server_clock` as record keyword arguments (a record built field by field
    elsewhere: ``bench --direct``'s client-side records)."""
    clock = server_clock(timings, ttft_ms)
    return {name: getattr(clock, name) for name in _CLOCK_NAMES}
