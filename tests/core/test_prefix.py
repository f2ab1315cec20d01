"""Tests for proxy.core.prefix: sections of a rendered prompt, its last turn, and the shared
ends of two token sequences. Prompts are rendered and tokenized as tests/qwen3_toy.py says
(a Qwen3 template, a toy tokenizer); expected positions are found in the rendered text.
"""

from __future__ import annotations

import copy
import json
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.lineage import PromptHistory
from proxy.core.prefix import (
    GENERATION,
    RenderedPrompt,
    locate_sections,
    message_index,
    shared_prefix,
    shared_suffix,
)
from tests.profiles import examples
from tests.qwen3_toy import (
    GENERATION_PROMPT,
    TOOLS,
    VOCAB,
    assistant,
    attribute,
    chat,
    first_difference,
    ids_of,
    naive_shared_prefix,
    naive_shared_suffix,
    render_qwen3,
    rendered,
    split_pieces,
    system,
    text_of,
    token_at,
    tool_result,
    toy_pieces,
    turns,
    user,
)

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
        ids = [VOCAB.setdefault(p, len(VOCAB)) for p in pieces]
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
        before = chat(system("Weather at 22:41: ☀ and dry."), user("Go outside?"), tools=TOOLS)
        after = chat(system("Weather at 22:41: ☁ and dry."), user("Go outside?"), tools=TOOLS)
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

    @settings(max_examples=examples(60), deadline=None)
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


# --- the last turn -----------------------------------------------------------------------


class TestLastTurn:
    @pytest.mark.parametrize(
        ("roles", "last_turn"),
        [
            (("system", "user"), 1),
            (("user",), 0),
            (("system", "developer", "user", "user"), 2),
            (("system", "user", "assistant", "user"), 3),
            (("system", "user", "assistant", "tool"), 4),
            (("system", "user", "assistant", "tool", "user"), 4),
            (("system",), 1),
            ((), 0),
        ],
    )
    def test_last_turn_starts_after_the_last_answer(
        self, roles: tuple[str, ...], last_turn: int
    ) -> None:
        """The last turn is the messages after the last assistant or tool message, else
        after the system ones; it is empty when the prompt ends with an answer."""
        messages = [{"role": r, "content": f"message {i}"} for i, r in enumerate(roles)]
        prompt = RenderedPrompt.build([], [], "", {"messages": messages})
        assert prompt.roles == roles
        assert prompt.last_turn == last_turn

    def test_in_last_turn_names_messages_and_the_generation_prompt(self) -> None:
        """A section is in the last turn when its message is, and the generation prompt
        always is; the system message and the tools never are."""
        body = turns(3)[2]
        prompt = rendered(body)
        assert prompt.last_turn == len(body["messages"])
        names = [s.name for s in prompt.sections]
        assert not any(prompt.in_last_turn(n) for n in names)
        assert prompt.in_last_turn(GENERATION)
        asked = rendered(chat(system(), user("Pick up cube 3."), tools=TOOLS))
        assert asked.in_last_turn("messages[1].content")
        assert not asked.in_last_turn("messages[0].content")
        assert not asked.in_last_turn("tools[0]:move")

    def test_role_of_a_section(self) -> None:
        """A message's sections carry its role; a tool's and the generation prompt carry
        none."""
        prompt = rendered(turns(2)[1])
        assert prompt.role_of("messages[0].content") == "system"
        assert prompt.role_of("messages[2].tool_calls[0]") == "assistant"
        assert prompt.role_of("messages[3].content") == "tool"
        assert prompt.role_of("tools[1]:grip") is None
        assert prompt.role_of(GENERATION) is None
        assert message_index("messages[12].content") == 12
        assert message_index("tools[0]:move") is None

    def test_a_prefix_completes_a_section_only_past_its_text(self) -> None:
        """Only a prefix reaching past the end of the first section's text holds more than
        the template's markup."""
        prompt = rendered(chat(system("Sort the parts."), user("Start."), tools=TOOLS))
        first = prompt.sections[0]
        end_token = token_at(prompt, first.end)
        assert not prompt.completes_a_section(0)
        assert not prompt.completes_a_section(end_token - 1)
        assert prompt.completes_a_section(end_token)

    def test_messages_have_digests_equal_where_the_message_is(self) -> None:
        """Equal messages have equal digests wherever they sit; a changed one does not."""
        one = rendered(chat(system(), user("a"), assistant("b"), user("c")))
        two = rendered(chat(system(), user("a"), user("c")))
        assert one.messages[1] == two.messages[1]
        assert one.messages[3] == two.messages[2]
        assert one.messages[2] not in two.messages


def test_content_mask_marks_the_requests_own_text() -> None:
    """A token is content exactly when it starts inside a message's text or a tool's JSON
    line, found here with str.find in the rendering; markup is not."""
    body = turns(2)[1]
    prompt = rendered(body)
    text = text_of(prompt)
    spans = []
    for m in body["messages"]:
        if m.get("content"):
            at = text.find(m["content"])
            spans.append((at, at + len(m["content"])))
    for t in body["tools"]:
        line = json.dumps(t)
        at = text.find(line)
        spans.append((at, at + len(line)))
    expected = [int(any(a <= s < b for a, b in spans)) for s in prompt.starts]
    calls = [(s.end - s.length, s.end) for s in prompt.sections if ".tool_calls[" in s.name]
    for i, s in enumerate(prompt.starts):
        if any(a <= s < b for a, b in calls):
            expected[i] = 1
    assert list(prompt.content) == expected
    assert 0 < sum(prompt.content) < len(prompt)
