"""Prompt-cache diagnostics in the shapes the hosted APIs define, answered from the proxy's
own comparison of two prompts as llama-server rendered them. Pure.

An agent names its previous response (Anthropic Messages: ``diagnostics.previous_message_id``;
OpenAI Responses: ``prompt_cache_options.comparison_response_id``) and gets back why the
prompt cache could not reuse that response's prompt: Messages' ``diagnostics`` with a
``cache_miss_reason``, Responses' ``prompt_cache_diagnostics``. The official SDKs parse both.
Beside their fields, ``timing_proxy`` says what only a local server knows: the section and
the token where the prompts part, llama-server's ``cache_n``, the milliseconds, and a cause
their types have no name for (``slot_evicted``, ``sliding_window``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.core.findings import LOST_MIN_TOKENS
from proxy.core.turns import Changed, Comparison, PrefixKind

__all__ = ["Diagnosis", "anthropic_diagnostics", "diagnose", "openai_diagnostics"]

NOT_FOUND = "not_found"
UNAVAILABLE = "unavailable"
MODEL = "model_changed"
SYSTEM = "system_changed"
TOOLS = "tools_changed"
MESSAGES = "messages_changed"
COMPACTED = "context_compacted"
EVICTED = "evicted"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why this prompt could not reuse the named earlier one's cache; ``reason`` None: it
    could (nothing was missed)."""

    reason: str | None
    missed_tokens: int = 0
    reusable_tokens: int = 0
    cause: str | None = None
    """The proxy's own name (``prefill_cause`` vocabulary), where it has one."""
    section: str | None = None
    diverged_at: int | None = None
    cache_n: int | None = None
    missed_ms: float | None = None


_CAUSES = {
    Changed.SYSTEM: "system_prompt_changed",
    Changed.TOOLS: "tools_changed",
    Changed.HISTORY: "history_rewritten",
}


def diagnose(
    comparison: Comparison | None,
    *,
    same_model: bool,
    offset: int,
    prompt_tokens: int,
    cache_n: int | None,
    ms_per_token: float | None,
) -> Diagnosis:
    """The diagnosis of a prompt of ``prompt_tokens`` (BOS counted) against the named earlier
    one (``comparison`` None: not known), with what llama-server reused (``cache_n``)."""
    if comparison is None:
        return Diagnosis(NOT_FOUND, cache_n=cache_n)
    c = comparison
    reusable = min(c.shared + offset, prompt_tokens - 1)
    shortfall = max(0, reusable - cache_n) if cache_n is not None else 0
    shortfall = shortfall if shortfall >= LOST_MIN_TOKENS else 0
    if not same_model:
        reason, cause, missed = MODEL, None, reusable + c.repeated
    elif c.kind in (PrefixKind.RETRY, PrefixKind.EXTENDS):
        if not shortfall:
            return Diagnosis(None, reusable_tokens=reusable, cache_n=cache_n)
        reason, cause, missed = EVICTED, None, shortfall
    else:
        reason, cause = _changed(c)
        missed = c.repeated + shortfall
    if cache_n is not None:
        missed = min(missed, max(0, prompt_tokens - cache_n))
    at = c.shared + offset if c.section is not None else None
    return Diagnosis(
        reason,
        missed,
        reusable,
        cause,
        c.section,
        at,
        cache_n,
        round(missed * ms_per_token, 3) if ms_per_token is not None else None,
    )


def _changed(c: Comparison) -> tuple[str, str | None]:
    if c.kind is PrefixKind.COMPACTION:
        return COMPACTED, "compaction"
    if c.changed is not None:
        return {Changed.SYSTEM: SYSTEM, Changed.TOOLS: TOOLS}.get(c.changed, MESSAGES), _CAUSES[
            c.changed
        ]
    section = c.section or ""
    if section.startswith("tools["):
        return TOOLS, None
    return MESSAGES, None


def _ours(d: Diagnosis, evicted_cause: str | None) -> dict[str, Any]:
    return {
        "cause": d.cause if d.reason != EVICTED else evicted_cause,
        "section": d.section,
        "diverged_at": d.diverged_at,
        "reusable_tokens": d.reusable_tokens,
        "cache_n": d.cache_n,
        "missed_tokens": d.missed_tokens,
        "missed_ms": d.missed_ms,
    }


def anthropic_diagnostics(d: Diagnosis, evicted_cause: str | None = None) -> dict[str, Any] | None:
    """Messages' ``diagnostics`` object: ``None`` (JSON null) when nothing was missed.
    A cache emptied by the server itself has no type of Anthropic's: ``unavailable``, with
    the cause named in ``timing_proxy``."""
    if d.reason is None:
        return None
    if d.reason == NOT_FOUND:
        return {"cache_miss_reason": {"type": "previous_message_not_found"}}
    if d.reason in (EVICTED, UNAVAILABLE):
        reason: dict[str, Any] = {"type": "unavailable"}
    else:
        kind = MESSAGES if d.reason == COMPACTED else d.reason
        reason = {"type": kind, "cache_missed_input_tokens": d.missed_tokens}
    return {"cache_miss_reason": reason, "timing_proxy": _ours(d, evicted_cause)}


def openai_diagnostics(d: Diagnosis, evicted_cause: str | None = None) -> dict[str, Any]:
    """Responses' ``prompt_cache_diagnostics``: ``cache_hit`` when nothing was missed."""
    if d.reason is None:
        return {"type": "cache_hit", "timing_proxy": _ours(d, evicted_cause)}
    if d.reason == NOT_FOUND:
        return {"type": "comparison_response_not_found"}
    if d.reason in (EVICTED, UNAVAILABLE):
        return {"type": "unavailable", "timing_proxy": _ours(d, evicted_cause)}
    reason = {SYSTEM: "input_changed", MESSAGES: "input_changed"}.get(d.reason, d.reason)
    return {
        "type": "cache_miss",
        "reason": reason,
        "cache_missed_tokens": d.missed_tokens,
        "comparison_reusable_tokens": d.reusable_tokens,
        "timing_proxy": _ours(d, evicted_cause),
    }
