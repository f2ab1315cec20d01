"""The base record: a :class:`~proxy.core.record.Record` assembled from what the relay saw
of an exchange. Pure.

The base owns every field no partial owns (:mod:`proxy.core.partials`): the exchange's
identity and outcome, the wall clock, the server's clock (:func:`~proxy.core.record.server_clock`),
the tool calls and the stream's facts. What accounting, attribution, telemetry and the model's
metadata add later joins it through :func:`proxy.core.partials.assemble`.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from proxy.core.record import Kind, Outcome, Record, ms, ratio, server_clock
from proxy.core.request import RequestFacts
from proxy.core.setup import request_limit
from proxy.core.timings import plausible
from proxy.core.tracker import Observation, ToolCall

__all__ = ["Exchange", "build_record", "finish_reason", "outcome_of", "tool_calls_valid"]


@dataclass(frozen=True, slots=True)
class Exchange:
    """The relay's facts about one exchange, besides the observation of the body."""

    id: str
    ts: str
    method: str
    path: str
    status: int | None
    outcome: Outcome
    end_s: float
    request_bytes: int
    error: str | None = None


def tool_calls_valid(calls: tuple[ToolCall, ...], names: frozenset[str]) -> bool | None:
    """Every call names one of the request's tools and its arguments are a JSON object.

    ``None`` when there was no call.
    """
    if not calls:
        return None
    for call in calls:
        if call.name not in names:
            return False
        try:
            args = orjson.loads(call.arguments)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(args, dict):
            return False
    return True


def outcome_of(ex: Exchange) -> Outcome:
    """The relay's outcome, except that a response relayed whole with an HTTP error status
    (llama-server's 4xx/5xx) is ``upstream_error``, not a completed request: its few
    milliseconds are no latency of a real answer."""
    if ex.outcome is Outcome.COMPLETED and ex.status is not None and ex.status >= 400:
        return Outcome.UPSTREAM_ERROR
    return ex.outcome


def _span(first: float | None, last: float | None) -> float | None:
    """``last - first``, or None when either is unknown."""
    return None if first is None or last is None else last - first


def finish_reason(facts: RequestFacts, stated: str | None, output: int | None) -> str | None:
    """The turn's finish reason: the one the response stated, or ``length`` when its output
    count reached the request's token limit and the response stated none, or stated one
    that is not its server's word on a cut (the dialect's ``states_limit``: llama-server's
    Responses API says ``completed`` after a cut)."""
    if stated == "length" or output is None:
        return stated
    limit = request_limit(facts.body)
    if limit is None or output < limit:
        return stated
    return "length" if stated is None or not facts.dialect.states_limit else stated


def _truncated(
    facts: RequestFacts, o: Observation, finish: str | None, valid: bool | None
) -> bool | None:
    """A tool turn ended by its token limit inside a call: its arguments open or not valid
    JSON, or the body says so otherwise (``call_cut``); ``False`` for a tool turn that did
    not; ``None`` for any other request."""
    if facts.kind is not Kind.TOOL:
        return None
    return finish == "length" and bool(o.tool_calls) and (valid is not True or o.call_cut)


def build_record(ex: Exchange, facts: RequestFacts, obs: Observation | None) -> Record:
    """The base record of one exchange (every partial's fields ``None``). ``obs`` is
    ``None`` when no response body was seen."""
    o = obs or Observation()
    ttft_ms = ms(o.first_token_s)
    decode_wall = (
        o.last_token_s - o.first_token_s
        if o.first_token_s is not None and o.last_token_s is not None
        else None
    )
    timings = plausible(o.timings)
    clock = server_clock(timings, ttft_ms)
    finish = finish_reason(facts, o.finish_reason, clock.predicted_n)
    tool_tokens = clock.predicted_n if o.tool_calls and finish == "tool_calls" else None
    call_span = (
        o.tool_call_s - o.first_event_s
        if o.tool_call_s is not None and o.first_event_s is not None and facts.stream
        else None
    )
    counted = obs is not None and obs.analysed
    recognised = counted and o.recognised
    valid = None if o.arguments_dropped else tool_calls_valid(o.tool_calls, facts.tool_names)
    analysis_error = facts.error or o.analysis_error
    if timings is not None and timings.implausible and analysis_error is None:
        analysis_error = "implausible_timings:" + ",".join(timings.implausible)
    if o.oversized_events and analysis_error is None:
        analysis_error = f"oversized_events:{o.oversized_events}"
    return Record(
        id=ex.id,
        ts=ex.ts,
        method=ex.method,
        path=ex.path,
        model=o.model or facts.model,
        stream=facts.stream,
        kind=facts.kind,
        api=facts.api,
        status=ex.status,
        outcome=outcome_of(ex),
        error=o.upstream_error or ex.error,
        analysis_error=analysis_error,
        ttfb_ms=ms(o.first_byte_s),
        ttft_ms=ttft_ms,
        e2e_ms=ms(ex.end_s),
        decode_wall_ms=ms(decode_wall),
        prefill_ms=clock.prefill_ms,
        decode_ms=clock.decode_ms,
        prompt_n=clock.prompt_n,
        cache_n=clock.cache_n,
        predicted_n=clock.predicted_n,
        prefill_tok_s=clock.prefill_tok_s,
        decode_tok_s=clock.decode_tok_s,
        prompt_tokens=clock.prompt_tokens,
        cache_hit_ratio=clock.cache_hit_ratio,
        overhead_ms=clock.overhead_ms,
        prefill_share=clock.prefill_share,
        draft_n=clock.draft_n,
        draft_n_accepted=clock.draft_n_accepted,
        draft_acceptance=clock.draft_acceptance,
        tool_calls=len(o.tool_calls) if recognised else None,
        tool_call_valid=valid,
        tool_call_ms=ms(o.tool_call_s) if o.tool_calls else None,
        tool_call_tokens=tool_tokens,
        tool_args_chars=sum(len(c.arguments) for c in o.tool_calls)
        if o.tool_calls and not o.arguments_dropped
        else None,
        max_tokens=request_limit(facts.body),
        reasoning_ms=ms(_span(o.reasoning_first_s, o.reasoning_last_s)),
        reasoning_share=ratio(ms(_span(o.reasoning_first_s, o.reasoning_last_s)), ms(o.tool_call_s))
        if o.tool_calls
        else None,
        tool_call_truncated=_truncated(facts, o, finish, valid) if recognised else None,
        tool_decode_tok_s=ratio(tool_tokens - 1, call_span) if tool_tokens and call_span else None,
        finish_reason=finish,
        events=o.events if counted else None,
        token_events=o.token_events if recognised else None,
        request_bytes=ex.request_bytes,
        response_bytes=o.response_bytes if obs is not None else None,
    )
