"""The record's parts (proxy.core.partials): who owns each field, and the one assembly.

Every record field has exactly one owner: the base record built by
``proxy.core.assemble.build_record``, or one partial, each given by one producer. A field
added to the record without an owner, or to two partials, fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.assemble import Exchange, build_record
from proxy.core.partials import (
    PARTIALS,
    AccountingNote,
    AttributionFields,
    BoardFields,
    ImageFields,
    OutputTokens,
    Partial,
    RooflineFields,
    SchemaFields,
    assemble,
    fields_of,
)
from proxy.core.record import Outcome, Record, ServerClock, ServerTimings
from proxy.core.request import analyse_request
from proxy.core.tracker import Observation, ToolCall
from proxy.serve.accounting import accounting_note
from proxy.serve.attribution import Attributor
from proxy.serve.image_lookups import ImageLookups
from proxy.serve.model_info import ModelInfo
from proxy.serve.output_tokens import OutputCounter
from proxy.serve.schema_costs import SchemaCosts
from proxy.serve.telemetry import Telemetry

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"

BASE = (
    *("id", "ts", "method", "path", "model", "stream", "kind", "api", "status", "outcome"),
    *("error", "analysis_error"),
    *("ttfb_ms", "ttft_ms", "e2e_ms", "decode_wall_ms"),
    *("prefill_ms", "decode_ms", "prompt_n", "cache_n", "predicted_n"),
    *("prefill_tok_s", "decode_tok_s", "prompt_tokens", "cache_hit_ratio", "overhead_ms"),
    "prefill_share",
    *("tool_calls", "tool_call_valid", "tool_call_ms", "tool_call_tokens", "tool_decode_tok_s"),
    "tool_args_chars",
    *("max_tokens", "tool_call_truncated", "reasoning_ms", "reasoning_share"),
    *("draft_n", "draft_n_accepted", "draft_acceptance"),
    *("finish_reason", "events", "token_events", "request_bytes", "response_bytes"),
)
"""The base record's fields (build_record, with server_clock's)."""

OWNERS: dict[type[Partial], tuple[Callable[..., Any], tuple[str, ...]]] = {
    SchemaFields: (
        SchemaCosts.price,
        (
            *("schema_hash", "schema_tools", "schema_tokens", "schema_tokens_source"),
            *("schema_cached", "schema_prefill_ms", "schema_saved_ms", "schema_prefilled_again"),
            "tools_in_prompt",
        ),
    ),
    ImageFields: (
        ImageLookups.fields,
        ("images", "image_tokens", "image_tokens_each", "images_cached", "image_prefill_ms"),
    ),
    OutputTokens: (
        OutputCounter.count,
        ("tool_args_tokens", "tool_args_tokens_source", "reasoning_tokens"),
    ),
    AttributionFields: (
        Attributor.attribute,
        (
            *("prefix_kind", "reusable_tokens", "cache_lost_tokens", "diverged_at"),
            *("diverged_section", "diverged_offset", "diverged_cost_ms", "prefill_cause"),
            *("prefill_lost_ms", "prefill_lost_tokens", "cache_lost_cause", "cache_lost_ms"),
            *("conversation", "turn", "diverged_text", "attribution_error"),
        ),
    ),
    AccountingNote: (accounting_note, ("accounting_error",)),
    BoardFields: (
        Telemetry.sample,
        (
            *("energy_mj", "energy_mj_per_token", "power_w_avg", "gpu_busy_pct"),
            *("ram_used_mb", "temp_max_c", "upstream_cpu_ms", "telemetry_error"),
        ),
    ),
    RooflineFields: (ModelInfo.roofline, ("decode_gbs", "roof_ratio")),
}
"""Each partial: its producer, and the fields it owns."""

RECORD = tuple(f.name for f in dataclasses.fields(Record))


def names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def mentions(annotation: Any, cls: type[Any]) -> bool:
    """``annotation`` is ``cls`` or a type built from it (``X | None``, ``tuple[X, ...]``)."""
    return annotation is cls or any(mentions(a, cls) for a in typing.get_args(annotation))


def rich_base() -> Record:
    """The base record of a streamed tool call with timings, reasoning and a draft."""
    body = {
        "model": "m",
        "stream": True,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "go", "parameters": {}}}],
    }
    facts = analyse_request("POST", "/v1/chat/completions", orjson.dumps(body))
    obs = Observation(
        first_byte_s=0.1,
        first_event_s=0.1,
        first_token_s=0.2,
        last_token_s=0.5,
        last_byte_s=0.6,
        tool_call_s=0.5,
        events=9,
        token_events=7,
        response_bytes=900,
        timings=ServerTimings(
            prompt_n=40,
            prompt_ms=150.0,
            cache_n=8,
            predicted_n=12,
            predicted_ms=300.0,
            draft_n=6,
            draft_n_accepted=4,
        ),
        model="m",
        finish_reason="tool_calls",
        tool_calls=(ToolCall(0, "go", '{"x": 1}'),),
        recognised=True,
        reasoning_first_s=0.2,
        reasoning_last_s=0.3,
        reasoning_text="think",
    )
    path = "/v1/chat/completions"
    ex = Exchange("r-1", "2026-01-01T00:00:00.000Z", "POST", path, 200, Outcome.COMPLETED, 0.6, 300)
    return build_record(ex, facts, obs)


class TestOwnership:
    def test_every_record_field_has_exactly_one_owner(self) -> None:
        """The base's fields and each partial's fields split the record's fields exactly:
        none is left without an owner, none has two."""
        owned = [*BASE, *(field for _, fields in OWNERS.values() for field in fields)]
        assert sorted(owned) == sorted(RECORD)
        assert len(owned) == len(set(owned))

    def test_each_partial_owns_the_fields_listed(self) -> None:
        """A partial's dataclass fields are the ones the table gives it, in the record's
        names, and the table covers every partial type."""
        assert set(OWNERS) == set(PARTIALS)
        for cls, (_, fields) in OWNERS.items():
            assert names(cls) == fields, cls.__name__
            assert set(names(cls)) <= set(RECORD), cls.__name__

    def test_each_producer_returns_its_partial(self) -> None:
        """The producer named for a partial is declared to return it."""
        for cls, (producer, _) in OWNERS.items():
            returned = typing.get_type_hints(producer)["return"]
            assert mentions(returned, cls), f"{producer.__qualname__} -> {returned}"

    def test_partials_are_frozen(self) -> None:
        """A partial cannot be changed once made: it is a fact, as the record is."""
        part = SchemaFields(schema_tokens=3)
        with pytest.raises(dataclasses.FrozenInstanceError):
            part.schema_tokens = 4  # type: ignore[misc]

    def test_the_server_clock_is_part_of_the_base(self) -> None:
        """server_clock's fields are base fields, in the record's names."""
        assert set(names(ServerClock)) <= set(BASE)

    def test_the_base_record_leaves_every_partial_field_none(self) -> None:
        """build_record fills its own fields and none that a partial owns, also for a
        tool call with timings, reasoning and a draft."""
        record = rich_base()
        assert record.tool_calls == 1 and record.draft_n == 6 and record.reasoning_ms == 100.0
        partial_fields = {field for _, fields in OWNERS.values() for field in fields}
        assert {name: getattr(record, name) for name in partial_fields} == dict.fromkeys(
            partial_fields
        )


class TestAssemble:
    def test_sets_the_fields_of_each_part(self) -> None:
        """Each part's fields are set on the record; the others keep the base's values."""
        base = rich_base()
        record = assemble(
            base,
            SchemaFields(schema_tokens=120, schema_tokens_source="server", tools_in_prompt=True),
            RooflineFields(decode_gbs=24.5, roof_ratio=1.9),
            AccountingNote("images: cancelled"),
        )
        assert (record.schema_tokens, record.tools_in_prompt) == (120, True)
        assert (record.decode_gbs, record.roof_ratio) == (24.5, 1.9)
        assert record.accounting_error == "images: cancelled"
        assert (
            record.replace(
                schema_tokens=None,
                schema_tokens_source=None,
                tools_in_prompt=None,
                decode_gbs=None,
                roof_ratio=None,
                accounting_error=None,
            )
            == base
        )

    def test_a_part_sets_its_none_fields_too(self) -> None:
        """A partial's None is its owner's word: it replaces what the record held."""
        base = Record(id="r", ts=None, method=None, path=None, images=2, image_tokens=512)
        record = assemble(base, ImageFields(images=2))
        assert (record.images, record.image_tokens) == (2, None)

    def test_no_parts_and_none_parts_leave_the_record_as_it_is(self) -> None:
        """With nothing to join, the record comes back equal."""
        base = rich_base()
        assert assemble(base) == base
        assert assemble(base, None, None) == base

    def test_fields_of_is_the_partial_as_record_names(self) -> None:
        """fields_of gives each field of the partial under its record name, None included."""
        assert fields_of(RooflineFields(decode_gbs=1.5)) == {"decode_gbs": 1.5, "roof_ratio": None}
        assert fields_of(AccountingNote("x")) == {"accounting_error": "x"}

    def test_accounting_note_only_when_something_failed(self) -> None:
        """No failure: no note, so the record's accounting_error is left alone; failures are
        joined in order."""
        assert accounting_note([]) is None
        assert accounting_note(["schema: TimeoutError", "reasoning: cancelled"]) == AccountingNote(
            "schema: TimeoutError; reasoning: cancelled"
        )


def spread_replaces(tree: ast.Module) -> list[int]:
    """Lines of ``….replace(**something)`` calls in ``tree``."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "replace"
        and any(k.arg is None for k in node.keywords)
    ]


def test_no_record_is_merged_from_a_mapping() -> None:
    """No module of the serving layer merges record fields from a dict
    (``replace(**fields)``): fields join a record as typed partials, through assemble."""
    found: dict[str, list[int]] = {}
    for path in sorted((PACKAGE / "serve").rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        lines = spread_replaces(ast.parse(path.read_text(), name))
        if lines:
            found[name] = lines
    assert found == {}
