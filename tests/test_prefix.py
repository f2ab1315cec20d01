"""Tests for proxy.core.prefix: sections of a rendered prompt, the shared ends of two token
sequences, and how each prompt relates to the ones before it.

The prompts are rendered here as llama-server renders a Qwen3 chat template (the system turn
holds the tools, one JSON line each inside ``<tools>...</tools>``; the generation prompt is
``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``; reasoning is kept only for assistant
turns after the last user message) and tokenized by a toy tokenizer in the manner of Qwen's
pre-tokenizer: special markers whole, a word with its leading space, each digit alone,
punctuation runs, newlines. A token's id is stable per distinct piece, so equal text gives
equal ids. Expected positions are found in the rendered text, never written down.
"""

from __future__ import annotations

import copy
import json
import re
from array import array
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.prefix import (
    GENERATION,
    MIN_SHARED,
    Attribution,
    PrefixKind,
    PromptHistory,
    RenderedPrompt,
    locate_sections,
    shared_prefix,
    shared_suffix,
)

BOS = 1
"""Tokens the tokenizer adds before the text (llama-server's BOS)."""

MS_PER_TOKEN = 0.25

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
GENERATION_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
SPECIAL = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
_SPECIAL = re.compile("(" + "|".join(map(re.escape, SPECIAL)) + ")")
_PIECE = re.compile(r" ?[^\W\d_]+|\d| ?[^\s\w]+|\s*\n|\s+(?!\S)|\s+|.", re.S)
_VOCAB: dict[bytes, int] = {}


# --- bodies -----------------------------------------------------------------------------


def tool(name: str, description: str) -> dict[str, Any]:
    """A Chat Completions function tool with one numeric parameter."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"distance": {"type": "number"}}},
        },
    }


TOOLS = [
    tool("move", "Move the arm forward by a distance in metres."),
    tool("grip", "Close the gripper on whatever is between its fingers."),
    tool("look", "Take a picture with the wrist camera."),
]
SYSTEM = "You are the controller of a robot arm. Current time: 2026-11-30 22:41:05 UTC."


def system(content: str = SYSTEM) -> dict[str, Any]:
    return {"role": "system", "content": content}


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(
    content: str = "", *, call: tuple[str, str] | None = None, reasoning: str | None = None
) -> dict[str, Any]:
    """An assistant turn: text, at most one tool call ``(name, arguments)``, reasoning."""
    m: dict[str, Any] = {"role": "assistant", "content": content}
    if call is not None:
        name, arguments = call
        m["tool_calls"] = [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
        ]
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def tool_result(content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c1", "content": content}


def chat(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Chat Completions body (the form llama-server renders)."""
    body: dict[str, Any] = {"messages": list(messages)}
    if tools is not None:
        body["tools"] = tools
    return body


def turns(n: int) -> list[dict[str, Any]]:
    """The robot conversation's bodies, one per turn: each the one before, its answer and the
    next message (a tool result or a user message)."""
    history = [system(), user("Pick up cube 3.")]
    steps = [
        (assistant(call=("move", '{"distance": 2}')), tool_result("moved 2 m")),
        (assistant(call=("grip", "{}")), tool_result("gripped")),
        (assistant("Cube 3 is in the gripper."), user("Now put it on the shelf.")),
        (assistant(call=("move", '{"distance": -1}')), tool_result("moved -1 m")),
    ]
    bodies = [chat(*history, tools=TOOLS)]
    for answer, following in steps[: n - 1]:
        history = [*history, answer, following]
        bodies.append(chat(*history, tools=TOOLS))
    return bodies


def other_agent(i: int) -> dict[str, Any]:
    """Another agent's first prompt, unrelated to the robot's and to other agents'."""
    words = ["Translate", "Summarise", "Classify", "Proofread", "Rewrite", "Explain", "Grade"]
    return chat(system(f"{words[i]} the text below."), user(f"Text number {i}: hello world."))


# --- rendering and tokenizing ------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p["text"] for p in content if p.get("type") == "text")
    return str(content or "")


def _system_turn(messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    head = _text(messages[0]["content"]) + "\n\n" if messages[0]["role"] == "system" else ""
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return f"<|im_start|>system\n{head}{TOOLS_HEADER}{lines}{TOOLS_FOOTER}"


def _assistant_turn(m: dict[str, Any], keep_reasoning: bool) -> str:
    out = "<|im_start|>assistant\n"
    reasoning = m.get("reasoning_content")
    if keep_reasoning and reasoning:
        out += f"<think>\n{reasoning}\n</think>\n\n"
    content = _text(m.get("content"))
    out += content
    for j, call in enumerate(m.get("tool_calls") or ()):
        fn = call["function"]
        out += "\n" if j or content else ""
        out += f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}\n'
        out += "</tool_call>"
    return out + "<|im_end|>\n"


def render_qwen3(body: dict[str, Any]) -> str:
    """``body`` as llama-server's ``/apply-template`` renders it with a Qwen3 template."""
    messages: list[dict[str, Any]] = body["messages"]
    tools = body.get("tools") or []
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    out = [_system_turn(messages, tools)] if tools else []
    for i, m in enumerate(messages):
        if tools and i == 0 and m["role"] == "system":
            continue
        if m["role"] == "assistant":
            out.append(_assistant_turn(m, keep_reasoning=i > last_user))
        elif m["role"] == "tool":
            out.append(f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response>")
            out.append("<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{m['role']}\n{_text(m['content'])}<|im_end|>\n")
    out.append(GENERATION_PROMPT)
    return "".join(out)


def split_pieces(text: str) -> list[str]:
    """The toy tokenizer's pieces: the special markers whole, then the text between them."""
    pieces: list[str] = []
    for i, part in enumerate(_SPECIAL.split(text)):
        pieces.extend([part] if i % 2 else _PIECE.findall(part))
    assert "".join(pieces) == text
    return pieces


def toy_pieces(text: str, *, split_non_ascii: bool = False) -> list[bytes]:
    """``/tokenize``'s pieces of ``text``; with ``split_non_ascii`` a piece holding a non-ASCII
    character is cut into single bytes (as a byte-level BPE does for rare characters)."""
    pieces = split_pieces(text)
    out: list[bytes] = []
    for piece in pieces:
        data = piece.encode()
        if split_non_ascii and not data.isascii():
            out.extend(data[i : i + 1] for i in range(len(data)))
        else:
            out.append(data)
    return out


def rendered(body: dict[str, Any], *, split_non_ascii: bool = False) -> RenderedPrompt:
    """``body``'s prompt as llama-server renders and tokenizes it, text kept."""
    text = render_qwen3(body)
    pieces = toy_pieces(text, split_non_ascii=split_non_ascii)
    ids = [_VOCAB.setdefault(p, len(_VOCAB)) for p in pieces]
    return RenderedPrompt.build(ids, pieces, text, body, keep_text=True)


# --- expectations ------------------------------------------------------------------------


def text_of(prompt: RenderedPrompt) -> str:
    assert prompt.text is not None
    return prompt.text


def ids_of(prompt: RenderedPrompt) -> list[int]:
    return array("I", prompt.tokens).tolist()


def first_difference(a: str, b: str) -> int:
    """The first character where ``a`` and ``b`` differ."""
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)


def token_at(prompt: RenderedPrompt, char: int) -> int:
    """The token starting at character ``char`` (the scenario puts a token boundary there)."""
    assert char in prompt.starts, "the scenario's change must start a token"
    return prompt.starts.index(char)


def naive_shared_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def naive_shared_suffix(a: Sequence[Any], b: Sequence[Any]) -> int:
    return naive_shared_prefix(list(reversed(a)), list(reversed(b)))


def attribute(
    history: PromptHistory,
    prompt: RenderedPrompt,
    *,
    cache_n: int | None = None,
    conversation_id: str | None = None,
    offset: int = BOS,
) -> Attribution:
    return history.attribute(
        prompt,
        offset=offset,
        cache_n=cache_n,
        ms_per_token=MS_PER_TOKEN,
        conversation_id=conversation_id,
    )


def clock_changed(body: dict[str, Any], seconds: int = 7) -> dict[str, Any]:
    """``body`` with the system prompt's clock (at 22:41:05) at ``seconds`` past 22:41."""
    out = copy.deepcopy(body)
    content = out["messages"][0]["content"]
    assert "22:41:05" in content
    out["messages"][0]["content"] = content.replace("22:41:05", f"22:41:{seconds:02d}")
    return out


# --- sections ----------------------------------------------------------------------------


class TestLocateSections:
    def test_sections_in_rendered_order_each_ending_at_its_text(self) -> None:
        """Each message's content, reasoning and tool call is found in order, its own text
        ending at the section's end; each tool's section is its whole JSON line; the list is
        ordered by position (the system content, the tools, then the conversation)."""
        body = turns(3)[-1]
        prompt = rendered(body)
        text = text_of(prompt)
        names = [s.name for s in prompt.sections]
        assert names == [
            "messages[0].content",
            "tools[0]:move",
            "tools[1]:grip",
            "tools[2]:look",
            "messages[1].content",
            "messages[2].tool_calls[0]",
            "messages[3].content",
            "messages[4].tool_calls[0]",
            "messages[5].content",
        ]
        assert prompt.missing == ()
        own = {s.name: text[s.end - s.length : s.end] for s in prompt.sections}
        for i, m in enumerate(body["messages"]):
            if m.get("content"):
                assert own[f"messages[{i}].content"] == m["content"]
            for j, call in enumerate(m.get("tool_calls") or ()):
                assert own[f"messages[{i}].tool_calls[{j}]"] == call["function"]["arguments"]
        for j, t in enumerate(TOOLS):
            assert own[f"tools[{j}]:{t['function']['name']}"] == json.dumps(t)

    def test_text_parts_are_joined(self) -> None:
        """A content given as text parts is found by its parts joined."""
        body = chat(
            system(),
            {
                "role": "user",
                "content": [{"type": "text", "text": "Pick up "}, {"type": "text", "text": "it."}],
            },
        )
        sections, missing = locate_sections(render_qwen3(body), body)
        assert missing == []
        assert [s.name for s in sections] == ["messages[0].content", "messages[1].content"]
        assert sections[1].length == len("Pick up it.")

    def test_reasoning_the_template_drops_is_missing(self) -> None:
        """An assistant turn's reasoning before the last user message is not in a Qwen3
        rendering: its section is named missing, the others are found."""
        body = chat(
            system(),
            user("Pick up cube 3."),
            assistant("Done.", reasoning="The cube is near, so move first."),
            user("Now the shelf."),
        )
        prompt = rendered(body)
        assert prompt.missing == ("messages[2].reasoning_content",)
        assert "messages[2].content" in [s.name for s in prompt.sections]

    def test_reasoning_after_the_last_user_message_is_found(self) -> None:
        """In a tool loop (no user message after the answer) the reasoning is rendered and is
        a section before the answer's tool call."""
        body = chat(
            system(),
            user("Pick up cube 3."),
            assistant(call=("move", '{"distance": 2}'), reasoning="Move closer first."),
            tool_result("moved 2 m"),
            tools=TOOLS,
        )
        prompt = rendered(body)
        names = [s.name for s in prompt.sections]
        assert prompt.missing == ()
        assert names.index("messages[2].reasoning_content") + 1 == names.index(
            "messages[2].tool_calls[0]"
        )

    def test_tool_named_in_the_system_prompt(self) -> None:
        """A system prompt that quotes a tool's name does not take that tool's section: the
        tool's section is its JSON line, and a change of its description diverges there."""
        tools = copy.deepcopy(TOOLS)
        body = chat(system('Always call "move" before "grip".'), user("Pick up cube 3."))
        body["tools"] = tools
        prompt = rendered(body)
        text = text_of(prompt)
        move = next(s for s in prompt.sections if s.name == "tools[0]:move")
        assert text[move.end - move.length : move.end] == json.dumps(tools[0])
        changed = copy.deepcopy(body)
        changed["tools"][0]["function"]["description"] += " Slowly."
        history = PromptHistory()
        attribute(history, prompt)
        assert attribute(history, rendered(changed)).diverged_section == "tools[0]:move"

    def test_user_message_also_in_a_tool_description(self) -> None:
        """A user message whose text also appears in a tool's description is located in its
        own turn, after the tools, so the generation prompt starts after it."""
        body = chat(system(), user("Take a picture with the wrist camera."), tools=TOOLS)
        prompt = rendered(body)
        text = text_of(prompt)
        section = next(s for s in prompt.sections if s.name == "messages[1].content")
        assert section.end > text.index("<|im_start|>user")
        assert text[prompt.starts[prompt.generation_start()] :] == "<|im_end|>\n" + (
            GENERATION_PROMPT
        )


class TestRenderedPrompt:
    def test_build_keeps_ids_and_character_starts(self) -> None:
        """``build`` holds the ids as unsigned 32-bit items and, per token, the character where
        its piece starts; the text only when asked to."""
        body = turns(2)[-1]
        text = render_qwen3(body)
        pieces = toy_pieces(text)
        ids = [_VOCAB.setdefault(p, len(_VOCAB)) for p in pieces]
        prompt = RenderedPrompt.build(ids, pieces, text, body)
        assert len(prompt) == len(pieces)
        assert ids_of(prompt) == ids
        expected_starts = [sum(len(p.decode()) for p in pieces[:i]) for i in range(len(pieces))]
        assert list(prompt.starts) == expected_starts
        assert prompt.text is None
        assert RenderedPrompt.build(ids, pieces, text, body, keep_text=True).text == text

    def test_non_ascii_starts_are_characters(self) -> None:
        """With UTF-8 text a token starts at a character offset, not a byte offset."""
        body = chat(system("Température de l'atelier : 21 °C. Café ☕ prêt."), user("Où ?"))
        prompt = rendered(body)
        text = text_of(prompt)
        pieces = split_pieces(text)
        assert list(prompt.starts) == [sum(map(len, pieces[:i])) for i in range(len(pieces))]
        assert prompt.starts[-1] < len(text.encode()) - len(pieces[-1].encode())

    def test_token_inside_a_split_character_starts_at_that_character(self) -> None:
        """A piece that continues a character split across tokens (byte-level BPE) starts at
        that character: a change in the character's last byte diverges at it."""
        before = chat(system("Weather at 22:41: ☀ and dry."), user("Go outside?"))
        after = chat(system("Weather at 22:41: ☁ and dry."), user("Go outside?"))
        history = PromptHistory()
        attribute(history, rendered(before, split_non_ascii=True))
        a = attribute(history, rendered(after, split_non_ascii=True))
        content = before["messages"][0]["content"]
        assert a.diverged_section == "messages[0].content"
        assert a.diverged_offset == first_difference(content, after["messages"][0]["content"])

    def test_section_at_names_the_section_and_offset(self) -> None:
        """A token in a message's text is in that message's section at its character offset in
        the text; the template markup before the text belongs to that message (offset 0);
        what follows the last section is the generation prompt."""
        body = chat(system(), user("Pick up cube 3."), tools=TOOLS)
        prompt = rendered(body)
        text = text_of(prompt)
        turn = text.index("<|im_start|>user")
        content = text.index("Pick up cube 3.", turn)
        digit = content + "Pick up cube 3.".index("3")
        assert prompt.section_at(token_at(prompt, turn)) == ("messages[1].content", 0)
        assert prompt.section_at(token_at(prompt, content)) == ("messages[1].content", 0)
        assert prompt.section_at(token_at(prompt, digit)) == (
            "messages[1].content",
            digit - content,
        )
        generation = text.rindex(GENERATION_PROMPT)
        assert prompt.section_at(token_at(prompt, generation))[0] == GENERATION

    def test_generation_start_is_after_the_last_section(self) -> None:
        """The generation prompt starts with the first token after the last message's text
        (the rest of its turn's markup, then the assistant header)."""
        for body in turns(3):
            prompt = rendered(body)
            start = prompt.generation_start()
            last = prompt.sections[-1]
            assert last.name == f"messages[{len(body['messages']) - 1}].content"
            assert prompt.starts[start - 1] < last.end == prompt.starts[start]
            assert text_of(prompt)[prompt.starts[start] :].endswith(GENERATION_PROMPT)

    def test_digest_names_the_token_sequence(self) -> None:
        """Equal token sequences have the same digest, different ones another."""
        a, b = turns(2)
        assert rendered(a).digest() == rendered(copy.deepcopy(a)).digest()
        assert rendered(a).digest() != rendered(b).digest()
        assert len(rendered(a).digest()) == 12

    @settings(max_examples=60, deadline=None)
    @given(
        contents=st.lists(
            st.tuples(
                st.sampled_from(["system", "user", "assistant"]),
                st.text(alphabet='ab cd."\n<|>é', max_size=16),
            ),
            min_size=1,
            max_size=4,
        ),
        with_tools=st.booleans(),
    )
    def test_section_at_names_an_existing_section(
        self, contents: list[tuple[str, str]], with_tools: bool
    ) -> None:
        """For every token (and one past the end) ``section_at`` names a section of the prompt
        or the generation prompt, with an offset inside that section's own text."""
        body = chat(
            *({"role": role, "content": text} for role, text in contents),
            tools=TOOLS if with_tools else None,
        )
        prompt = rendered(body)
        lengths = {s.name: s.length for s in prompt.sections}
        for token in range(len(prompt) + 1):
            name, offset = prompt.section_at(token)
            assert name in lengths or name == GENERATION
            assert offset >= 0
            if name != GENERATION:
                assert offset < lengths[name]


# --- shared ends -------------------------------------------------------------------------

_IDS = st.lists(st.sampled_from([0, 1, 256, 65536, 2**32 - 1]), max_size=24)


class TestSharedEnds:
    @given(common=_IDS, a=_IDS, b=_IDS)
    def test_shared_prefix_equals_a_loop(
        self, common: list[int], a: list[int], b: list[int]
    ) -> None:
        """``shared_prefix`` of two id sequences as bytes is the loop's count of equal leading
        ids (ids differing in one byte only included)."""
        x, y = common + a, common + b
        got = shared_prefix(array("I", x).tobytes(), array("I", y).tobytes())
        assert got == naive_shared_prefix(x, y)

    @given(common=_IDS, a=_IDS, b=_IDS)
    def test_shared_suffix_equals_a_loop(
        self, common: list[int], a: list[int], b: list[int]
    ) -> None:
        """``shared_suffix`` is the loop's count of equal trailing ids."""
        x, y = a + common, b + common
        got = shared_suffix(array("I", x).tobytes(), array("I", y).tobytes())
        assert got == naive_shared_suffix(x, y)

    @given(x=st.binary(max_size=20), y=st.binary(max_size=20))
    def test_width_one_counts_bytes(self, x: bytes, y: bytes) -> None:
        """With width 1 the items are the bytes themselves."""
        assert shared_prefix(x, y, width=1) == naive_shared_prefix(x, y)
        assert shared_suffix(x, y, width=1) == naive_shared_suffix(x, y)


# --- attribution -------------------------------------------------------------------------


class TestPromptHistory:
    def test_first_prompt_is_cold(self) -> None:
        """A first prompt is cold: nothing reusable, nothing lost, no divergence, the first
        conversation's first turn."""
        a = attribute(PromptHistory(), rendered(turns(1)[0]), cache_n=0)
        assert a.prefix_kind is PrefixKind.COLD
        assert (a.reusable_tokens, a.cache_lost_tokens) == (0, 0)
        assert (a.diverged_at, a.diverged_section, a.diverged_offset) == (None, None, None)
        assert a.diverged_cost_ms is None
        assert (a.conversation, a.turn, a.matched, a.between) == ("c1", 1, None, 0)

    def test_clock_in_system_prompt_is_a_rewrite_there(self) -> None:
        """A clock in the system prompt that moved: a rewrite diverging at the changed digit,
        named messages[0].content at that digit's offset; what follows is priced; the same
        conversation's next turn."""
        first = turns(1)[0]
        second = clock_changed(first)
        history = PromptHistory()
        attribute(history, rendered(first))
        prompt = rendered(second)
        a = attribute(history, prompt)
        old, new = first["messages"][0]["content"], second["messages"][0]["content"]
        offset = first_difference(old, new)
        token = token_at(prompt, text_of(prompt).index(new) + offset)
        assert a.prefix_kind is PrefixKind.REWRITE
        assert (a.diverged_section, a.diverged_offset) == ("messages[0].content", offset)
        assert a.diverged_at == token + BOS
        assert a.reusable_tokens == token + BOS
        assert a.diverged_cost_ms == pytest.approx((len(prompt) - token) * MS_PER_TOKEN)
        assert (a.conversation, a.turn, a.matched) == ("c1", 2, 1)

    @pytest.mark.parametrize("change", ["clock", "tool description"])
    def test_change_on_the_next_turn_is_a_rewrite(self, change: str) -> None:
        """The next turn with the system prompt's clock ticked, or a tool's description
        changed, is a rewrite at that section in the same conversation, not a cold prompt."""
        bodies = turns(3)
        history = PromptHistory()
        attribute(history, rendered(bodies[0]))
        previous = attribute(history, rendered(bodies[1]))
        following = copy.deepcopy(bodies[2])
        if change == "clock":
            following, section = clock_changed(following), "messages[0].content"
        else:
            following["tools"][1]["function"]["description"] += " Gently."
            section = "tools[1]:grip"
        a = attribute(history, rendered(following))
        assert (a.prefix_kind, a.diverged_section) == (PrefixKind.REWRITE, section)
        assert (a.conversation, a.turn) == (previous.conversation, previous.turn + 1)

    def test_tools_reordered_diverge_at_the_first_moved_tool(self) -> None:
        """Tools sent in another order: the divergence is in the first tool's line, named by
        its new position and name, at the name's offset in the line."""
        first = turns(1)[0]
        second = copy.deepcopy(first)
        second["tools"] = [TOOLS[1], TOOLS[0], TOOLS[2]]
        history = PromptHistory()
        attribute(history, rendered(first))
        prompt = rendered(second)
        a = attribute(history, prompt)
        text = text_of(prompt)
        char = first_difference(render_qwen3(first), text)
        line_start = text.rindex("\n", 0, char) + 1
        assert a.prefix_kind is PrefixKind.REWRITE
        assert a.diverged_section == f"tools[0]:{TOOLS[1]['function']['name']}"
        assert a.diverged_offset == char - line_start
        assert text[line_start + a.diverged_offset :].startswith('grip"')
        assert a.diverged_at == token_at(prompt, char) + BOS

    def test_tool_description_changed_diverges_in_that_tool(self) -> None:
        """A tool whose description changed: the divergence is in that tool's line at the
        changed character."""
        first = turns(1)[0]
        second = copy.deepcopy(first)
        fn = second["tools"][1]["function"]
        fn["description"] = fn["description"].replace("fingers.", "fingers, gently.")
        history = PromptHistory()
        attribute(history, rendered(first))
        prompt = rendered(second)
        a = attribute(history, prompt)
        text = text_of(prompt)
        char = first_difference(render_qwen3(first), text)
        line_start = text.rindex("\n", 0, char) + 1
        assert a.prefix_kind is PrefixKind.REWRITE
        assert a.diverged_section == "tools[1]:grip"
        assert a.diverged_offset == char - line_start
        assert a.diverged_at == token_at(prompt, char) + BOS

    def test_next_turns_extend_although_the_generation_prompt_changed(self) -> None:
        """Each turn extends the one before: the earlier prompt's generation prompt is
        rendered otherwise in the next (the empty think block is gone) and the match still
        counts. The reusable tokens are the shared prefix; turns count up in one
        conversation; nothing diverged."""
        bodies = turns(5)
        history = PromptHistory()
        previous = rendered(bodies[0])
        attribute(history, previous)
        for turn, body in enumerate(bodies[1:], start=2):
            prompt = rendered(body)
            assert not text_of(prompt).startswith(text_of(previous))
            a = attribute(history, prompt)
            shared = naive_shared_prefix(ids_of(prompt), ids_of(previous))
            assert shared >= previous.generation_start()
            assert a.prefix_kind is PrefixKind.EXTENDS
            assert a.reusable_tokens == shared + BOS
            assert (a.conversation, a.turn, a.matched) == ("c1", turn, turn - 1)
            assert (a.diverged_at, a.diverged_section, a.diverged_cost_ms) == (None, None, None)
            previous = prompt

    def test_identical_repeat_is_a_retry(self) -> None:
        """The same prompt again is a retry of the same conversation and turn; all of it is
        reusable but the last token (always evaluated again for the first token's logits)."""
        prompt = rendered(turns(1)[0])
        history = PromptHistory()
        first = attribute(history, prompt)
        a = attribute(history, rendered(turns(1)[0]), cache_n=len(prompt) - 5)
        assert a.prefix_kind is PrefixKind.RETRY
        assert a.reusable_tokens == len(prompt) + BOS - 1
        assert a.cache_lost_tokens == a.reusable_tokens - (len(prompt) - 5)
        assert (a.conversation, a.turn) == (first.conversation, first.turn)
        assert a.diverged_at is None

    def test_repeat_of_a_later_turn_matches_itself(self) -> None:
        """A repeat of turn 2 is a retry of turn 2, not an extension of turn 1 that it also
        extends."""
        one, two = (rendered(b) for b in turns(2))
        history = PromptHistory()
        attribute(history, one)
        attribute(history, two)
        a = attribute(history, rendered(turns(2)[1]))
        assert a.prefix_kind is PrefixKind.RETRY
        assert (a.matched, a.turn) == (2, 2)
        assert a.reusable_tokens == len(two) + BOS - 1

    @pytest.mark.parametrize("offset", [0, 1, 2])
    def test_reusable_is_capped_below_the_prompt(self, offset: int) -> None:
        """Whatever the match, at most the prompt's tokens less one are reusable (``offset``
        BOS tokens counted in both)."""
        prompt = rendered(turns(1)[0])
        history = PromptHistory()
        attribute(history, prompt, offset=offset)
        a = attribute(history, prompt, offset=offset)
        assert a.reusable_tokens == len(prompt) + offset - 1

    def test_cache_lost_tokens(self) -> None:
        """The tokens reusable but not taken from the cache: reusable less ``cache_n``, never
        below 0, unknown without ``cache_n``."""
        one, two = (rendered(b) for b in turns(2))
        for cache_n in (None, 0, 40, 10_000):
            history = PromptHistory()
            attribute(history, one)
            a = attribute(history, two, cache_n=cache_n)
            expected = None if cache_n is None else max(0, a.reusable_tokens - cache_n)
            assert a.cache_lost_tokens == expected

    def test_unrelated_prompt_is_cold_in_a_new_conversation(self) -> None:
        """Another agent's prompt, sharing only the template's first marker, is cold and
        starts the next conversation."""
        history = PromptHistory()
        attribute(history, rendered(turns(1)[0]))
        prompt = rendered(other_agent(0))
        a = attribute(history, prompt, cache_n=3)
        assert naive_shared_prefix(ids_of(prompt), ids_of(rendered(turns(1)[0]))) < MIN_SHARED
        assert a.prefix_kind is PrefixKind.COLD
        assert (a.reusable_tokens, a.cache_lost_tokens) == (0, 0)
        assert (a.conversation, a.turn) == ("c2", 1)

    def test_same_system_prompt_another_task_is_cold(self) -> None:
        """Two prompts sharing a system prompt (more than a header) but little else at either
        end are different conversations: cold."""
        story = " ".join(f"Paragraph {i} of a long document to summarise." for i in range(8))
        question = " ".join(f"Question {i} about a different spreadsheet." for i in range(8))
        a_body = chat(system("You are a helpful assistant."), user(story))
        b_body = chat(system("You are a helpful assistant."), user(question))
        history = PromptHistory()
        attribute(history, rendered(a_body))
        prompt = rendered(b_body)
        a = attribute(history, prompt)
        assert naive_shared_prefix(ids_of(prompt), ids_of(rendered(a_body))) >= MIN_SHARED
        assert a.prefix_kind is PrefixKind.COLD
        assert a.conversation == "c2"

    def test_history_rewritten_diverges_at_the_message(self) -> None:
        """An earlier user message edited (the prompt not shorter): a rewrite at that message,
        the offset of the changed character in it."""
        bodies = turns(4)
        edited = copy.deepcopy(bodies[3])
        edited["messages"][1]["content"] = "Pick up cube 4 and look at it."
        history = PromptHistory()
        attribute(history, rendered(bodies[3]))
        prompt = rendered(edited)
        a = attribute(history, prompt)
        old, new = bodies[3]["messages"][1]["content"], edited["messages"][1]["content"]
        assert len(prompt) >= len(rendered(bodies[3]))
        assert a.prefix_kind is PrefixKind.REWRITE
        assert (a.diverged_section, a.diverged_offset) == (
            "messages[1].content",
            first_difference(old, new),
        )

    def test_compaction_replaces_history_after_the_system_prompt(self) -> None:
        """The history after the system prompt replaced by a shorter summary: compaction,
        diverging at the summary's first character."""
        long = turns(5)[-1]
        summary = "Summary: cube 3 was picked up and moved 1 m back."
        compacted = chat(system(), user(summary), long["messages"][-1], tools=TOOLS)
        history = PromptHistory()
        attribute(history, rendered(long))
        prompt = rendered(compacted)
        a = attribute(history, prompt)
        assert len(prompt) < len(rendered(long))
        assert a.prefix_kind is PrefixKind.COMPACTION
        assert (a.diverged_section, a.diverged_offset) == ("messages[1].content", 0)
        assert a.diverged_at == token_at(prompt, text_of(prompt).index(summary)) + BOS
        assert a.diverged_cost_ms == pytest.approx(
            (len(prompt) + BOS - a.diverged_at) * MS_PER_TOKEN
        )
        assert (a.conversation, a.turn) == ("c1", 2)

    def test_shorter_prompt_changed_in_the_system_prompt_is_a_rewrite(self) -> None:
        """A shorter prompt that already differs in the system prompt is a rewrite there, not
        a compaction: compaction keeps the first section."""
        rules = " ".join(f"Rule {i}: never drop cube {i} on the floor." for i in range(6))
        head = system(f"{rules} Current time: 22:41:05.")
        tail = [
            user("Pick up cube 3."),
            assistant("Done."),
            user("And cube 4."),
            assistant("Done."),
        ]
        long = chat(head, *tail, user("Now the shelf."))
        short = clock_changed(chat(head, *tail[:2], user("Now the shelf.")))
        history = PromptHistory()
        attribute(history, rendered(long))
        prompt = rendered(short)
        a = attribute(history, prompt)
        assert len(prompt) < len(rendered(long))
        assert a.prefix_kind is PrefixKind.REWRITE
        assert a.diverged_section == "messages[0].content"

    def test_utf8_offset_counts_characters(self) -> None:
        """A change after non-ASCII text is placed by characters of the content, not bytes."""
        first = chat(
            system("Atelier : 21 °C, café ☕ prêt, mise à jour à 22:41:05."),
            user("Où est le cube ?"),
            tools=TOOLS,
        )
        second = clock_changed(first)
        history = PromptHistory()
        attribute(history, rendered(first))
        a = attribute(history, rendered(second))
        old, new = first["messages"][0]["content"], second["messages"][0]["content"]
        offset = first_difference(old, new)
        assert len(old[:offset].encode()) != offset
        assert (a.diverged_section, a.diverged_offset) == ("messages[0].content", offset)

    def test_between_counts_other_prompts(self) -> None:
        """A turn matched across other agents' prompts names its match and how many prompts
        ran in between."""
        one, two = turns(2)
        history = PromptHistory()
        attribute(history, rendered(one))
        for i in range(3):
            attribute(history, rendered(other_agent(i)))
        a = attribute(history, rendered(two))
        assert a.prefix_kind is PrefixKind.EXTENDS
        assert (a.matched, a.between, a.conversation, a.turn) == (1, 3, "c1", 2)

    @pytest.mark.parametrize(("size", "others"), [(2, 1), (2, 2), (4, 3), (4, 4)])
    def test_history_keeps_size_prompts(self, size: int, others: int) -> None:
        """Only the last ``size`` prompts are matched: a repeat is a retry while its first
        sending is among them, cold once pushed out."""
        prompt = rendered(turns(1)[0])
        history = PromptHistory(size=size)
        attribute(history, prompt)
        for i in range(others):
            attribute(history, rendered(other_agent(i)))
        a = attribute(history, prompt)
        kept = 1 + others <= size
        assert a.prefix_kind is (PrefixKind.RETRY if kept else PrefixKind.COLD)
        assert a.conversation == ("c1" if kept else f"c{others + 2}")

    def test_answered_notes_the_generated_tokens(self) -> None:
        """``answered`` notes a prompt's generated tokens, ``predicted`` gives them back by
        sequence number, None for an unknown or forgotten one."""
        history = PromptHistory(size=2)
        attribute(history, rendered(turns(1)[0]))
        assert history.last_seq == 1
        history.answered(history.last_seq, 17)
        assert history.predicted(1) == 17
        assert history.predicted(None) is None
        attribute(history, rendered(other_agent(0)))
        attribute(history, rendered(other_agent(1)))
        assert history.last_seq == 3
        assert history.predicted(1) is None


class TestExplicitConversations:
    def test_explicit_id_names_the_conversation(self) -> None:
        """A conversation id the agent sent names the conversation, its turns counted per id;
        the implicit numbering is not used up by it."""
        bodies = turns(3)
        history = PromptHistory()
        got = [
            attribute(history, rendered(bodies[0]), conversation_id="alice"),
            attribute(history, rendered(other_agent(0)), conversation_id="bob"),
            attribute(history, rendered(bodies[1]), conversation_id="alice"),
            attribute(history, rendered(other_agent(1))),
            attribute(history, rendered(bodies[2]), conversation_id="alice"),
        ]
        assert [(a.conversation, a.turn) for a in got] == [
            ("alice", 1),
            ("bob", 1),
            ("alice", 2),
            ("c1", 1),
            ("alice", 3),
        ]
        assert got[2].prefix_kind is PrefixKind.EXTENDS

    def test_explicit_id_overrides_the_match(self) -> None:
        """An unrelated prompt under the same id is still that conversation, next turn."""
        history = PromptHistory()
        attribute(history, rendered(turns(1)[0]), conversation_id="alice")
        a = attribute(history, rendered(other_agent(0)), conversation_id="alice")
        assert a.prefix_kind is PrefixKind.COLD
        assert (a.conversation, a.turn) == ("alice", 2)

    def test_retry_under_an_explicit_id_keeps_its_turn(self) -> None:
        """A retry is the same turn of the same conversation with or without an explicit id."""
        prompt = rendered(turns(1)[0])
        history = PromptHistory()
        first = attribute(history, prompt, conversation_id="alice")
        a = attribute(history, prompt, conversation_id="alice")
        assert a.prefix_kind is PrefixKind.RETRY
        assert (a.conversation, a.turn) == (first.conversation, first.turn)
