"""llama-server's own clock for one request, and what of it is physically possible. Pure.

An upstream's numbers become record fields, ``/stats`` percentiles and Prometheus sums for
good, so a value no server can produce is not believed: a negative or non-finite duration or
count, a rate above :data:`MAX_TOK_S`, more drafts accepted than drafted. Such a field is
``None`` and its name is kept in :attr:`ServerTimings.implausible` (the record says
``analysis_error: implausible_timings:FIELD``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_COUNT", "MAX_TOK_S", "ServerTimings", "plausible", "valid_count"]

MAX_COUNT = 2**53
"""Larger (or negative) counts from an upstream are not believed: they are ``None``."""

MAX_TOK_S = 1e6
"""No llama-server prefills or decodes faster than this many tokens per second."""


def valid_count(value: Any) -> int | None:
    """A token count as an upstream may send it: a non-negative int, else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _duration(value: Any) -> float | None:
    """A duration in ms as an upstream may send it: a finite non-negative number."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    f = float(value) if -MAX_COUNT <= value <= MAX_COUNT else math.inf
    return f if math.isfinite(f) and f >= 0 else None


_COUNTS = ("prompt_n", "cache_n", "predicted_n", "draft_n", "draft_n_accepted")
_DURATIONS = ("prompt_ms", "predicted_ms")


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """llama-server's own clock for one request, from its ``timings`` object."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    cache_n: int | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    implausible: tuple[str, ...] = ()
    """The fields the upstream sent that no server can produce (they are ``None``)."""

    @classmethod
    def from_json(cls, obj: Any) -> ServerTimings | None:
        """Read a ``timings`` object; ``None`` when it is not an object."""
        if not isinstance(obj, dict):
            return None
        values: dict[str, Any] = {}
        rejected: list[str] = []
        for key in (*_COUNTS, *_DURATIONS):
            raw = obj.get(key)
            values[key] = (valid_count if key in _COUNTS else _duration)(raw)
            if raw is not None and values[key] is None:
                rejected.append(key)
        return cls(**values, implausible=tuple(rejected))


def plausible(timings: ServerTimings | None) -> ServerTimings | None:
    """``timings`` without what no server can produce: a prefill or decode rate above
    :data:`MAX_TOK_S` (its duration is dropped), more drafts accepted than drafted (the
    accepted count is dropped); each dropped field named in ``implausible``."""
    if timings is None:
        return None
    t, dropped = timings, list(timings.implausible)
    if _too_fast(t.prompt_n, t.prompt_ms):
        t, dropped = dataclasses.replace(t, prompt_ms=None), [*dropped, "prompt_ms"]
    steps = t.predicted_n - 1 if t.predicted_n else None
    if _too_fast(steps, t.predicted_ms):
        t, dropped = dataclasses.replace(t, predicted_ms=None), [*dropped, "predicted_ms"]
    if t.draft_n is not None and t.draft_n_accepted is not None and t.draft_n_accepted > t.draft_n:
        t, dropped = dataclasses.replace(t, draft_n_accepted=None), [*dropped, "draft_n_accepted"]
    if len(dropped) == len(timings.implausible):
        return timings
    return dataclasses.replace(t, implausible=tuple(dropped))


def _too_fast(tokens: int | None, ms: float | None) -> bool:
    """Whether ``tokens`` in ``ms`` is faster than any server (0 ms for tokens too)."""
    if not tokens or ms is None:
        return False
    return ms == 0 or tokens * 1000.0 / ms > MAX_TOK_S
