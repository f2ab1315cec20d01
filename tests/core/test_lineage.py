"""Tests for proxy.core.lineage: how each prompt relates to the ones before it (cold, retry,
extends, branch, rewrite, compaction), where it diverged, what it repeats of the earlier
prompt, which earlier prompts are kept for matching, and conversations. Prompts are rendered
and tokenized as tests/qwen3_toy.py says; expectations are found in the rendered text or by
naive loops, never written down.
"""

from __future__ import annotations

import copy

import pytest

from proxy.core.lineage import PromptHistory, Rival
from proxy.core.prefix import RenderedPrompt
from proxy.core.turns import MIN_SHARED, Changed, PrefixKind
from tests.corpus.truth import naive_repeated as truth_repeated
from tests.qwen3_toy import (
    BOS,
    MS_PER_TOKEN,
    TOOLS,
    assistant,
    attribute,
    chat,
    clock_changed,
    first_difference,
    ids_of,
    naive_shared_prefix,
    other_agent,
    render_qwen3,
    rendered,
    system,
    text_of,
    token_at,
    tool_result,
    turns,
    user,
)


def naive_repeated(earlier: RenderedPrompt, new: RenderedPrompt, start: int) -> int:
    """The earlier prompt's tokens from ``start`` on that the new prompt repeats, by the
    corpus truth's naive search over token ids with the prompt's content mask."""
    return truth_repeated(ids_of(earlier), ids_of(new), start, own=earlier.content)


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
        assert a.changed is Changed.SYSTEM
        earlier = rendered(first)
        assert a.repeated_tokens == naive_repeated(earlier, prompt, token)
        assert 0 < a.repeated_tokens <= len(earlier) - token
        assert not a.predecessor_unknown

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

    def test_same_system_prompt_another_task_is_a_branch(self) -> None:
        """Two prompts sharing a system prompt but asking different things are a branch from
        that prefix (reusable up to the question) in a conversation of its own, not a change
        of the earlier prompt."""
        story = " ".join(f"Paragraph {i} of a long document to summarise." for i in range(8))
        question = " ".join(f"Question {i} about a different spreadsheet." for i in range(8))
        a_body = chat(system("You are a helpful assistant."), user(story))
        b_body = chat(system("You are a helpful assistant."), user(question))
        history = PromptHistory()
        attribute(history, rendered(a_body))
        prompt = rendered(b_body)
        a = attribute(history, prompt)
        shared = naive_shared_prefix(ids_of(prompt), ids_of(rendered(a_body)))
        assert shared >= MIN_SHARED
        assert a.prefix_kind is PrefixKind.BRANCH
        assert (a.reusable_tokens, a.diverged_at) == (shared + BOS, shared + BOS)
        assert a.diverged_section == "messages[1].content"
        assert (a.diverged_cost_ms, a.changed, a.predecessor_unknown) == (None, None, False)
        assert (a.conversation, a.turn) == ("c2", 1)

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
        assert a.changed is Changed.HISTORY
        assert (a.diverged_section, a.diverged_offset) == (
            "messages[1].content",
            first_difference(old, new),
        )
        assert a.repeated_tokens > 0

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
        assert a.changed is Changed.HISTORY

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
        assert a.changed is Changed.SYSTEM

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

    def test_between_reach_is_the_most_a_prompt_between_shares(self) -> None:
        """The prompts between the match and this one share at most ``between_reach``
        tokens (BOS counted) with it, as a naive comparison finds; 0 with nothing between;
        None once one of them is no longer held."""
        one, two = turns(2)
        others = [rendered(other_agent(i)) for i in range(3)]
        history = PromptHistory()
        attribute(history, rendered(one))
        for other in others:
            attribute(history, other)
        a = attribute(history, rendered(two))
        naive = max(naive_shared_prefix(ids_of(rendered(two)), ids_of(o)) for o in others)
        assert a.between == 3
        assert a.between_reach == naive + BOS
        history = PromptHistory()
        attribute(history, rendered(one))
        assert attribute(history, rendered(two)).between_reach == 0
        # another agent's three turns: its first leaves a window of two prompts
        their = [other_agent(0)]
        for reply, follow in (("Hola mundo.", "And text 1?"), ("Hallo Welt.", "And text 2?")):
            their.append(chat(*their[-1]["messages"], assistant(reply), user(follow)))
        history = PromptHistory(size=2)
        attribute(history, rendered(one))
        for body in their:
            attribute(history, rendered(body))
        a = attribute(history, rendered(two))
        assert (a.matched, a.between, a.between_reach) == (1, 3, None)

    def test_a_prompt_in_flight_beside_it_is_never_the_match(self) -> None:
        """Two questions on the same prefix sent at once, with nothing before them: the one
        attributed second does not branch from the first (it was running, its prefix in no
        idle slot): it is cold, loses nothing, and its ``rival_reach`` is what the two share
        (BOS counted), as a naive comparison finds. Sent one after the other, it branches."""
        one, two = (
            rendered(chat(system(), user(q), tools=TOOLS)) for q in ("Wave.", "Go to the dock.")
        )
        history = PromptHistory()
        attribute(history, one, cache_n=0)
        a = attribute(history, two, cache_n=0, rivals=[Rival(one, history.last_seq)])
        assert (a.prefix_kind, a.reusable_tokens, a.cache_lost_tokens) == (PrefixKind.COLD, 0, 0)
        assert a.rival_reach == naive_shared_prefix(ids_of(one), ids_of(two)) + BOS
        history = PromptHistory()
        attribute(history, one, cache_n=0)
        a = attribute(history, two, cache_n=0)
        assert (a.prefix_kind, a.rival_reach) == (PrefixKind.BRANCH, None)

    def test_an_earlier_prompt_is_still_the_match_beside_a_rival(self) -> None:
        """A warm-up ended before two questions were sent at once: the second attributed
        matches the warm-up, not the first, whether the first was attributed before it or
        not yet."""
        warm, one, two = (
            rendered(chat(system(), user(q), tools=TOOLS)) for q in ("Hi.", "Wave.", "Dock.")
        )
        for attributed_first in (True, False):
            history = PromptHistory()
            attribute(history, warm, cache_n=0)
            seq = None
            if attributed_first:
                attribute(history, one)
                seq = history.last_seq
            a = attribute(history, two, cache_n=0, rivals=[Rival(one, seq)])
            assert (a.prefix_kind, a.matched) == (PrefixKind.BRANCH, 1)
            assert a.reusable_tokens == naive_shared_prefix(ids_of(warm), ids_of(two)) + BOS
            assert a.cache_lost_tokens == a.reusable_tokens

    @pytest.mark.parametrize(("size", "others"), [(2, 1), (2, 2), (4, 3), (4, 4)])
    def test_window_keeps_size_prompts_and_each_conversations_last(
        self, size: int, others: int
    ) -> None:
        """The last ``size`` prompts are matched, and beyond them each conversation's last
        prompt: an earlier turn pushed out of the window is no longer its own match (its
        repeat is a branch of the turn after it), the conversation's last turn still is."""
        one, two, three = (rendered(b) for b in turns(3))
        history = PromptHistory(size=size)
        attribute(history, one)
        attribute(history, two)
        for i in range(others):
            attribute(history, rendered(other_agent(i)))
        again = attribute(history, one)
        kept = 2 + others <= size
        assert again.prefix_kind is (PrefixKind.RETRY if kept else PrefixKind.BRANCH)
        assert (again.conversation, again.matched) == ("c1", 1 if kept else 2)
        history = PromptHistory(size=size)
        attribute(history, one)
        attribute(history, two)
        for i in range(others):
            attribute(history, rendered(other_agent(i)))
        last = attribute(history, three)
        assert (last.prefix_kind, last.matched, last.between) == (PrefixKind.EXTENDS, 2, others)
        assert (last.conversation, last.turn) == ("c1", 3)

    def test_answered_notes_the_generated_tokens(self) -> None:
        """``answered`` notes a prompt's generated tokens, ``predicted`` gives them back by
        sequence number, None for an unknown one or one that left the window and is no
        longer its conversation's last."""
        history = PromptHistory(size=2)
        one, two = (rendered(b) for b in turns(2))
        attribute(history, one)
        assert history.last_seq == 1
        history.answered(history.last_seq, 17)
        assert history.predicted(1) == 17
        assert history.predicted(None) is None
        attribute(history, two)
        attribute(history, rendered(other_agent(0)))
        attribute(history, rendered(other_agent(1)))
        assert history.last_seq == 4
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


# --- new questions on a shared prefix ------------------------------------------------------

COMMANDS = ["Pick up cube 3.", "Wave at the visitor.", "Go to the charger.", "Open the door."]


def one_shot(command: str) -> dict[str, object]:
    """An independent robot command: the system prompt, the tools and one user message."""
    return chat(system("You control a robot arm."), user(command), tools=TOOLS)


class TestBranch:
    def test_independent_commands_sharing_a_prefix_are_branches(self) -> None:
        """Independent one-shot commands that share the system prompt and the tools are
        branches from that prefix: all of it reusable, nothing changed, no divergence
        priced, each its own conversation."""
        history = PromptHistory()
        first = attribute(history, rendered(one_shot(COMMANDS[0])))
        assert first.prefix_kind is PrefixKind.COLD
        for i, command in enumerate(COMMANDS[1:], start=2):
            prompt = rendered(one_shot(command))
            shared = naive_shared_prefix(ids_of(prompt), ids_of(rendered(one_shot(COMMANDS[0]))))
            a = attribute(history, prompt, cache_n=shared + BOS)
            assert a.prefix_kind is PrefixKind.BRANCH
            assert a.reusable_tokens == a.diverged_at
            assert a.diverged_section == "messages[1].content"
            assert (a.cache_lost_tokens, a.repeated_tokens, a.changed) == (0, 0, None)
            assert (a.diverged_cost_ms, a.predecessor_unknown) == (None, False)
            assert (a.conversation, a.turn) == (f"c{i}", 1)

    def test_an_edited_last_question_is_never_a_history_rewrite(self) -> None:
        """The last user message edited and sent again: on a later turn it still extends the
        turn before (the same conversation and turn as the original); on the first turn it
        is a branch from the shared prefix; neither names a change."""
        bodies = turns(4)
        history = PromptHistory()
        asked = [attribute(history, rendered(body)) for body in bodies][-1]
        edited = copy.deepcopy(bodies[-1])
        edited["messages"][-1]["content"] = "Now put it on the top shelf, slowly."
        a = attribute(history, rendered(edited))
        assert a.prefix_kind is PrefixKind.EXTENDS
        assert (a.conversation, a.turn) == (asked.conversation, asked.turn)
        first = copy.deepcopy(bodies[0])
        first["messages"][-1]["content"] = "Pick up cube 4."
        b = attribute(history, rendered(first))
        assert b.prefix_kind is PrefixKind.BRANCH
        assert b.diverged_section == "messages[1].content"
        assert (a.changed, b.changed, b.predecessor_unknown) == (None, None, False)

    def test_single_message_prompts_sharing_template_tokens_are_cold(self) -> None:
        """One-message prompts of a benchmark, sharing only the template's markup and a
        first word, are cold and each its own conversation."""
        history = PromptHistory()
        got = [
            attribute(history, rendered(chat(user(f"The {word} is a long way from here."))))
            for word in ("river", "mountain", "city", "harbour")
        ]
        assert [a.prefix_kind for a in got] == [PrefixKind.COLD] * 4
        assert [a.conversation for a in got] == ["c1", "c2", "c3", "c4"]
        assert all(a.reusable_tokens == 0 and a.diverged_at is None for a in got)

    def test_a_new_task_after_a_finished_one_is_a_branch(self) -> None:
        """A new one-shot command after a finished multi-turn task (shorter, sharing the
        system prompt and the tools) is a branch, not a compaction."""
        history = PromptHistory()
        for body in turns(5):
            attribute(history, rendered(body))
        fresh = chat(system(), user("Wave at the visitor."), tools=TOOLS)
        a = attribute(history, rendered(fresh))
        assert a.prefix_kind is PrefixKind.BRANCH
        assert (a.changed, a.predecessor_unknown, a.turn) == (None, False, 1)
        assert a.conversation != "c1"


class TestPredecessorUnknown:
    def test_a_continued_conversation_never_seen_is_not_a_rewrite(self) -> None:
        """A prompt whose earlier turns the proxy never saw, matched to another task's first
        prompt on the same prefix, is a branch whose predecessor is unknown, in a conversation
        of its own: the difference is in the other prompt's last turn."""
        history = PromptHistory()
        attribute(history, rendered(one_shot("Wave at the visitor.")))
        unseen = chat(
            system("You control a robot arm."),
            user("Pick up cube 3."),
            assistant(call=("move", '{"distance": 2}')),
            tool_result("moved 2 m"),
            tools=TOOLS,
        )
        a = attribute(history, rendered(unseen))
        assert a.prefix_kind is PrefixKind.BRANCH
        assert a.predecessor_unknown
        assert (a.changed, a.repeated_tokens) == (None, 0)
        assert (a.conversation, a.turn) == ("c2", 1)

    def test_another_agents_history_on_the_same_prefix_is_not_a_rewrite(self) -> None:
        """Two agents with the same system prompt and tools, each past its first turn: one's
        prompt matched to the other's (its own earlier turns not seen) shares none of its
        messages and repeats nothing of it: a branch with an unknown predecessor."""
        history = PromptHistory()
        for body in turns(2):
            attribute(history, rendered(body))
        other = copy.deepcopy(turns(2)[1])
        other["messages"][1]["content"] = "Fetch the blue cylinder from the bench."
        other["messages"][2] = assistant(call=("look", '{"distance": 0}'))
        other["messages"][3] = tool_result("a blue cylinder, 20 cm to the left")
        a = attribute(history, rendered(other))
        assert a.prefix_kind is PrefixKind.BRANCH
        assert a.predecessor_unknown
        assert a.conversation == "c2"

    def test_a_server_that_reused_more_than_the_match_held_a_closer_prompt(self) -> None:
        """A changed tool whose record says llama-server reused more than the shared prefix:
        the server held a closer prompt the proxy did not see, so the match is not this
        prompt's predecessor."""
        first = turns(1)[0]
        second = copy.deepcopy(first)
        second["tools"][1]["function"]["description"] += " Gently."
        history = PromptHistory()
        attribute(history, rendered(first))
        prompt = rendered(second)
        a = attribute(history, prompt, cache_n=len(prompt) + BOS - 5)
        assert a.prefix_kind is PrefixKind.REWRITE
        assert a.predecessor_unknown
        b = attribute(PromptHistory(), rendered(first))
        assert not b.predecessor_unknown


class TestWhatChanged:
    def test_a_removed_system_message_is_a_system_change(self) -> None:
        """A system message removed (a user message now starts where it was) is a change of
        the system prompt, named on the side that had it, not of what follows."""
        rules = system("Never lift more than 2 kg. Report every collision.")
        bodies = [
            chat(*b["messages"][:1], rules, *b["messages"][1:], tools=TOOLS) for b in turns(2)
        ]
        without = copy.deepcopy(bodies[1])
        del without["messages"][1]
        history = PromptHistory()
        attribute(history, rendered(bodies[0]))
        a = attribute(history, rendered(without))
        assert a.prefix_kind is PrefixKind.REWRITE
        assert a.changed is Changed.SYSTEM
        assert a.diverged_section == "messages[1].content"
        assert rendered(without).role_of(a.diverged_section) == "user"

    def test_another_agents_instructions_with_the_same_tools_are_not_a_change(self) -> None:
        """A second agent with its own system prompt and the same tools: its first prompt
        shares a few words of the first agent's instructions and then the whole tools block,
        yet it is another agent (cold, a conversation of its own), not a system-prompt
        change; a clock in the first agent's prompt still is one."""
        kitchen = chat(
            system("You are the kitchen robot. Fetch cups and plates."),
            user("Where are the cups?"),
            tools=TOOLS,
        )
        drone = chat(
            system("You are the warehouse drone. Count pallets on shelves."),
            user("How many pallets on shelf 3?"),
            tools=TOOLS,
        )
        history = PromptHistory()
        attribute(history, rendered(kitchen))
        b = attribute(history, rendered(drone))
        assert (b.prefix_kind, b.changed, b.predecessor_unknown) == (PrefixKind.COLD, None, False)
        assert b.conversation == "c2"
        ticked = chat(
            system("You are the kitchen robot. Fetch cups and plates. Time: 22:41:07."),
            user("Where are the cups?"),
            tools=TOOLS,
        )
        timed = chat(
            system("You are the kitchen robot. Fetch cups and plates. Time: 22:41:05."),
            user("Where are the cups?"),
            tools=TOOLS,
        )
        history = PromptHistory()
        attribute(history, rendered(timed))
        a = attribute(history, rendered(ticked))
        assert (a.prefix_kind, a.changed) == (PrefixKind.REWRITE, Changed.SYSTEM)

    def test_an_added_tool_result_edit_is_a_history_rewrite(self) -> None:
        """A tool result edited in place before later turns is a history rewrite that
        repeats what followed it."""
        bodies = turns(4)
        edited = copy.deepcopy(bodies[3])
        edited["messages"][3]["content"] = "moved 2.5 m"
        history = PromptHistory()
        attribute(history, rendered(bodies[3]))
        prompt = rendered(edited)
        a = attribute(history, prompt)
        assert (a.prefix_kind, a.changed) == (PrefixKind.REWRITE, Changed.HISTORY)
        assert a.diverged_section == "messages[3].content"
        assert a.diverged_at is not None
        assert a.repeated_tokens == naive_repeated(rendered(bodies[3]), prompt, a.diverged_at - BOS)
        assert a.repeated_tokens > 0

    def test_a_regenerated_last_step_is_a_rewrite_not_a_compaction(self) -> None:
        """The last assistant step and its result replaced by another of the same length
        is a history rewrite (nothing was shortened)."""
        bodies = turns(3)
        redone = copy.deepcopy(bodies[2])
        redone["messages"][4] = assistant(call=("look", '{"distance": 0}'))
        redone["messages"][5] = tool_result("cube 3 is in view")
        redone["messages"] += [assistant(call=("grip", "{}")), tool_result("gripped")]
        history = PromptHistory()
        attribute(history, rendered(bodies[2]))
        a = attribute(history, rendered(redone))
        assert a.prefix_kind is not PrefixKind.COMPACTION

    def test_history_trimmed_to_the_recent_turns_is_a_compaction(self) -> None:
        """Earlier steps removed, the recent ones kept and a turn appended: a compaction that
        repeats the kept steps."""
        long = turns(5)[-1]
        kept = [long["messages"][0], long["messages"][1], *long["messages"][6:]]
        trimmed = chat(*kept, assistant(call=("grip", "{}")), tool_result("released"), tools=TOOLS)
        history = PromptHistory()
        attribute(history, rendered(long))
        prompt = rendered(trimmed)
        a = attribute(history, prompt)
        assert (a.prefix_kind, a.changed) == (PrefixKind.COMPACTION, Changed.HISTORY)
        assert a.diverged_section == "messages[2].content"
        assert a.diverged_at is not None
        assert a.repeated_tokens == naive_repeated(rendered(long), prompt, a.diverged_at - BOS)
        assert a.repeated_tokens > 0
        assert (a.conversation, a.turn) == ("c1", 2)


class TestBounds:
    def test_prompts_of_another_model_are_not_matched(self) -> None:
        """Prompts are matched within their model: the same prompt for another model of a
        router is cold there, and the prompts between are counted per model, those of the
        other models apart."""
        one, two = (rendered(b) for b in turns(2))
        history = PromptHistory()
        attribute(history, one, model="a")
        b = attribute(history, one, model="b")
        attribute(history, rendered(other_agent(0)), model="b")
        a = attribute(history, two, model="a")
        assert b.prefix_kind is PrefixKind.COLD
        assert (a.prefix_kind, a.matched, a.between) == (PrefixKind.EXTENDS, 1, 0)
        assert a.others_between == 2

    def test_held_prompts_stay_within_the_byte_bound(self) -> None:
        """With a byte bound smaller than the prompts, the oldest go first (a conversation's
        last too) and the held bytes stay within it."""
        prompts = [rendered(other_agent(i)) for i in range(7)]
        bound = sum(p.nbytes for p in prompts[:3])
        history = PromptHistory(max_bytes=bound)
        for prompt in prompts:
            attribute(history, prompt)
            assert history.held_bytes <= bound
        assert history.held == 3
        assert attribute(history, prompts[0]).prefix_kind is PrefixKind.COLD
        assert attribute(history, prompts[6]).prefix_kind is PrefixKind.RETRY

    def test_conversations_kept_beyond_the_window_are_bounded(self) -> None:
        """Beyond the window, at most ``CONVERSATIONS_KEPT`` conversations' last prompts are
        held: the least recent conversation's goes first."""
        from proxy.core.lineage import CONVERSATIONS_KEPT

        history = PromptHistory(size=1)
        for i in range(CONVERSATIONS_KEPT + 3):
            body = chat(system(f"Agent {i} of the fleet."), user(f"Report {i}."))
            attribute(history, rendered(body))
        assert history.held == CONVERSATIONS_KEPT
