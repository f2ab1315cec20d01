"""Another harness's names for the record's fields, and the values derived from them.

Pure: one call's JSON object in, the object with record names (and what was done to it) out.
Only keys the object lacks are filled: a record field the line has, even ``null``, is never
replaced, so the proxy's own log lines (which carry every field) pass unchanged.

Names (:data:`RENAMES`, :data:`TOKEN_NAMES`): ``total_ms``, ``latency_ms``, ``duration_ms``
are ``e2e_ms`` (``*_s``: seconds, scaled to ms); ``ttft`` and ``ttft_s`` are seconds, scaled
to ``ttft_ms``; llama-server's ``prompt_ms``/``predicted_ms`` are ``prefill_ms``/``decode_ms``;
``tokens`` (``completion_tokens``, ``output_tokens``) are the generated tokens,
``predicted_n``, and for a tool call also ``tool_call_tokens`` (a harness that counts a tool
call's tokens counts the call, as the Jetson measurement's did).

Derived (:func:`derive`), each only when the object lacks it: ``prefill_ms = ttft_ms`` (the
wait before the first token, so it includes what precedes the prefill), ``decode_ms =
e2e_ms - ttft_ms``, ``decode_tok_s = (predicted_n - 1) / decode_ms x 1000`` (llama-server's
formula: the first token closes the prompt timer).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["DERIVED", "RENAMES", "TOKEN_NAMES", "derive", "map_names"]

RENAMES: tuple[tuple[str, str, float], ...] = (
    ("total_ms", "e2e_ms", 1.0),
    ("latency_ms", "e2e_ms", 1.0),
    ("duration_ms", "e2e_ms", 1.0),
    ("total_s", "e2e_ms", 1000.0),
    ("latency_s", "e2e_ms", 1000.0),
    ("duration_s", "e2e_ms", 1000.0),
    ("ttft", "ttft_ms", 1000.0),
    ("ttft_s", "ttft_ms", 1000.0),
    ("prompt_ms", "prefill_ms", 1.0),
    ("predicted_ms", "decode_ms", 1.0),
)
"""(harness name, record field, factor to ms): times, first match wins."""

TOKEN_NAMES: tuple[str, ...] = ("tokens", "completion_tokens", "output_tokens")
"""Harness names of the generated tokens, first match wins."""

DERIVED: dict[str, str] = {
    "prefill_ms": "prefill_ms = ttft_ms",
    "decode_ms": "decode_ms = e2e_ms - ttft_ms",
    "decode_tok_s": "decode_tok_s = (predicted_n - 1) / decode_ms x 1000",
}
"""How each derived field is computed, as the report says it."""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: object) -> int | None:
    """A token count: a whole non-negative number."""
    number = _number(value)
    return int(number) if number is not None and number >= 0 and number.is_integer() else None


def _rename(name: str, field: str, factor: float) -> str:
    unit = " (s)" if factor == 1000.0 else ""
    return f"{name}{unit} -> {field}"


def _map_times(obj: dict[str, Any], out: dict[str, Any], used: list[str]) -> None:
    for name, field, factor in RENAMES:
        if field in out or name not in obj:
            continue
        value = _number(obj[name])
        if value is not None:
            out[field] = value * factor
            used.append(_rename(name, field, factor))


def _map_tokens(obj: dict[str, Any], out: dict[str, Any], used: list[str], kind: object) -> None:
    for name in TOKEN_NAMES:
        value = _count(obj.get(name))
        if value is None:
            continue
        if "predicted_n" not in out:
            out["predicted_n"] = value
            used.append(f"{name} -> predicted_n")
        if kind == "tool" and "tool_call_tokens" not in out:
            out["tool_call_tokens"] = value
            used.append(f"{name} -> tool_call_tokens for tool calls")
        return


def map_names(obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``obj`` with the harness's names (:data:`RENAMES`, :data:`TOKEN_NAMES`) given their
    record names where the record field is absent, and the renames used (``"total_ms ->
    e2e_ms"``). The harness's own keys stay (a record ignores them)."""
    out = dict(obj)
    used: list[str] = []
    _map_times(obj, out, used)
    _map_tokens(obj, out, used, obj.get("kind"))
    return out, used


def derive(obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``obj`` with the fields of :data:`DERIVED` it lacks computed from those it has, and
    the names of the fields derived."""
    out = dict(obj)
    done: list[str] = []
    ttft, e2e = _number(out.get("ttft_ms")), _number(out.get("e2e_ms"))
    if "prefill_ms" not in out and ttft is not None:
        out["prefill_ms"] = ttft
        done.append("prefill_ms")
    if "decode_ms" not in out and ttft is not None and e2e is not None and e2e >= ttft:
        out["decode_ms"] = round(e2e - ttft, 3)
        done.append("decode_ms")
    tokens, decode = _count(out.get("predicted_n")), _number(out.get("decode_ms"))
    if "decode_tok_s" not in out and tokens and tokens > 1 and decode and decode > 0:
        out["decode_tok_s"] = round((tokens - 1) / decode * 1000.0, 3)
        done.append("decode_tok_s")
    return out, done
