"""Setup findings: mistakes in how the server or the agent is set up, as the records show
them, each with a count, the milliseconds involved and a one-line fix. Pure.

- ``tools_never_reach_model``: a tool request whose tools the served template rendered as
  nothing (``schema_tokens`` 0, counted by the server): llama-server answers 200 and the model
  never sees a tool. ``/props`` ``chat_template_caps`` says so before any request.
- ``tool_call_truncated``: the turn ended by length while a call's arguments were open or
  not valid JSON.
- ``thinking_before_call``: reasoning streamed before the first tool-call delta.
- ``no_max_tokens``: a tool request without a token limit; the longest such generation seen.
- ``tool_decode_slower``: per model, tool calls decode slower than chat on the server's own
  clock (p50 against p50), by more than the spread of either.

The cache findings of the prefix attribution (:mod:`proxy.core.findings`) share the list of
``/stats`` ``findings`` with these, told apart by ``category``.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.record import Kind, Outcome, Record, valid_count

__all__ = [
    "DECODE_MIN_SAMPLES",
    "DECODE_SAMPLES",
    "SETUP_FIXES",
    "SetupCause",
    "SetupFindings",
    "TemplateCaps",
    "decode_gap",
    "request_limit",
    "tools_counted",
    "tools_in_prompt",
]

DECODE_SAMPLES = 200
"""Decode rates kept per model and kind for the tool-vs-chat comparison (the latest)."""
DECODE_MIN_SAMPLES = 5
"""Fewer tool or chat rates than this per model: no comparison."""
LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
"""Where each API puts the token limit: Chat Completions (both names), Messages, Responses,
llama-server's native ``/completion``."""


class SetupCause(enum.StrEnum):
    """A setup finding (the ``cause`` of a ``/stats`` finding of category ``setup``)."""

    TOOLS_NEVER_REACH_MODEL = "tools_never_reach_model"
    TOOL_CALL_TRUNCATED = "tool_call_truncated"
    THINKING_BEFORE_CALL = "thinking_before_call"
    NO_MAX_TOKENS = "no_max_tokens"
    TOOL_DECODE_SLOWER = "tool_decode_slower"


SETUP_FIXES: dict[SetupCause, str] = {
    SetupCause.TOOLS_NEVER_REACH_MODEL: "the served chat template renders no tools "
    "(/props chat_template_caps.supports_tools is false): start llama-server with --jinja and "
    "the model's own tool-capable template, or --chat-template-file with one",
    SetupCause.TOOL_CALL_TRUNCATED: "the turn hit its token limit inside the tool call: "
    "raise max_tokens",
    SetupCause.THINKING_BEFORE_CALL: "the model reasons before calling the tool: send "
    'chat_template_kwargs {"enable_thinking": false} (Chat Completions), or a lower '
    "reasoning_effort (Responses), if the call does not need it",
    SetupCause.NO_MAX_TOKENS: "tool requests without max_tokens can generate until the "
    "context is full: set max_tokens a little above the longest call",
    SetupCause.TOOL_DECODE_SLOWER: "tool calls decode slower than chat on the server's own "
    "clock: run `timing-proxy explain` to measure whether the tool path or the tokens cost it",
}


@dataclass(frozen=True, slots=True)
class TemplateCaps:
    """What llama-server's ``/props`` says of the served chat template."""

    supports_tools: bool | None = None
    supports_tool_calls: bool | None = None
    model: str | None = None

    @classmethod
    def from_props(cls, props: Any) -> TemplateCaps:
        """Read ``chat_template_caps`` and the model's path or alias from a ``/props``
        answer; unknown values stay ``None``."""
        if not isinstance(props, dict):
            return cls()
        caps = props.get("chat_template_caps")
        caps = caps if isinstance(caps, dict) else {}

        def flag(name: str) -> bool | None:
            value = caps.get(name)
            return value if isinstance(value, bool) else None

        model = props.get("model_alias") or props.get("model_path")
        return cls(
            supports_tools=flag("supports_tools"),
            supports_tool_calls=flag("supports_tool_calls"),
            model=model if isinstance(model, str) else None,
        )

    @property
    def drops_tools(self) -> bool:
        """The template has no tool support: requests' tools never reach the model."""
        return self.supports_tools is False or self.supports_tool_calls is False


def request_limit(body: Mapping[str, Any] | None) -> int | None:
    """The request's token limit under any API's name; ``None`` when it sets none (``-1``,
    llama-server's "no limit" for ``n_predict``, counts as none)."""
    if body is None:
        return None
    for key in LIMIT_KEYS:
        value = valid_count(body.get(key))
        if value is not None:
            return value
    return None


def tools_in_prompt(record: Record) -> bool | None:
    """Whether a tool request's tools were in the prompt: its exact (server-counted)
    ``schema_tokens`` above 0; ``None`` when not a tool request or not counted exactly."""
    return tools_counted(record.kind, record.schema_tokens_source, record.schema_tokens)


def tools_counted(kind: Kind, source: str | None, schema_tokens: int | None) -> bool | None:
    """:func:`tools_in_prompt` from a request's kind and its schema's count and source."""
    if kind is not Kind.TOOL or source != "server" or schema_tokens is None:
        return None
    return schema_tokens > 0


def decode_gap(tool: Sequence[float], chat: Sequence[float]) -> dict[str, float] | None:
    """Median tool and chat decode rates, their gap, and the spread it is weighed against
    (the larger interquartile range of the two); ``None`` with too few rates of either."""
    if len(tool) < DECODE_MIN_SAMPLES or len(chat) < DECODE_MIN_SAMPLES:
        return None
    t, c = sorted(tool), sorted(chat)
    gap = _quantile(c, 0.5) - _quantile(t, 0.5)
    spread = max(_quantile(t, 0.75) - _quantile(t, 0.25), _quantile(c, 0.75) - _quantile(c, 0.25))
    return {
        "tool_decode_tok_s": round(_quantile(t, 0.5), 3),
        "chat_decode_tok_s": round(_quantile(c, 0.5), 3),
        "gap_tok_s": round(gap, 3),
        "spread_tok_s": round(spread, 3),
    }


def _quantile(ordered: Sequence[float], q: float) -> float:
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(slots=True)
class _Tally:
    requests: int = 0
    tokens: int = 0
    ms: float = 0.0
    longest_tokens: int | None = None


@dataclass(slots=True)
class SetupFindings:
    """Setup findings by cause and model, from each finished record. Bounded: at most
    ``models`` models are tracked (more fold into ``other``)."""

    models: int = 16
    _tallies: dict[tuple[SetupCause, str], _Tally] = field(default_factory=dict)
    _rates: dict[tuple[str, Kind], deque[float]] = field(default_factory=dict)
    _known: set[str] = field(default_factory=set)
    template_drops_tools: dict[str, bool] = field(default_factory=dict)
    """Per model, what ``/props`` said of the template at start or when the model changed."""

    def _model(self, name: str | None) -> str:
        model = name or "unknown"
        if model not in self._known:
            if len(self._known) >= self.models:
                return "other"
            self._known.add(model)
        return model

    def add(self, record: Record, limit_known: bool = True) -> list[tuple[SetupCause, str]]:
        """Count one finished record; returns the (cause, model) pairs seen for the first
        time (to be logged once each). ``limit_known`` is false when the request body was
        not read (or a log line lacks ``max_tokens``): its ``null`` is then no finding."""
        if record.kind is Kind.OTHER or record.outcome is not Outcome.COMPLETED:
            return []
        model = self._model(record.model)
        self._keep_rate(record, model)
        new = []
        for cause, tokens, ms in _causes(record, limit_known):
            key = (cause, model)
            tally = self._tallies.get(key)
            if tally is None:
                tally = self._tallies[key] = _Tally()
                new.append(key)
            tally.requests += 1
            tally.tokens += tokens or 0
            tally.ms += ms or 0.0
            if tokens is not None and (tally.longest_tokens or 0) < tokens:
                tally.longest_tokens = tokens
        return new

    def _keep_rate(self, record: Record, model: str) -> None:
        if record.decode_tok_s is None:
            return
        key = (model, record.kind)
        rates = self._rates.get(key)
        if rates is None:
            rates = self._rates[key] = deque(maxlen=DECODE_SAMPLES)
        rates.append(record.decode_tok_s)

    def findings(self) -> list[dict[str, Any]]:
        """The ``/stats`` ``findings`` entries of category ``setup``, most ms first."""
        out = [
            _entry(cause, model, t.requests, t.tokens, t.ms, {"longest_tokens": t.longest_tokens})
            for (cause, model), t in self._tallies.items()
        ]
        for model in sorted(self._known):
            gap = decode_gap(
                self._rates.get((model, Kind.TOOL), ()), self._rates.get((model, Kind.CHAT), ())
            )
            if gap is not None and gap["gap_tok_s"] > gap["spread_tok_s"]:
                requests = len(self._rates[(model, Kind.TOOL)])
                out.append(_entry(SetupCause.TOOL_DECODE_SLOWER, model, requests, 0, 0.0, gap))
        return sorted(out, key=lambda f: (-f["ms"], -f["requests"], f["cause"], f["model"]))


def _entry(
    cause: SetupCause, model: str, requests: int, tokens: int, ms: float, detail: dict[str, Any]
) -> dict[str, Any]:
    return {
        "category": "setup",
        "cause": str(cause),
        "model": model,
        "requests": requests,
        "tokens": tokens,
        "ms": round(ms, 3),
        "detail": detail,
        "fix": SETUP_FIXES[cause],
    }


def _causes(record: Record, limit_known: bool) -> list[tuple[SetupCause, int | None, float | None]]:
    """The setup causes one completed chat or tool record shows, with the tokens and the
    milliseconds involved."""
    found: list[tuple[SetupCause, int | None, float | None]] = []
    if record.tools_in_prompt is False:
        found.append((SetupCause.TOOLS_NEVER_REACH_MODEL, record.predicted_n, record.e2e_ms))
    if record.tool_call_truncated:
        found.append((SetupCause.TOOL_CALL_TRUNCATED, record.predicted_n, record.e2e_ms))
    if record.reasoning_ms is not None and record.kind is Kind.TOOL and record.tool_calls:
        found.append(
            (SetupCause.THINKING_BEFORE_CALL, record.reasoning_tokens, record.reasoning_ms)
        )
    if record.kind is Kind.TOOL and record.max_tokens is None and limit_known:
        found.append((SetupCause.NO_MAX_TOKENS, record.predicted_n, record.decode_ms))
    return found
