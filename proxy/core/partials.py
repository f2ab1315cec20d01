"""The record's parts and the one function that joins them. Pure.

A :class:`~proxy.core.record.Record` starts as the *base record*
(:func:`proxy.core.assemble.build_record`: the exchange, the request and the tracker's
observation, with :func:`proxy.core.record.server_clock`'s fields). Everything learnt
beside the relay or after it arrives as a *partial*: a frozen dataclass holding exactly the
record fields one producer owns, under the record's own names. :func:`assemble` is the only
place a partial becomes part of a record.

Each partial and its producer:

- :class:`SchemaFields`: ``proxy.serve.schema_costs.SchemaCosts.price``
- :class:`ImageFields`: ``proxy.serve.image_lookups.ImageLookups.fields``
- :class:`OutputTokens`: ``proxy.serve.output_tokens.OutputCounter.count``
- :class:`AttributionFields`: ``proxy.serve.attribution.Attributor.attribute``
- :class:`AccountingNote`: ``proxy.serve.accounting.accounting_note``
- :class:`BoardFields`: ``proxy.serve.telemetry.Telemetry.sample``
- :class:`RooflineFields`: ``proxy.serve.model_info.ModelInfo.roofline``

No field belongs to two owners (``tests/core/test_partials.py`` checks it against the
record). Besides the producers, the relay writes three fields by name, each only when the
producer could not run: ``analysis_error`` (the in-band annotation failed, and the base
named no other analysis error), ``accounting_error`` (the accounting failed to begin, or
raised) and ``telemetry_error`` (the board's sampling task raised or was cancelled).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.core.record import Record

__all__ = [
    "PARTIALS",
    "AccountingNote",
    "AttributionFields",
    "BoardFields",
    "ImageFields",
    "OutputTokens",
    "Partial",
    "RooflineFields",
    "SchemaFields",
    "assemble",
    "fields_of",
]


@dataclass(frozen=True, slots=True)
class SchemaFields:
    """What the request's tool schema cost (``docs/accounting.md``), and whether its tools
    reached the prompt at all (``tools_in_prompt``: a server count above 0)."""

    schema_hash: str | None = None
    schema_tools: int | None = None
    schema_tokens: int | None = None
    schema_tokens_source: str | None = None
    schema_cached: bool | None = None
    schema_prefill_ms: float | None = None
    schema_saved_ms: float | None = None
    schema_prefilled_again: bool | None = None
    tools_in_prompt: bool | None = None


@dataclass(frozen=True, slots=True)
class ImageFields:
    """What the request's images added to its prompt and what the cache covered of them
    (``docs/images.md``)."""

    images: int | None = None
    image_tokens: int | None = None
    image_tokens_each: list[int] | None = None
    images_cached: int | None = None
    image_prefill_ms: float | None = None


@dataclass(frozen=True, slots=True)
class OutputTokens:
    """The tokens of what the model wrote that the server's counts do not split out: the
    calls' arguments and the reasoning."""

    tool_args_tokens: int | None = None
    tool_args_tokens_source: str | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class AttributionFields:
    """Why the prompt was prefilled again: the shared prefix with the recent prompts, the
    cause and what it cost (``docs/attribution.md``)."""

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


@dataclass(frozen=True, slots=True)
class AccountingNote:
    """Why some accounting fields are ``null``: the failed look-ups, joined by ``; ``."""

    accounting_error: str | None = None


@dataclass(frozen=True, slots=True)
class BoardFields:
    """The board over the request's wall interval (``docs/board.md``): tegrastats' energy,
    power and load, or the upstream's CPU time; ``telemetry_error`` when none is known."""

    energy_mj: float | None = None
    energy_mj_per_token: float | None = None
    power_w_avg: float | None = None
    gpu_busy_pct: float | None = None
    ram_used_mb: float | None = None
    temp_max_c: float | None = None
    upstream_cpu_ms: float | None = None
    telemetry_error: str | None = None


@dataclass(frozen=True, slots=True)
class RooflineFields:
    """The decode's roofline estimates from the model's size and the board's bandwidth."""

    decode_gbs: float | None = None
    roof_ratio: float | None = None


Partial = (
    SchemaFields
    | ImageFields
    | OutputTokens
    | AttributionFields
    | AccountingNote
    | BoardFields
    | RooflineFields
)
"""Any of the record's partials."""

PARTIALS: tuple[type[Partial], ...] = (
    SchemaFields,
    ImageFields,
    OutputTokens,
    AttributionFields,
    AccountingNote,
    BoardFields,
    RooflineFields,
)
"""Every partial type, in the order of the table above."""

_NAMES = tuple(f.name for f in dataclasses.fields(Record))
_INDEX = {name: i for i, name in enumerate(_NAMES)}
_record_values: Callable[[Record], tuple[Any, ...]] = operator.attrgetter(*_NAMES)


def _names(cls: type[Partial]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """All of a partial's values at once, as a tuple (also for a single field)."""
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda part: (one(part),)
    getter: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
    return getter


_SLOTS: dict[type[Partial], tuple[tuple[int, ...], Callable[[Any], tuple[Any, ...]]]] = {
    cls: (tuple(_INDEX[n] for n in _names(cls)), _getter(_names(cls))) for cls in PARTIALS
}
"""Per partial type: the record positions of its fields, and its values' getter. Built at
import: a partial field that is no record field fails here, before any request."""


def assemble(base: Record, *parts: Partial | None) -> Record:
    """``base`` with every field of each of ``parts`` set from it (``None`` parts skipped).

    A partial sets all the fields it owns, ``None`` included: its owner's word on them.
    One record is built, however many parts there are.
    """
    values = list(_record_values(base))
    for part in parts:
        if part is None:
            continue
        indices, get = _SLOTS[type(part)]
        for index, value in zip(indices, get(part), strict=True):
            values[index] = value
    return Record(*values)


def fields_of(part: Partial) -> dict[str, Any]:
    """A partial as a flat mapping of record field names to values."""
    indices, get = _SLOTS[type(part)]
    return {_NAMES[i]: v for i, v in zip(indices, get(part), strict=True)}
