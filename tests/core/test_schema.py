"""Tests for proxy.core.schema: hashes, render keys, counting bodies, the tools region, cost."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.partials import AttributionFields
from proxy.core.schema import (
    SchemaCost,
    SchemaLayout,
    context_held,
    differing_region,
    for_counting,
    layout_bodies,
    render_key,
    schema_cost,
    schema_hash,
    strip_tools,
    token_span,
)

READ_FILE: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a text file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
            "required": ["path"],
        },
    },
}
WRITE_FILE: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a text file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
            "required": ["path", "text"],
        },
    },
}
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
USER = {"role": "user", "content": "Show me /etc/hosts."}

BODY: dict[str, Any] = {
    "model": "qwen3",
    "messages": [SYSTEM, USER],
    "tools": [READ_FILE, WRITE_FILE],
    "tool_choice": "auto",
    "max_tokens": 256,
    "temperature": 0.2,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def reversed_keys(obj: Any) -> Any:
    """``obj`` with the insertion order of every object's keys reversed, recursively."""
    if isinstance(obj, dict):
        return {k: reversed_keys(obj[k]) for k in reversed(list(obj))}
    if isinstance(obj, list):
        return [reversed_keys(v) for v in obj]
    return obj


def with_(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A body transformation setting top-level keys."""
    return lambda body: {**body, **changes}


def without(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A body transformation removing top-level keys."""
    return lambda body: {k: v for k, v in body.items() if k not in keys}


def messages(*msgs: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A body transformation replacing the messages."""
    return lambda body: {**body, "messages": list(msgs)}


# --------------------------------------------------------------------------------------------


class TestSchemaHash:
    def test_stable_under_key_reordering(self) -> None:
        """The order of keys inside the tool objects does not change the hash."""
        tools = [READ_FILE, WRITE_FILE]
        assert schema_hash(reversed_keys(tools)) == schema_hash(tools)

    def test_deterministic(self) -> None:
        """Equal tools arrays built separately give the same hash."""
        assert schema_hash(copy.deepcopy([READ_FILE])) == schema_hash([READ_FILE])

    @pytest.mark.parametrize(
        "other",
        [
            pytest.param([WRITE_FILE, READ_FILE], id="reordered"),
            pytest.param([READ_FILE], id="tool-removed"),
            pytest.param([READ_FILE, WRITE_FILE, READ_FILE], id="tool-added"),
            pytest.param(
                [
                    {**READ_FILE, "function": {**READ_FILE["function"], "description": "Read."}},
                    WRITE_FILE,
                ],
                id="description-changed",
            ),
            pytest.param(
                [{**READ_FILE, "function": {**READ_FILE["function"], "name": "cat"}}, WRITE_FILE],
                id="name-changed",
            ),
        ],
    )
    def test_changes_with_the_tools(self, other: list[Any]) -> None:
        """Changing, adding, removing or reordering tools changes the hash (order renders)."""
        assert schema_hash(other) != schema_hash([READ_FILE, WRITE_FILE])

    @pytest.mark.parametrize("tools", [[READ_FILE], [READ_FILE, WRITE_FILE], [], [{"x": 1}]])
    def test_short_hex(self, tools: list[Any]) -> None:
        """The hash is 12 lowercase hex digits."""
        h = schema_hash(tools)
        assert len(h) == 12
        assert all(c in "0123456789abcdef" for c in h)


class TestRenderKey:
    @pytest.mark.parametrize(
        "change",
        [
            pytest.param(with_(tools=[READ_FILE]), id="tools"),
            pytest.param(with_(tools=[WRITE_FILE, READ_FILE]), id="tools-order"),
            pytest.param(with_(tool_choice="required"), id="tool_choice"),
            pytest.param(without("tool_choice"), id="tool_choice-removed"),
            pytest.param(with_(parallel_tool_calls=True), id="parallel_tool_calls"),
            pytest.param(
                with_(chat_template_kwargs={"enable_thinking": False}), id="chat_template_kwargs"
            ),
            pytest.param(messages({**SYSTEM, "content": "Be brief."}, USER), id="system-text"),
            pytest.param(messages(USER), id="system-removed"),
            pytest.param(
                messages({"role": "developer", "content": "Be brief."}, SYSTEM, USER),
                id="developer-added",
            ),
            pytest.param(
                messages(SYSTEM, {"role": "system", "content": "Also: be brief."}, USER),
                id="second-leading-system",
            ),
            pytest.param(with_(model="another-model"), id="model"),
        ],
    )
    def test_changes_with_what_renders_the_tools(
        self, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """The model, tools, tool_choice, parallel_tool_calls, template kwargs and leading
        system or developer messages change the key."""
        assert render_key(change(BODY)) != render_key(BODY)

    @pytest.mark.parametrize(
        "change",
        [
            pytest.param(
                messages(SYSTEM, {**USER, "content": "Show me /etc/passwd."}), id="user-text"
            ),
            pytest.param(
                messages(
                    SYSTEM,
                    USER,
                    {"role": "assistant", "content": "Sure."},
                    {"role": "user", "content": "Thanks."},
                ),
                id="later-messages",
            ),
            pytest.param(
                messages(SYSTEM, USER, {"role": "system", "content": "Late note."}),
                id="system-after-user",
            ),
            pytest.param(with_(max_tokens=8), id="max_tokens"),
            pytest.param(with_(temperature=1.0), id="temperature"),
            pytest.param(with_(stream=False), id="stream"),
            pytest.param(without("stream_options"), id="stream_options"),
            pytest.param(reversed_keys, id="key-order"),
        ],
    )
    def test_ignores_what_comes_after_the_tools(
        self, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """User and later messages, sampling options and the stream flag leave the key alone."""
        assert render_key(change(BODY)) == render_key(BODY)

    def test_no_messages(self) -> None:
        """A body without a messages list still has a key, and it follows the tools."""
        bare = without("messages")(BODY)
        assert render_key(bare) == render_key(with_(messages="not a list")(BODY))
        assert render_key(bare) != render_key(with_(tools=[READ_FILE])(bare))


class TestCountingBodies:
    @pytest.mark.parametrize(
        ("func", "removed"),
        [
            (for_counting, {"stream", "stream_options"}),
            (
                strip_tools,
                {"stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls"},
            ),
        ],
    )
    def test_removed_keys(
        self, func: Callable[[dict[str, Any]], dict[str, Any]], removed: set[str]
    ) -> None:
        """Exactly the listed keys are removed; every other key is kept with its value."""
        body = {
            **BODY,
            "parallel_tool_calls": False,
            "chat_template_kwargs": {"enable_thinking": False},
            "response_format": None,
        }
        out = func(body)
        assert set(body) - set(out) == removed
        assert out == {k: v for k, v in body.items() if k not in removed}

    @pytest.mark.parametrize("func", [for_counting, strip_tools])
    def test_input_not_mutated(self, func: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """The body passed in is left unchanged."""
        body = copy.deepcopy(BODY)
        func(body)
        assert body == BODY

    @pytest.mark.parametrize("func", [for_counting, strip_tools])
    def test_absent_keys(self, func: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """A body without any of those keys comes back equal."""
        body = {"messages": [USER], "max_tokens": 4}
        assert func(body) == body


# --------------------------------------------------------------------------------------------
# The tools region: Qwen3's template, rendered by hand

QWEN_TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "read_file", "description": "Read a text file.", '
    '"parameters": {"type": "object", "properties": {"path": {"type": "string"}}, '
    '"required": ["path"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
QWEN_HEAD = "<|im_start|>system\nYou are a careful coding agent."
QWEN_TAIL = "<|im_end|>\n<|im_start|>user\nShow me /etc/hosts.<|im_end|>\n<|im_start|>assistant\n"


class TestDifferingRegion:
    @pytest.mark.parametrize(
        ("prefix", "insert", "suffix"),
        [
            pytest.param("abc", "XYZ", "def", id="middle"),
            pytest.param("", "XYZ", "abc", id="start"),
            pytest.param("abc", "XYZ", "", id="end"),
            pytest.param("", "XYZ", "", id="only-insert"),
            pytest.param("<s>sys", "\n# Tools\n{...}", "<e>\nuser", id="template-like"),
        ],
    )
    def test_insertion(self, prefix: str, insert: str, suffix: str) -> None:
        """An unambiguous insertion is found exactly: start after the prefix, end after it."""
        with_tools = prefix + insert + suffix
        assert differing_region(with_tools, prefix + suffix) == (
            len(prefix),
            len(prefix) + len(insert),
        )

    @pytest.mark.parametrize("text", ["", "a", "<|im_start|>user\nhi<|im_end|>"])
    def test_identical(self, text: str) -> None:
        """Identical renderings give an empty region (start == end)."""
        start, end = differing_region(text, text)
        assert start == end
        assert text[start:end] == ""

    def test_qwen3_region_is_the_tools_block(self) -> None:
        """For a Qwen3 system+user rendering the region is exactly the inserted tools block."""
        with_tools = QWEN_HEAD + QWEN_TOOLS_BLOCK + QWEN_TAIL
        bare = QWEN_HEAD + QWEN_TAIL
        start, end = differing_region(with_tools, bare)
        assert with_tools[start:end] == QWEN_TOOLS_BLOCK

    def test_qwen3_without_system_message(self) -> None:
        """Without a system message the region holds the whole system turn the tools add."""
        turn = "<|im_start|>system\n" + QWEN_TOOLS_BLOCK.removeprefix("\n\n") + "<|im_end|>\n"
        user = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        with_tools, bare = turn + user, user
        start, end = differing_region(with_tools, bare)
        assert with_tools[:start] + with_tools[end:] == bare
        assert end - start == len(turn)
        assert "# Tools" in with_tools[start:end]
        assert "</tools>" in with_tools[start:end]

    @given(
        prefix=st.text(max_size=30),
        insert=st.text(max_size=30),
        suffix=st.text(max_size=30),
    )
    def test_property_any_text(self, prefix: str, insert: str, suffix: str) -> None:
        """Cutting the region out of the longer text always gives the shorter one back."""
        with_tools, bare = prefix + insert + suffix, prefix + suffix
        start, end = differing_region(with_tools, bare)
        assert 0 <= start <= end <= len(with_tools)
        assert with_tools[:start] + with_tools[end:] == bare
        assert end - start == len(with_tools) - len(bare)

    @given(
        prefix=st.text(alphabet="ab\n", max_size=12),
        insert=st.text(alphabet="ab\n", max_size=12),
        suffix=st.text(alphabet="ab\n", max_size=12),
    )
    def test_property_repetitive_text(self, prefix: str, insert: str, suffix: str) -> None:
        """The same holds for texts made of few characters, where the boundary is ambiguous."""
        with_tools, bare = prefix + insert + suffix, prefix + suffix
        start, end = differing_region(with_tools, bare)
        assert with_tools[:start] + with_tools[end:] == bare
        assert end - start == len(with_tools) - len(bare)


# --------------------------------------------------------------------------------------------
# Cost

LAYOUT = SchemaLayout(10, 113)  # 103 token positions
TOKENS = 103
PROMPT_N, PREFILL_MS = 125, 800.0  # 6.4 ms per token
RATE = PREFILL_MS / PROMPT_N


class TestSchemaCost:
    def test_a_schema_of_no_tokens_is_neither_cached_nor_paid(self) -> None:
        """A template that drops the tools renders 0 schema tokens: 0 ms paid and saved, and
        cached is None (not True: the report must not count it as a cache hit)."""
        for cache_n in (None, 0, 300):
            cost = schema_cost(0, SchemaLayout(10, 10), cache_n, PROMPT_N, PREFILL_MS)
            assert cost == SchemaCost(
                cached=None, prefilled_tokens=0.0, prefill_ms=0.0, saved_ms=0.0
            )

    def test_seed_numbers(self) -> None:
        """103 uncached schema tokens at 6.4 ms per token cost 659.2 ms."""
        cost = schema_cost(TOKENS, LAYOUT, 0, PROMPT_N, PREFILL_MS)
        assert RATE == 6.4
        assert cost == SchemaCost(
            cached=False, prefilled_tokens=103.0, prefill_ms=659.2, saved_ms=0.0
        )

    @pytest.mark.parametrize(
        ("layout", "cache_n", "ref", "expected"),
        [
            pytest.param(
                LAYOUT, 0, None, SchemaCost(False, 103.0, 659.2, 0.0), id="nothing-cached"
            ),
            pytest.param(
                LAYOUT, 5, 5.0, SchemaCost(False, 103.0, 659.2, 0.0), id="cache-before-block"
            ),
            pytest.param(
                LAYOUT, 10, 5.0, SchemaCost(False, 103.0, 659.2, 0.0), id="cache-up-to-block-start"
            ),
            pytest.param(
                LAYOUT, 113, 5.0, SchemaCost(True, 0.0, 0.0, 515.0), id="cache-exactly-to-block-end"
            ),
            pytest.param(
                LAYOUT, 4000, 5.0, SchemaCost(True, 0.0, 0.0, 515.0), id="cache-beyond-block"
            ),
            pytest.param(
                LAYOUT, 113, None, SchemaCost(True, 0.0, 0.0, None), id="cached-no-reference"
            ),
            # 51 of 103 positions cached: 52 prefilled at 6.4 ms, 51 saved at 5 ms
            pytest.param(LAYOUT, 61, 5.0, SchemaCost(False, 52.0, 332.8, 255.0), id="partial"),
            pytest.param(
                LAYOUT, 61, None, SchemaCost(False, 52.0, 332.8, None), id="partial-no-reference"
            ),
            pytest.param(
                None, 0, None, SchemaCost(False, 103.0, 659.2, 0.0), id="no-layout-nothing-cached"
            ),
            pytest.param(
                None, 1, 5.0, SchemaCost(None, None, None, None), id="no-layout-something-cached"
            ),
        ],
    )
    def test_table(
        self, layout: SchemaLayout | None, cache_n: int, ref: float | None, expected: SchemaCost
    ) -> None:
        """The uncovered part of the block is paid at prefill_ms/prompt_n, the covered part is
        saved at the reference rate (unknown without one, 0 when nothing was saved)."""
        assert schema_cost(TOKENS, layout, cache_n, PROMPT_N, PREFILL_MS, ref) == expected

    def test_partial_scales_tokens_not_positions(self) -> None:
        """When the block spans more positions than schema tokens, the uncovered fraction of
        the schema tokens is paid."""
        cost = schema_cost(100, SchemaLayout(0, 200), 150, 100, 200.0, 1.0)
        assert cost == SchemaCost(False, 25.0, 50.0, 75.0)

    @pytest.mark.parametrize("layout", [LAYOUT, None])
    def test_unknown_cache_reach(self, layout: SchemaLayout | None) -> None:
        """Without the cache reach every field is unknown."""
        assert schema_cost(TOKENS, layout, None, PROMPT_N, PREFILL_MS, 5.0) == SchemaCost(
            None, None, None, None
        )

    @pytest.mark.parametrize(
        ("prompt_n", "prefill_ms"),
        [
            pytest.param(None, PREFILL_MS, id="prompt_n-unknown"),
            pytest.param(PROMPT_N, None, id="prefill_ms-unknown"),
            pytest.param(0, PREFILL_MS, id="prompt_n-zero"),
        ],
    )
    @pytest.mark.parametrize("layout", [LAYOUT, None])
    def test_unknown_rate_leaves_the_split_in_tokens(
        self, layout: SchemaLayout | None, prompt_n: int | None, prefill_ms: float | None
    ) -> None:
        """Without this request's prefill rate (the Messages API sends no timings) a cold
        prompt still paid every schema token, but their milliseconds are unknown."""
        assert schema_cost(TOKENS, layout, 0, prompt_n, prefill_ms, 5.0) == SchemaCost(
            False, float(TOKENS), None, 0.0
        )

    def test_unknown_rate_with_the_schema_cached_costs_nothing(self) -> None:
        """Without a prefill rate, a cache past the block's end still means 0 ms paid: no
        schema token was prefilled, whatever the rate."""
        cost = schema_cost(TOKENS, LAYOUT, LAYOUT.end, None, None, 5.0)
        assert cost == SchemaCost(True, 0.0, 0.0, round(TOKENS * 5.0, 3))

    def test_zero_prefill_time(self) -> None:
        """A measured prefill of 0 ms is a known rate of 0, not an unknown one."""
        cost = schema_cost(TOKENS, LAYOUT, 0, PROMPT_N, 0.0)
        assert cost.prefill_ms == 0.0
        assert cost.prefilled_tokens == 103.0

    def test_rounding(self) -> None:
        """Milliseconds and token fractions are rounded to three decimals."""
        cost = schema_cost(10, SchemaLayout(0, 3), 1, 3, 10.0, 1.0 / 3.0)
        assert cost.prefilled_tokens == 6.667
        assert cost.prefill_ms == 22.222
        assert cost.saved_ms == 1.111


# --------------------------------------------------------------------------------------------
# The block in tokens

MARKER = [b"<", b"|", b"im", b"_", b"start", b"|>"]
"""``<|im_start|>`` as a tokenizer without it as a special token cuts it (Gemma 3's)."""


class TestSlidingBlock:
    def test_a_block_opening_with_the_next_turns_marker_is_placed_first(self) -> None:
        """The tools' own system turn and the user turn after it both open with the same
        marker, so the inserted text could be read from either marker: it is read from the
        first, and ends where the tools' turn ends, not inside the user turn's marker."""
        turn = "<|im_start|>system\n# Tools\n{...}<|im_end|>\n"
        user = "<|im_start|>user\nhi<|im_end|>\n"
        assert differing_region(turn + user, user) == (0, len(turn))

    @given(
        st.text("ab<|>", max_size=12),
        st.text("ab<|>", min_size=1, max_size=12),
        st.text("ab<|>", max_size=12),
    )
    def test_the_region_is_the_earliest_insertion(
        self, prefix: str, insert: str, suffix: str
    ) -> None:
        """Cutting the region out of the rendering with tools leaves the one without, and no
        region that starts earlier does."""
        with_tools, without = prefix + insert + suffix, prefix + suffix
        start, end = differing_region(with_tools, without)
        assert with_tools[:start] + with_tools[end:] == without
        assert end - start == len(insert)
        assert all(with_tools[:s] + with_tools[s + len(insert) :] != without for s in range(start))


class TestTokenSpan:
    def test_block_after_a_multi_token_marker(self) -> None:
        """A block that starts after a marker cut into six tokens starts at the seventh
        token (BOS first): positions are counted in tokens, not in the marker's characters."""
        pieces = [*MARKER, b"system", b"\n", b"#", b" Tools", b"</", b"tool_call", b">", b"\n"]
        text = b"".join(pieces)
        start = text.index(b"system")
        end = text.index(b"\n#") + len(b"\n# Tools</tool_call>")
        assert token_span(pieces, start, end, offset=1) == (1 + 6, 1 + 13)

    def test_a_whole_turn_from_the_first_byte(self) -> None:
        """A block from the prompt's first byte starts right after BOS."""
        pieces = [*MARKER, b"system", b"\n", b"T"]
        assert token_span(pieces, 0, len(b"".join(pieces)), offset=1) == (1, 10)

    def test_a_token_across_a_bound_belongs_to_the_block(self) -> None:
        """A token holding the block's last byte and the next text's first (``><`` across
        ``</tool_call><|im_end|>``) is in the block; so is one across its start."""
        pieces = [b"ab", b"c>", b"<d", b"ef"]
        assert token_span(pieces, 3, 4) == (1, 2)  # ">" alone
        assert token_span(pieces, 1, 5) == (0, 3)

    def test_empty_block_and_bounds(self) -> None:
        """An empty block has no tokens; bounds past the pieces give None."""
        pieces = [b"ab", b"cd"]
        assert token_span(pieces, 2, 2) == (1, 1)
        assert token_span(pieces, 4, 4, offset=1) == (3, 3)
        assert token_span(pieces, 0, 5) is None
        assert token_span(pieces, 3, 2) is None

    @given(st.lists(st.binary(min_size=1, max_size=4), max_size=12), st.data())
    def test_the_span_holds_exactly_the_tokens_that_hold_block_bytes(
        self, pieces: list[bytes], data: st.DataObject
    ) -> None:
        """Token i is in the span iff its bytes meet [start, end) (or, for an empty block, the
        span is empty)."""
        size = sum(len(p) for p in pieces)
        start = data.draw(st.integers(0, size))
        end = data.draw(st.integers(start, size))
        span = token_span(pieces, start, end)
        assert span is not None
        at, held = 0, []
        for i, piece in enumerate(pieces):
            if at < end and at + len(piece) > start:
                held.append(i)
            at += len(piece)
        if held:
            assert span == (held[0], held[-1] + 1)
        else:
            assert span[0] == span[1]


class TestLayoutBodies:
    def test_an_empty_system_message_stands_in_for_none(self) -> None:
        """Without a system message the rendering without tools gets an empty one, so the
        region is the tools' text, not the whole turn that carries them; the body with tools
        is only stripped of its streaming options."""
        user = {"role": "user", "content": "hi"}
        body = {"messages": [user], "tools": [READ_FILE], "stream": True}
        with_tools, bare = layout_bodies(body)
        assert with_tools == {"messages": [user], "tools": [READ_FILE]}
        assert bare == {"messages": [{"role": "system", "content": ""}, user]}

    def test_a_system_message_is_kept(self) -> None:
        """With a system message the rendering without tools is the body without them."""
        body = {"messages": [{"role": "system", "content": "Be brief."}], "tools": [READ_FILE]}
        assert layout_bodies(body)[1] == {"messages": body["messages"]}


class TestContextHeld:
    """Whether an earlier prompt held the schema in this prompt's place (positions 10-60)."""

    LAYOUT = SchemaLayout(10, 60)

    @pytest.mark.parametrize(
        ("fields", "held"),
        [
            (AttributionFields(prefix_kind="retry", reusable_tokens=80), True),
            (AttributionFields(prefix_kind="extends", reusable_tokens=70), True),
            (AttributionFields(prefix_kind="branch", reusable_tokens=60), True),
            (AttributionFields(prefix_kind="cold", reusable_tokens=0), False),
            (
                AttributionFields(
                    prefix_kind="rewrite", reusable_tokens=5, diverged_section="messages[0].content"
                ),
                True,
            ),
            (
                AttributionFields(
                    prefix_kind="rewrite", reusable_tokens=30, diverged_section="tools[1]:grip"
                ),
                False,
            ),
            (
                AttributionFields(
                    prefix_kind="branch",
                    reusable_tokens=30,
                    diverged_section="tools[1]:grip",
                    attribution_error="predecessor_unknown",
                ),
                False,
            ),
            (
                AttributionFields(
                    prefix_kind="rewrite",
                    reusable_tokens=70,
                    attribution_error="predecessor_unknown",
                ),
                True,
            ),
            (AttributionFields(attribution_error="Unsupported"), None),
            (None, None),
        ],
    )
    def test_held_by_the_match(self, fields: AttributionFields | None, held: bool | None) -> None:
        """A retry, the next turn and a new question on the same prefix held the schema; a
        prompt of another agent (cold) did not, nor a match that differs inside the tools; the
        agent's own prompt changed before the schema (a clock) held it; a match that may not be
        the predecessor held it only if it shared the schema's end; not attributed: unknown."""
        assert context_held(fields, self.LAYOUT) is held

    def test_a_busy_slot_never_held_it(self) -> None:
        """A new question on the same prefix given another slot because the one holding it
        was busy (``slot_busy``): that slot never held the schema; the same question with
        no cause did."""
        busy = AttributionFields(
            prefix_kind="branch", reusable_tokens=70, prefill_cause="slot_busy"
        )
        assert context_held(busy, self.LAYOUT) is False
        assert context_held(busy, None) is False
        held = AttributionFields(prefix_kind="branch", reusable_tokens=70)
        assert context_held(held, self.LAYOUT) is True

    def test_without_the_schemas_place(self) -> None:
        """The schema's place unknown: the kinds that share all before their last turn held it,
        another agent's did not, a match that may not be the predecessor is unknown."""
        assert context_held(AttributionFields(prefix_kind="extends", reusable_tokens=5), None)
        assert context_held(AttributionFields(prefix_kind="cold", reusable_tokens=0), None) is False
        unknown = AttributionFields(
            prefix_kind="branch", reusable_tokens=5, attribution_error="predecessor_unknown"
        )
        assert context_held(unknown, None) is None
