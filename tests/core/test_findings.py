"""Tests for proxy.core.findings: the cause of each request's paid prefill, the tokens it cost,
and the bounded, ranked findings.

The attributions come from :class:`proxy.core.lineage.PromptHistory` over prompts rendered
and tokenized as tests/qwen3_toy.py does (a Qwen3 template, a toy tokenizer), used as
proxy/serve/attribution.py uses them. ``cache_n`` comes from a simulated one-slot
llama-server with a full cache (``--swa-full``): it reuses what the prompt shares with the
last prompt it evaluated, less the last token, unless a test says otherwise.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.findings import (
    FIXES,
    LOST_MIN_TOKENS,
    Cause,
    Findings,
    Loss,
    cache_cause_of,
    cause_of,
    dropped_section,
    loss_of,
)
from proxy.core.lineage import Attribution, PromptHistory, Rival
from proxy.core.prefix import RenderedPrompt, shared_prefix
from proxy.core.turns import Changed, PrefixKind
from tests.qwen3_toy import (
    BOS,
    MS_PER_TOKEN,
    TOOLS,
    assistant,
    attribute,
    chat,
    clock_changed,
    other_agent,
    rendered,
    system,
    tool_result,
    toy_pieces,
    turns,
    user,
)

SLOT = object()
"""``cache_n`` as the simulated one-slot server gives it."""


@dataclass
class Sent:
    prompt: RenderedPrompt
    attribution: Attribution
    loss: Loss
    prompt_n: int

    @property
    def cause(self) -> Cause | None:
        return self.loss.cause

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt) + BOS


@dataclass
class Agent:
    """Prompts through one history and one simulated slot, each attributed and given its
    loss as the attributor does; the findings counted at ``MS_PER_TOKEN``."""

    history: PromptHistory = field(default_factory=PromptHistory)
    findings: Findings = field(default_factory=Findings)
    slot: bytes = b""

    def send(
        self,
        body: dict[str, Any],
        *,
        cache_n: Any = SLOT,
        cache_prompt: bool = True,
        predicted_n: int | None = None,
        n_ctx: int | None = None,
    ) -> Sent:
        prompt = rendered(body)
        total = len(prompt) + BOS
        if cache_n is SLOT:
            reused = shared_prefix(prompt.tokens, self.slot) if cache_prompt else 0
            cache_n = min(reused + BOS, total - 1) if reused else 0
        self.slot = prompt.tokens
        a = attribute(self.history, prompt, cache_n=cache_n)
        self.history.answered(self.history.last_seq, predicted_n, total)
        prompt_n = total - (cache_n or 0)
        loss = loss_of(
            a, cache_prompt=cache_prompt, missing=prompt.missing, n_ctx=n_ctx, prompt_n=prompt_n
        )
        if loss.cause is not None:
            ms = loss.tokens * MS_PER_TOKEN if loss.tokens else None
            self.findings.add(loss.cause, a.diverged_section, loss.tokens, ms, a.diverged_offset)
        return Sent(prompt, a, loss, prompt_n)


COMMANDS = ["Pick up cube 3.", "Wave at the visitor.", "Go to the charger.", "Open the door."]


# --- causes ------------------------------------------------------------------------------


class TestCauseOf:
    def test_cold_prompt_has_no_cause(self) -> None:
        """A first prompt (nothing reusable) has no cause, even with the cache off."""
        assert Agent().send(turns(1)[0], cache_n=0).cause is None
        assert Agent().send(turns(1)[0], cache_n=0, cache_prompt=False).cause is None

    def test_extends_with_everything_cached_has_no_cause(self) -> None:
        """Turns that extend the previous one with its prefix taken from the cache, and a
        retry, have no cause and lose nothing."""
        agent = Agent()
        for body in turns(4):
            assert agent.send(body).loss == Loss()
        assert agent.send(turns(4)[-1]).loss == Loss()

    def test_independent_commands_on_a_shared_prefix_lose_nothing(self) -> None:
        """One-shot commands sharing the system prompt and the tools, the prefix served from
        the cache each time: no cause, nothing lost, although the questions differ."""
        agent = Agent()
        for command in COMMANDS:
            sent = agent.send(chat(system("You control a robot arm."), user(command), tools=TOOLS))
            assert sent.loss == Loss()
            assert sent.attribution.prefix_kind in (PrefixKind.COLD, PrefixKind.BRANCH)
        assert agent.findings.ranked() == []

    def test_a_shared_prefix_evicted_by_another_agent_is_slot_evicted(self) -> None:
        """The same commands with another agent's prompt between two of them: the shared
        prefix was evicted from the slot, and only that prefix is lost."""
        agent = Agent()
        first = chat(system("You control a robot arm."), user(COMMANDS[0]), tools=TOOLS)
        agent.send(first)
        agent.send(other_agent(0))
        body = chat(system("You control a robot arm."), user(COMMANDS[1]), tools=TOOLS)
        sent = agent.send(body, cache_n=3)
        assert sent.attribution.prefix_kind is PrefixKind.BRANCH
        assert sent.cause is Cause.SLOT_EVICTED
        assert sent.attribution.cache_lost_tokens == sent.attribution.reusable_tokens - 3
        assert sent.loss.tokens == sent.attribution.cache_lost_tokens

    @pytest.mark.parametrize("role", ["system", "developer"])
    def test_system_prompt_changed(self, role: str) -> None:
        """A rewrite in a system (or developer) message is system_prompt_changed."""
        body = chat(
            system(), user("Pick up cube 3 and put it on the shelf by the door."), tools=TOOLS
        )
        body["messages"][0]["role"] = role
        agent = Agent()
        agent.send(body)
        sent = agent.send(clock_changed(body))
        assert sent.attribution.diverged_section == "messages[0].content"
        assert sent.cause is Cause.SYSTEM_PROMPT_CHANGED

    def test_tools_reordered_or_redescribed(self) -> None:
        """A rewrite in the tools (reordered, a description changed) is tools_changed."""
        first = turns(1)[0]
        reordered = copy.deepcopy(first)
        reordered["tools"] = [TOOLS[2], TOOLS[0], TOOLS[1]]
        redescribed = copy.deepcopy(first)
        redescribed["tools"][2]["function"]["description"] += " Mind the glare."
        for changed in (reordered, redescribed):
            agent = Agent()
            agent.send(first)
            assert agent.send(changed).cause is Cause.TOOLS_CHANGED

    def test_history_rewritten(self) -> None:
        """A rewrite in an earlier user message is history_rewritten."""
        body = turns(3)[-1]
        edited = copy.deepcopy(body)
        edited["messages"][1]["content"] = "Pick up cube 4, please, carefully."
        agent = Agent()
        agent.send(body)
        sent = agent.send(edited)
        assert sent.attribution.diverged_section == "messages[1].content"
        assert sent.cause is Cause.HISTORY_REWRITTEN

    def test_compaction(self) -> None:
        """Earlier steps trimmed, the recent ones kept: compaction, costing the kept steps;
        a summary that keeps nothing of the earlier prompt costs nothing and names none."""
        long = turns(5)[-1]
        trimmed = chat(*long["messages"][:2], *long["messages"][6:], tools=TOOLS)
        agent = Agent()
        agent.send(long)
        sent = agent.send(trimmed)
        assert sent.cause is Cause.COMPACTION
        assert sent.loss.tokens == sent.attribution.repeated_tokens > 0
        summary = chat(
            *long["messages"][:2],
            assistant("Summary: cube 3 moved twice, then back."),
            user("Where is it now?"),
            tools=TOOLS,
        )
        agent = Agent()
        agent.send(long)
        sent = agent.send(summary)
        assert sent.attribution.prefix_kind is PrefixKind.COMPACTION
        assert sent.loss == Loss()

    def test_cache_prompt_off_comes_first(self) -> None:
        """``cache_prompt: false`` with anything reusable is cache_prompt_off, before any
        other cause (a rewrite, a cache shortfall)."""
        one, two = turns(2)
        agent = Agent()
        agent.send(one)
        assert agent.send(two, cache_prompt=False).cause is Cause.CACHE_PROMPT_OFF
        rewrite = agent.send(clock_changed(two), cache_prompt=False)
        assert rewrite.attribution.prefix_kind is PrefixKind.REWRITE
        assert rewrite.cause is Cause.CACHE_PROMPT_OFF

    def test_template_drops_reasoning(self) -> None:
        """The next turn after an answer with reasoning, which the template drops before the
        new user message, is template_drops_history; it costs the previous answer's tokens."""
        first = chat(system(), user("Pick up cube 3."), tools=TOOLS)
        second = chat(
            *first["messages"],
            assistant("It is in the gripper.", reasoning="The cube is close: grip it."),
            user("Now the shelf."),
            tools=TOOLS,
        )
        agent = Agent()
        agent.send(first, predicted_n=23)
        sent = agent.send(second)
        assert sent.prompt.missing == ("messages[2].reasoning_content",)
        assert sent.attribution.prefix_kind is PrefixKind.EXTENDS
        assert sent.cause is Cause.TEMPLATE_DROPS_HISTORY
        assert sent.attribution.previous_answer == 23
        assert sent.loss.tokens == 23

    def test_reasoning_kept_in_a_tool_loop_has_no_cause(self) -> None:
        """In a tool loop the template keeps the answer's reasoning: nothing is missing and
        the extension has no cause."""
        first = chat(system(), user("Pick up cube 3."), tools=TOOLS)
        second = chat(
            *first["messages"],
            assistant(call=("move", '{"distance": 2}'), reasoning="Move closer first."),
            tool_result("moved 2 m"),
            tools=TOOLS,
        )
        agent = Agent()
        agent.send(first)
        assert agent.send(second).cause is None

    def test_cache_lost_after_other_prompts_is_slot_evicted(self) -> None:
        """The shared prefix not reused after other agents' prompts ran is slot_evicted."""
        one, two = turns(2)
        agent = Agent()
        agent.send(one)
        agent.send(other_agent(0))
        sent = agent.send(two, cache_n=0)
        assert sent.attribution.between == 1
        assert sent.cause is Cause.SLOT_EVICTED

    def test_a_slot_that_kept_more_than_the_prompts_between_share_was_not_evicted(
        self,
    ) -> None:
        """Another agent's prompt ran between two turns, but the server kept more of this
        conversation than that prompt shares with it (each agent on a slot of its own, a
        sliding-window server resuming from a checkpoint): sliding_window, never
        slot_evicted; kept no more than the other prompt shares: slot_evicted."""
        one, two = turns(2)
        probe = Agent()
        probe.send(one)
        probe.send(other_agent(0))
        a = probe.send(two).attribution
        assert a.between_reach is not None
        assert a.reusable_tokens - LOST_MIN_TOKENS > a.between_reach
        for cache_n, expected in (
            (a.reusable_tokens - LOST_MIN_TOKENS, Cause.SLIDING_WINDOW),
            (a.between_reach, Cause.SLOT_EVICTED),
        ):
            agent = Agent()
            agent.send(one)
            agent.send(other_agent(0))
            assert agent.send(two, cache_n=cache_n).cause is expected

    def test_nothing_reused_after_another_models_prompts_is_a_reload(self) -> None:
        """On a router, a turn after prompts of another model with nothing of its prefix
        reused: the router unloaded this model for the other and reloaded it empty,
        model_reloaded. The same turn with its prefix reused is silent, and one that kept
        part of it lost it otherwise (a checkpoint): sliding_window."""
        one, two = (rendered(b) for b in turns(2))
        for cache_n, expected in (
            (0, Cause.MODEL_RELOADED),
            (None, None),
            (30, Cause.SLIDING_WINDOW),
        ):
            history = PromptHistory()
            attribute(history, one, model="a", cache_n=0)
            attribute(history, rendered(other_agent(0)), model="b", cache_n=0)
            full = len(two) + BOS - 1
            a = attribute(history, two, model="a", cache_n=full if cache_n is None else cache_n)
            assert (a.between, a.others_between) == (0, 1)
            assert cause_of(a, cache_prompt=True) is expected

    def test_cache_lost_with_nothing_between_is_sliding_window(self) -> None:
        """The shared prefix not reused with nothing between the two turns is
        sliding_window; fewer than LOST_MIN_TOKENS lost is the server's margin, no cause;
        ``cache_n`` unknown is no cause."""
        one, two = turns(2)
        for lost, expected in (
            (LOST_MIN_TOKENS, Cause.SLIDING_WINDOW),
            (LOST_MIN_TOKENS - 1, None),
        ):
            probe = Agent()
            probe.send(one)
            reusable = probe.send(two).attribution.reusable_tokens
            agent = Agent()
            agent.send(one)
            sent = agent.send(two, cache_n=reusable - lost)
            assert sent.attribution.cache_lost_tokens == lost
            assert sent.cause is expected
        agent = Agent()
        agent.send(one)
        assert agent.send(two, cache_n=None).cause is None

    def test_a_predecessor_never_seen_names_no_cause(self) -> None:
        """A conversation whose earlier turns the proxy did not see, matched to another
        task's prompt, names no cause; nor does a changed prompt after which the server
        reused more than the match allows."""
        agent = Agent()
        agent.send(chat(system("You control a robot arm."), user(COMMANDS[1]), tools=TOOLS))
        unseen = chat(
            system("You control a robot arm."),
            user(COMMANDS[0]),
            assistant(call=("move", '{"distance": 2}')),
            tool_result("moved 2 m"),
            tools=TOOLS,
        )
        sent = agent.send(unseen)
        assert sent.attribution.predecessor_unknown
        assert sent.loss == Loss()
        first = turns(1)[0]
        changed = copy.deepcopy(first)
        changed["tools"][0]["function"]["description"] += " Slowly."
        agent = Agent()
        agent.send(first)
        closer = agent.send(changed, cache_n=len(rendered(changed)) + BOS - 5)
        assert closer.attribution.predecessor_unknown
        assert closer.loss == Loss()


class TestLostTokens:
    def test_a_changed_prompt_costs_what_it_repeats_of_the_earlier_one(self) -> None:
        """For a rewrite the lost tokens are the earlier prompt's after the change that the
        new one repeats, not the new prompt's after the divergence."""
        agent = Agent()
        agent.send(turns(1)[0])
        sent = agent.send(clock_changed(turns(2)[1]))
        assert sent.cause is Cause.SYSTEM_PROMPT_CHANGED
        diverged = sent.attribution.diverged_at
        assert diverged is not None
        assert sent.loss.tokens == sent.attribution.repeated_tokens
        earlier = len(rendered(turns(1)[0])) + BOS
        assert 0 < sent.loss.tokens <= earlier - diverged < sent.prompt_tokens - diverged

    def test_a_new_question_after_a_clock_costs_only_the_prefix_after_the_clock(self) -> None:
        """Independent commands with a clock in the system prompt: each loses what followed
        the clock (the rest of the system prompt and the tools), never its own question."""
        agent = Agent()
        bodies = [
            clock_changed(chat(system(), user(c), tools=TOOLS), 10 + i)
            for i, c in enumerate(COMMANDS)
        ]
        agent.send(bodies[0])
        tools = sum(len(toy_pieces(json.dumps(t))) for t in TOOLS)
        for body in bodies[1:]:
            sent = agent.send(body)
            assert sent.cause is Cause.SYSTEM_PROMPT_CHANGED
            question = len(toy_pieces(body["messages"][1]["content"]))
            assert sent.loss.tokens is not None
            assert tools <= sent.loss.tokens <= sent.prompt_n - question
            assert sent.attribution.conversation != "c1"

    def test_a_cache_shortfall_costs_the_lost_tokens(self) -> None:
        """For an eviction (the other agent's prompt took the one slot, which then holds
        only what that prompt shares) the lost tokens are the cache's shortfall."""
        one, two = turns(2)
        agent = Agent()
        agent.send(one)
        agent.send(other_agent(0))
        sent = agent.send(two)
        cache_n = sent.prompt_tokens - sent.prompt_n
        assert sent.cause is Cause.SLOT_EVICTED
        assert sent.loss.tokens == sent.attribution.reusable_tokens - cache_n > 0

    @given(st.integers(0, 400))
    def test_never_more_than_was_evaluated(self, prompt_n: int) -> None:
        """All the causes of a request together never lose more than llama-server evaluated."""
        a = dataclasses.replace(
            _lost(LOST_MIN_TOKENS + 30), changed=Changed.SYSTEM, repeated_tokens=350
        )
        loss = loss_of(a, cache_prompt=True, prompt_n=prompt_n)
        assert loss.cause is Cause.SYSTEM_PROMPT_CHANGED
        assert loss.cache_cause is Cause.SLIDING_WINDOW
        assert loss.total <= prompt_n
        assert loss.total == min(prompt_n, 350 + LOST_MIN_TOKENS + 30)


SIMILARITY = 0.10
"""llama-server's ``--slot-prompt-similarity``: below it, a request takes the least recently
used idle slot instead of the one sharing the most with it."""


@dataclass
class Slots:
    """A simulated llama-server of ``count`` slots with a full cache, and the proxy's history
    beside it. The requests of a burst run at once: each, in the order sent, takes the idle
    slot sharing the most with its prompt (when that is at least :data:`SIMILARITY` of it;
    else the least recently used), and reuses what it shares; they are attributed in
    ``order`` with the others of the burst beside them, as the attributor does."""

    count: int
    history: PromptHistory = field(default_factory=PromptHistory)
    findings: Findings = field(default_factory=Findings)
    held: list[bytes] = field(default_factory=list)
    used: list[int] = field(default_factory=list)

    def burst(self, *bodies: dict[str, Any], order: tuple[int, ...] = ()) -> list[Sent]:
        assert len(bodies) <= self.count
        if not self.held:
            self.held, self.used = [b""] * self.count, list(range(self.count))
        prompts = [rendered(b) for b in bodies]
        idle, cache = list(range(self.count)), []
        for prompt in prompts:
            best = max(idle, key=lambda s: shared_prefix(prompt.tokens, self.held[s]))
            near = shared_prefix(prompt.tokens, self.held[best]) >= SIMILARITY * len(prompt)
            slot = best if near else min(idle, key=lambda s: self.used[s])
            idle.remove(slot)
            reused = shared_prefix(prompt.tokens, self.held[slot])
            cache.append(min(reused + BOS, len(prompt) + BOS - 1) if reused else 0)
            self.held[slot], self.used[slot] = prompt.tokens, max(self.used) + 1
        sent: dict[int, Sent] = {}
        seqs: dict[int, int] = {}
        for i in order or range(len(prompts)):
            beside = [Rival(p, seqs.get(j)) for j, p in enumerate(prompts) if j != i]
            a = attribute(self.history, prompts[i], cache_n=cache[i], rivals=beside)
            seqs[i] = self.history.last_seq
            prompt_n = len(prompts[i]) + BOS - cache[i]
            loss = loss_of(a, cache_prompt=True, prompt_n=prompt_n, slots=self.count)
            if loss.cause is not None:
                self.findings.add(loss.cause, a.diverged_section, loss.tokens, None)
            sent[i] = Sent(prompts[i], a, loss, prompt_n)
        return [sent[i] for i in range(len(prompts))]


def _one_shot(command: str) -> dict[str, Any]:
    return chat(system("You control a robot arm."), user(command), tools=TOOLS)


class TestSlotBusy:
    @pytest.mark.parametrize("order", [(0, 1), (1, 0)])
    def test_a_burst_after_a_warm_up_names_the_busy_slot(self, order: tuple[int, int]) -> None:
        """After a warm-up, two questions at once on two slots: the first sent takes the
        slot holding the prefix, the other the empty one and prefills it: slot_busy, its
        lost tokens what it could have reused, whichever is attributed first; the first is
        silent. The next burst finds the prefix on both slots: silent."""
        server = Slots(2)
        server.burst(_one_shot(COMMANDS[0]))
        warm, cold = server.burst(_one_shot(COMMANDS[1]), _one_shot(COMMANDS[2]), order=order)
        assert warm.loss == Loss()
        assert cold.cause is Cause.SLOT_BUSY
        assert cold.prompt_n == cold.prompt_tokens  # nothing reused
        assert cold.loss.tokens == cold.attribution.reusable_tokens > 0
        assert [f.cause for f in server.findings.ranked()] == [Cause.SLOT_BUSY]
        for again in server.burst(_one_shot(COMMANDS[3]), _one_shot(COMMANDS[0]), order=order):
            assert again.loss == Loss()
        assert server.findings.ranked()[0].requests == 1

    @pytest.mark.parametrize("order", [(0, 1), (1, 0)])
    def test_a_first_burst_is_silent(self, order: tuple[int, int]) -> None:
        """Two questions at once with nothing cached before: each prefills the prefix, as
        it must (the other's was running, in no idle slot): no cause, no finding."""
        server = Slots(2)
        for sent in server.burst(_one_shot(COMMANDS[0]), _one_shot(COMMANDS[1]), order=order):
            assert sent.attribution.prefix_kind is PrefixKind.COLD
            assert sent.loss == Loss()
        assert server.findings.ranked() == []

    def test_the_same_traffic_on_one_slot_is_silent(self) -> None:
        """On one slot the same requests run one after another (nobody beside anybody), and
        each finds the prefix the one before left: silent."""
        server = Slots(1)
        for command in COMMANDS:
            (sent,) = server.burst(_one_shot(command))
            assert sent.loss == Loss()
        assert server.findings.ranked() == []

    def test_agents_continuing_side_by_side_on_their_own_slots_are_silent(self) -> None:
        """Two agents of their own system prompts, their first turns one after the other,
        then every next turn of both at once: each finds its conversation on its own slot,
        whichever is attributed first: silent."""
        robot = turns(4)
        other = [chat(system("Summarise each text below in one line. " * 4), user("Text 1."))]
        for n in (2, 3, 4):
            other.append(chat(*other[-1]["messages"], assistant("Done."), user(f"Text {n}.")))
        server = Slots(2)
        server.burst(robot[0])
        server.burst(other[0])
        for i in range(1, 4):
            for sent in server.burst(robot[i], other[i], order=(i % 2, 1 - i % 2)):
                assert sent.attribution.prefix_kind is PrefixKind.EXTENDS
                assert sent.loss == Loss()
        assert server.findings.ranked() == []

    def test_what_the_slot_count_and_the_rival_say(self) -> None:
        """A shortfall beside a request sharing at least LOST_MIN_TOKENS more than was kept:
        slot_busy on two slots; on one slot the requests queued, so the rules without it
        (nothing between: sliding_window); the slot count unknown: no cause. A rival sharing
        less than that with it leaves the other rules."""
        kept = 40
        a = dataclasses.replace(
            _lost(60), prefix_kind=PrefixKind.BRANCH, rival_reach=kept + LOST_MIN_TOKENS
        )
        assert cause_of(a, cache_prompt=True, slots=2) is Cause.SLOT_BUSY
        assert cause_of(a, cache_prompt=True, slots=1) is Cause.SLIDING_WINDOW
        assert cause_of(a, cache_prompt=True, slots=None) is None
        near = dataclasses.replace(a, rival_reach=kept + LOST_MIN_TOKENS - 1)
        assert cause_of(near, cache_prompt=True, slots=2) is Cause.SLIDING_WINDOW
        alone = dataclasses.replace(a, rival_reach=None)
        assert cause_of(alone, cache_prompt=True, slots=None) is Cause.SLIDING_WINDOW
        changed = dataclasses.replace(a, changed=Changed.SYSTEM, repeated_tokens=30)
        assert cache_cause_of(changed, Cause.SYSTEM_PROMPT_CHANGED, 2) is Cause.SLOT_BUSY


# --- findings ----------------------------------------------------------------------------


class TestFindings:
    def test_every_cause_has_a_fix(self) -> None:
        """Each cause names a fix."""
        assert set(FIXES) == set(Cause)
        assert all(FIXES[c] for c in Cause)

    def test_ranked_by_milliseconds(self) -> None:
        """Findings are ranked by the milliseconds they cost, summed over their requests."""
        adds = [
            (Cause.TOOLS_CHANGED, "tools[0]:grip", 40.0),
            (Cause.SYSTEM_PROMPT_CHANGED, "messages[0].content", 30.0),
            (Cause.SYSTEM_PROMPT_CHANGED, "messages[0].content", 30.0),
            (Cause.HISTORY_REWRITTEN, "messages[3].content", 50.0),
            (Cause.SLOT_EVICTED, None, 5.0),
        ]
        findings = Findings()
        totals: dict[tuple[Cause, str | None], float] = {}
        for cause, section, ms in adds:
            findings.add(cause, section, 10, ms)
            totals[cause, section] = totals.get((cause, section), 0.0) + ms
        expected = sorted(totals, key=lambda k: -totals[k])
        assert [(f.cause, f.section) for f in findings.ranked()] == expected
        assert [f.ms for f in findings.ranked()] == [totals[k] for k in expected]

    def test_equal_milliseconds_ranked_by_requests(self) -> None:
        """Of findings costing the same, the one of more requests ranks first."""
        findings = Findings()
        findings.add(Cause.TOOLS_CHANGED, "tools[1]:move", 5, 20.0)
        findings.add(Cause.HISTORY_REWRITTEN, "messages[1].content", 5, 10.0)
        findings.add(Cause.HISTORY_REWRITTEN, "messages[1].content", 5, 10.0)
        ranked = findings.ranked()
        assert [f.requests for f in ranked] == [2, 1]
        assert ranked[0].ms == ranked[1].ms

    def test_counts_requests_tokens_ms_and_latest_offset(self) -> None:
        """A finding sums its requests, tokens and milliseconds (unknown ones count 0) and
        keeps the latest known offset."""
        findings = Findings()
        findings.add(Cause.SYSTEM_PROMPT_CHANGED, "messages[0].content", 100, 25.0, 61)
        findings.add(Cause.SYSTEM_PROMPT_CHANGED, "messages[0].content", None, None, 64)
        findings.add(Cause.SYSTEM_PROMPT_CHANGED, "messages[0].content", 50, 12.5, None)
        [f] = findings.ranked()
        assert (f.requests, f.tokens, f.ms, f.offset) == (3, 150, 37.5, 64)

    def test_sections_kept_apart_except_for_sectionless_causes(self) -> None:
        """A change is counted per section; compaction and the cache's own causes are one
        finding each, without a section."""
        findings = Findings()
        for section in ("messages[1].content", "messages[3].content"):
            findings.add(Cause.HISTORY_REWRITTEN, section, 1, 1.0)
            for cause in (
                Cause.COMPACTION,
                Cause.SLOT_EVICTED,
                Cause.SLIDING_WINDOW,
                Cause.CACHE_PROMPT_OFF,
            ):
                findings.add(cause, section, 1, 1.0)
        by_cause: dict[Cause, list[str | None]] = {}
        for f in findings.ranked():
            by_cause.setdefault(f.cause, []).append(f.section)
        assert sorted(by_cause.pop(Cause.HISTORY_REWRITTEN), key=str) == [
            "messages[1].content",
            "messages[3].content",
        ]
        assert by_cause == {c: [None] for c in by_cause}
        assert len(by_cause) == 4

    def test_to_dict(self) -> None:
        """The ``/stats`` entry names the cause, section, offset, counts, the milliseconds
        to three decimals and the fix."""
        findings = Findings()
        findings.add(Cause.TOOLS_CHANGED, "tools[0]:grip", 12, 1.23456, 14)
        [f] = findings.ranked()
        assert f.to_dict() == {
            "cause": "tools_changed",
            "section": "tools[0]:grip",
            "offset": 14,
            "requests": 1,
            "lost_tokens": 12,
            "lost_ms": round(1.23456, 3),
            "fix": FIXES[Cause.TOOLS_CHANGED],
        }

    def test_limit_evicts_the_cheapest(self) -> None:
        """At the limit a new (cause, section) pair evicts the cheapest kept one; more of a
        kept pair evicts nothing."""
        findings = Findings(limit=3)
        costs = {"messages[1].content": 9.0, "messages[3].content": 1.0, "tools[0]:grip": 4.0}
        for section, ms in costs.items():
            findings.add(Cause.HISTORY_REWRITTEN, section, 1, ms)
        findings.add(Cause.HISTORY_REWRITTEN, "messages[1].content", 1, 1.0)
        assert len(findings.ranked()) == 3
        findings.add(Cause.SYSTEM_PROMPT_CHANGED, "messages[0].content", 1, 2.0)
        kept = {f.section for f in findings.ranked()}
        cheapest = min(costs, key=lambda s: costs[s])
        assert kept == (set(costs) - {cheapest}) | {"messages[0].content"}

    @given(
        limit=st.integers(1, 4),
        adds=st.lists(
            st.tuples(
                st.sampled_from(list(Cause)),
                st.sampled_from(["messages[0].content", "messages[1].content", "tools[0]:a"]),
                st.floats(0, 100, allow_nan=False),
            ),
            max_size=30,
        ),
    )
    def test_bounded_and_ranked(self, limit: int, adds: list[tuple[Cause, str, float]]) -> None:
        """Whatever is added, at most ``limit`` findings are kept, ranked by milliseconds,
        and the latest one added is among them."""
        findings = Findings(limit=limit)
        for cause, section, ms in adds:
            findings.add(cause, section, 1, ms)
            ranked = findings.ranked()
            assert len(ranked) <= limit
            assert [f.ms for f in ranked] == sorted((f.ms for f in ranked), reverse=True)
            assert cause in {f.cause for f in ranked}

    def test_a_session_ranks_the_costliest_cause_first(self) -> None:
        """Over a session the finding that cost the most milliseconds ranks first: a prompt
        resent with the system prompt's clock ticking each time, then once with a tool's
        description changed."""
        first = turns(1)[0]
        resends = 3
        agent = Agent()
        agent.send(first)
        for tick in range(1, resends + 1):
            agent.send(clock_changed(first, 5 + tick))
        changed = clock_changed(first, 5 + resends)
        changed["tools"][0]["function"]["description"] += " Slowly."
        agent.send(changed)
        ranked = agent.findings.ranked()
        assert [(f.cause, f.section, f.requests) for f in ranked] == [
            (Cause.SYSTEM_PROMPT_CHANGED, "messages[0].content", resends),
            (Cause.TOOLS_CHANGED, "tools[0]:move", 1),
        ]
        assert ranked[0].ms > ranked[1].ms > 0


def _lost(tokens: int | None, between: int = 0) -> Attribution:
    return Attribution(
        prefix_kind=PrefixKind.REWRITE,
        reusable_tokens=100,
        cache_lost_tokens=tokens,
        diverged_at=100,
        diverged_section="messages[0].content",
        diverged_offset=3,
        diverged_cost_ms=None,
        conversation="c1",
        turn=2,
        between=between,
    )


class TestCacheCause:
    @pytest.mark.parametrize(
        ("between", "expected"), [(0, Cause.SLIDING_WINDOW), (2, Cause.SLOT_EVICTED)]
    )
    def test_the_prefix_lost_beside_a_changed_prompt(self, between: int, expected: Cause) -> None:
        """A changed prompt whose reusable prefix was not reused either has a second cause
        for that prefix: a sliding window with nothing between, an eviction otherwise."""
        a = _lost(LOST_MIN_TOKENS, between)
        assert cache_cause_of(a, Cause.SYSTEM_PROMPT_CHANGED) is expected

    @pytest.mark.parametrize(
        "cause", [None, Cause.CACHE_PROMPT_OFF, Cause.SLOT_EVICTED, Cause.SLIDING_WINDOW]
    )
    def test_no_second_cause_when_the_first_explains_the_prefix(self, cause: Cause | None) -> None:
        """No second cause when there is no first one, or when the first is the cache's own
        (cache off, eviction, sliding window: the same loss)."""
        assert cache_cause_of(_lost(500), cause) is None

    @pytest.mark.parametrize("tokens", [None, 0, LOST_MIN_TOKENS - 1])
    def test_a_small_loss_is_the_servers_margin(self, tokens: int | None) -> None:
        """Fewer lost tokens than the threshold (or unknown) name no second cause."""
        assert cache_cause_of(_lost(tokens), Cause.TOOLS_CHANGED) is None


def test_dropped_section_names_the_reasoning_left_out() -> None:
    """The dropped section is the latest history reasoning the rendering lacks: the previous
    answer's, whose tokens the cache held."""
    missing = ("tools[3]:x", "messages[2].reasoning_content", "messages[4].reasoning_content")
    assert dropped_section(missing) == "messages[4].reasoning_content"
    assert dropped_section(("tools[0]:x",)) is None


class TestContextShift:
    def test_a_filled_context_names_the_shift(self) -> None:
        """Reusable tokens lost after the previous turn and its answer filled the context are
        a context shift, before an eviction or a sliding window; a context not filled, or
        of unknown size, is not."""
        for between in (0, 3):
            a = dataclasses.replace(
                _lost(LOST_MIN_TOKENS, between), prefix_kind=PrefixKind.EXTENDS, previous_extent=64
            )
            assert cause_of(a, cache_prompt=True, n_ctx=64) is Cause.CONTEXT_SHIFT
            assert cause_of(a, cache_prompt=True, n_ctx=65) is Cause.CONTEXT_SHIFT
            for n_ctx in (128, None):
                assert cause_of(a, cache_prompt=True, n_ctx=n_ctx) in (
                    Cause.SLIDING_WINDOW,
                    Cause.SLOT_EVICTED,
                )

    def test_the_previous_extent_is_the_matched_prompt_and_its_answer(self) -> None:
        """The attribution carries the matched prompt's tokens plus its answer's, once
        noted; unknown before."""
        history = PromptHistory(size=4)
        prompt = RenderedPrompt.build([1, 2, 3] * 4, [b"a", b"b", b"c"] * 4, "abc" * 4, {})
        first = history.attribute(prompt, offset=1, cache_n=0, ms_per_token=None)
        assert first.previous_extent is None
        history.answered(history.last_seq, predicted_n=60, prompt_tokens=13)
        again = history.attribute(prompt, offset=1, cache_n=0, ms_per_token=None)
        assert (again.previous_extent, again.previous_answer) == (73, 60)
