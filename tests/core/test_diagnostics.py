"""Tests for proxy.core.diagnostics: the prompt-cache diagnostics of Anthropic's Messages and
OpenAI's Responses, answered from the proxy's comparison of two prompts, and parsed by the
official SDKs' own types (the reference for their shapes). Prompts are rendered and
tokenized as tests/qwen3_toy.py says."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.core.diagnostics import anthropic_diagnostics, diagnose, openai_diagnostics
from proxy.core.prefix import RenderedPrompt
from proxy.core.turns import compare
from tests.qwen3_toy import BOS, TOOLS, chat, clock_changed, rendered, system, turns, user
from tests.sdk_reference import parse_anthropic_diagnostics, parse_openai_diagnostics


def diagnosed(
    before: dict[str, Any] | None,
    after: dict[str, Any],
    *,
    cache_n: int | None = None,
    same_model: bool = True,
) -> tuple[RenderedPrompt, Any]:
    """``after``'s prompt and its diagnosis against ``before``'s (None: not known); the
    server reusing, unless told, what the two share."""
    prompt = rendered(after)
    comparison = compare(prompt, rendered(before)) if before is not None else None
    if cache_n is None and comparison is not None:
        cache_n = comparison.shared + BOS
    d = diagnose(
        comparison,
        same_model=same_model,
        offset=BOS,
        prompt_tokens=len(prompt) + BOS,
        cache_n=cache_n,
        ms_per_token=0.5,
    )
    return prompt, d


class TestAnthropic:
    def test_a_clock_in_the_system_prompt_is_system_changed(self) -> None:
        """A clock that moved: ``system_changed`` with the tokens after it that the prompt
        repeats, the section and token in ``timing_proxy``; Anthropic's own type parses it."""
        first = turns(1)[0]
        _, d = diagnosed(first, clock_changed(first))
        answer = anthropic_diagnostics(d)
        assert answer is not None
        parsed = parse_anthropic_diagnostics(answer)
        assert parsed.cache_miss_reason is not None
        assert parsed.cache_miss_reason.type == "system_changed"
        assert parsed.cache_miss_reason.cache_missed_input_tokens == d.missed_tokens > 0
        ours = answer["timing_proxy"]
        assert (ours["cause"], ours["section"]) == ("system_prompt_changed", "messages[0].content")
        assert ours["missed_ms"] == pytest.approx(d.missed_tokens * 0.5)

    def test_reordered_tools_and_an_edited_message(self) -> None:
        """Tools in another order are ``tools_changed``; an earlier message edited is
        ``messages_changed``."""
        first = turns(1)[0]
        moved = copy.deepcopy(first)
        moved["tools"] = [TOOLS[1], TOOLS[0], TOOLS[2]]
        _, d = diagnosed(first, moved)
        answer = anthropic_diagnostics(d)
        assert answer is not None
        assert parse_anthropic_diagnostics(answer).cache_miss_reason.type == "tools_changed"  # type: ignore[union-attr]
        body = turns(3)[2]
        edited = copy.deepcopy(body)
        edited["messages"][1]["content"] = "Pick up cube 9 and put it down."
        _, d = diagnosed(body, edited)
        answer = anthropic_diagnostics(d)
        assert answer is not None
        assert parse_anthropic_diagnostics(answer).cache_miss_reason.type == "messages_changed"  # type: ignore[union-attr]

    def test_the_next_turn_with_its_prefix_cached_is_null(self) -> None:
        """The next turn of the same conversation, its prefix served from the cache: no
        divergence, so ``diagnostics`` is null, as Anthropic answers then."""
        one, two = turns(2)
        _, d = diagnosed(one, two)
        assert anthropic_diagnostics(d) is None

    def test_an_evicted_prefix_is_unavailable_with_the_local_cause(self) -> None:
        """The next turn whose prefix another prompt evicted: Anthropic has no type for a
        cache the server emptied, so ``unavailable``, and ``timing_proxy`` names the cause
        and the tokens."""
        one, two = turns(2)
        _, d = diagnosed(one, two, cache_n=3)
        answer = anthropic_diagnostics(d, "slot_evicted")
        assert answer is not None
        assert parse_anthropic_diagnostics(answer).cache_miss_reason.type == "unavailable"  # type: ignore[union-attr]
        assert answer["timing_proxy"]["cause"] == "slot_evicted"
        assert answer["timing_proxy"]["missed_tokens"] > 0

    def test_an_unknown_previous_message_and_another_model(self) -> None:
        """A previous message the proxy does not know is ``previous_message_not_found``;
        another model is ``model_changed``."""
        _, d = diagnosed(None, turns(1)[0])
        answer = anthropic_diagnostics(d)
        assert parse_anthropic_diagnostics(answer).cache_miss_reason.type == (  # type: ignore[union-attr]
            "previous_message_not_found"
        )
        _, d = diagnosed(turns(1)[0], turns(1)[0], same_model=False)
        answer = anthropic_diagnostics(d)
        assert parse_anthropic_diagnostics(answer).cache_miss_reason.type == "model_changed"  # type: ignore[union-attr]


class TestOpenAI:
    def test_shapes_parse_with_the_sdk(self) -> None:
        """Each answer parses as the openai SDK's ``PromptCacheDiagnostics``: a cache hit for
        the next turn, a cache miss with its reason for a clock and for reordered tools, not
        found for an unknown response."""
        one, two = turns(2)
        hit = parse_openai_diagnostics(openai_diagnostics(diagnosed(one, two)[1]))
        assert hit.type == "cache_hit"
        clock = parse_openai_diagnostics(openai_diagnostics(diagnosed(one, clock_changed(one))[1]))
        assert (clock.type, clock.reason) == ("cache_miss", "input_changed")  # type: ignore[union-attr]
        assert clock.cache_missed_tokens > 0  # type: ignore[union-attr]
        moved = copy.deepcopy(one)
        moved["tools"] = [TOOLS[2], TOOLS[0], TOOLS[1]]
        tools = parse_openai_diagnostics(openai_diagnostics(diagnosed(one, moved)[1]))
        assert tools.reason == "tools_changed"  # type: ignore[union-attr]
        gone = parse_openai_diagnostics(openai_diagnostics(diagnosed(None, one)[1]))
        assert gone.type == "comparison_response_not_found"

    def test_a_new_question_on_a_shared_prefix_misses_nothing_it_held(self) -> None:
        """An independent question on the same system prompt and tools: a miss of the input,
        but none of the earlier prompt's tokens are repeated, so none are missed."""
        first = chat(system("You control a robot arm."), user("Wave at the visitor."), tools=TOOLS)
        other = chat(system("You control a robot arm."), user("Open the door."), tools=TOOLS)
        answer = openai_diagnostics(diagnosed(first, other)[1])
        parsed = parse_openai_diagnostics(answer)
        assert (parsed.type, parsed.cache_missed_tokens) == ("cache_miss", 0)  # type: ignore[union-attr]
        assert (parsed.comparison_reusable_tokens or 0) > 0  # type: ignore[union-attr]
