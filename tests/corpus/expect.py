"""What the proxy must conclude of each corpus scenario's requests, and why.

Each function takes the scenario's recorded requests (as stored in its file) and gives its
description and, per server it is replayed on, one expectation per request (None for one
sent straight to llama-server). The servers are those of ``tests/real/test_corpus_real.py``:
``full`` (one slot, ``--swa-full --cache-ram 0``: a changed prompt is reused up to the
change, an evicted one stays evicted) and ``swa`` (one slot, ``--cache-ram 0``, Gemma 3's
sliding window as llama-server's default: a changed prompt resumes only from a context
checkpoint). The figures (lost tokens) are not here: the test computes them from
llama-server's own renderings and counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.corpus.common import Expect, Scenario, one_conversation

__all__ = ["EXPECTATIONS"]

Requests = list[dict[str, Any]]

FIRST = "The first prompt: nothing before it."
GROWS = (
    "the agent resends the history with the model's answer and the tool's result (or its "
    "next question) appended: the previous prompt up to its generation prompt is a prefix "
    "of this one, and llama-server reuses all of it."
)


def _turns(count: int, why: str) -> list[Expect | None]:
    """One conversation the proxy sees whole: cold, then each request extends the last."""
    out: list[Expect | None] = [Expect("cold", FIRST)]
    out += [Expect("extends", why, matched=i) for i in range(count - 1)]
    return one_conversation(out)


def openai_tool_loop(requests: Requests) -> Scenario:
    swa: list[Expect | None] = [Expect("cold", FIRST)]
    swa += [
        Expect(
            "extends",
            "The next turn of the loop, but on the sliding-window server llama-server resumes "
            "from a context checkpoint before the end of the shared prefix, with nothing "
            "between the turns: the rest is the window's loss.",
            matched=i,
            prefill_cause="sliding_window",
        )
        for i in range(len(requests) - 1)
    ]
    return Scenario(
        what="An append-only tool loop: call, tool result, next call (3 requests).",
        client="openai: chat.completions.create with tools, not streamed",
        replays={
            "full": _turns(len(requests), "The next turn: " + GROWS),
            "swa": one_conversation(swa),
        },
    )


def _agents(model: str) -> Any:
    def expect(requests: Requests) -> Scenario:
        assert len(requests) == 2, "the agent ended its run without calling the tool"
        return Scenario(
            what="A Runner.run of an agent with one function tool and no instructions: the "
            "model calls the tool, the SDK sends the call and its output back (max_turns=2: "
            "two model calls).",
            client=f"openai-agents: Runner.run, {model}",
            replays={
                "full": _turns(
                    2,
                    "The SDK resends the run so far with the call and its output appended: "
                    "the previous prompt is a prefix of this one.",
                )
            },
        )

    return expect


def langchain_tool_loop(requests: Requests) -> Scenario:
    return Scenario(
        what="A tool agent loop: ChatOpenAI.bind_tools invoked on the history, the AIMessage "
        "and a ToolMessage per call appended (3 requests, streamed).",
        client="langchain-openai: ChatOpenAI(streaming=True).bind_tools(...).invoke",
        replays={"full": _turns(len(requests), "The next turn: " + GROWS)},
    )


def anthropic_tool_loop(requests: Requests) -> Scenario:
    return Scenario(
        what="A tool loop on /v1/messages: the answer's content blocks appended as the "
        "assistant turn, then a user turn of tool_result blocks (3 requests).",
        client="anthropic: messages.create with tools",
        replays={
            "full": _turns(
                len(requests),
                "In llama-server's Chat Completions form the history only grows (tool_use "
                "blocks as tool calls, each tool_result a tool message): the previous prompt "
                "is a prefix of this one.",
            )
        },
    )


def robot_commands(requests: Requests) -> Scenario:
    full: list[Expect | None] = [
        Expect("cold", "The first command.", conversation="command 1", turn=1)
    ]
    full += [
        Expect(
            "branch",
            "An independent one-shot command: it shares the system prompt and the tools with "
            "the command before and differs in its own question, the last turn of both: a "
            "branch, a new conversation. llama-server reuses the shared prefix up to the "
            "question: nothing lost.",
            matched=i,
            diverged_section="messages[1].content",
            conversation=f"command {i + 2}",
            turn=1,
        )
        for i in range(len(requests) - 1)
    ]
    return Scenario(
        what="Four independent robot commands sharing a system prompt and two tools.",
        client="openai: chat.completions.create, a fresh message list per command",
        replays={"full": full},
    )


def _evicted(agent: str, other: str, matched: int, turn: int) -> Expect:
    return Expect(
        "extends",
        f"{agent}'s next turn extends its previous prompt, but {other} took the only slot in "
        f"between: llama-server reuses only the template tokens {other}'s prompt shares, and "
        "prefills the rest of the reusable prefix again.",
        matched=matched,
        prefill_cause="slot_evicted",
        conversation=agent,
        turn=turn,
    )


def _own_slot(agent: str, other: str, matched: int, turn: int) -> Expect:
    return Expect(
        "extends",
        f"{agent}'s next turn extends its previous prompt; {other} ran in between, on the "
        f"other slot: llama-server kept more of {agent}'s own prompt than {other}'s shares "
        "with it, so nothing was evicted. Gemma 3's sliding window resumes the cache only "
        "from a context checkpoint, before the previous answer: sliding_window.",
        matched=matched,
        prefill_cause="sliding_window",
        conversation=agent,
        turn=turn,
    )


def _a1_b1_a2_b2_a3(later: Callable[[str, str, int, int], Expect]) -> list[Expect | None]:
    """The two agents' first prompts, then ``later`` for each next turn."""
    cold_b = (
        "Agent B's system prompt differs from A's from its first word and its tools are "
        "others: nothing of A1 recurs in B1 but the template's own text (role markers, the "
        "tools preamble): another agent, a new conversation."
    )
    return [
        Expect("cold", "A's first prompt.", conversation="A", turn=1),
        Expect("cold", cold_b, conversation="B", turn=1),
        later("A", "B1", 0, 2),
        later("B", "A2", 1, 2),
        later("A", "B2", 2, 3),
    ]


def two_agents_interleaved(requests: Requests) -> Scenario:
    return Scenario(
        what="Two tool agents with their own system prompts and tools, interleaved: A1 B1 "
        "A2 B2 A3 (streamed), on a one-slot server without RAM cache, and on a two-slot "
        "sliding-window one.",
        client="openai: chat.completions.stream (two agents)",
        replays={"full": _a1_b1_a2_b2_a3(_evicted), "swa2": _a1_b1_a2_b2_a3(_own_slot)},
    )


def _clock_changed(matched: int, window: bool) -> Expect:
    why = (
        "The next turn, but the clock in the system prompt changed: the prompts differ "
        "before both last turns, in messages[0]; what the previous prompt held after the "
        "change (the tools, the history) is repeated and prefilled again."
    )
    if window:
        why += (
            " On the sliding-window server nothing before the change is reused either (no "
            "checkpoint that early, nothing between): the window's loss, the second cause."
        )
    return Expect(
        "rewrite",
        why,
        matched=matched,
        prefill_cause="system_prompt_changed",
        cache_lost_cause="sliding_window" if window else None,
        diverged_section="messages[0].content",
    )


def clock_in_system_prompt(requests: Requests) -> Scenario:
    return Scenario(
        what="A tool loop whose system prompt holds the current time to the millisecond, new "
        "on every call (3 requests).",
        client="openai: chat.completions.create, the system message rewritten before each call",
        replays={
            server: one_conversation(
                [Expect("cold", FIRST), _clock_changed(0, window), _clock_changed(1, window)]
            )
            for server, window in (("full", False), ("swa", True))
        },
    )


def reordered_tools(requests: Requests) -> Scenario:
    expects: list[Expect | None] = [
        Expect("cold", FIRST),
        Expect("extends", "The next turn, same tools.", matched=0),
        Expect(
            "rewrite",
            "The next turn, but the tools block (before the whole conversation) now opens "
            "with grip: the prompts differ in the first tool's line; the moved tools and the "
            "history are repeated after it and prefilled again.",
            matched=1,
            prefill_cause="tools_changed",
            diverged_section="tools[0]:grip",
        ),
        Expect("extends", "The next turn in the new order: nothing lost.", matched=2),
    ]
    return Scenario(
        what="A tool loop of 4 calls; from the third on the agent lists the same three tools "
        "in another order (grip first).",
        client="openai: chat.completions.create, tools reordered between calls",
        replays={"full": one_conversation(expects)},
    )


def trimmed_history(requests: Requests) -> Scenario:
    extends = "The next turn: the history still fits the trim, the previous prompt is a prefix."
    compaction = (
        "trim_messages dropped the oldest question and answer: the prompts differ at "
        "messages[1], before both last turns, and messages of the previous prompt are gone. "
        "What the previous prompt held after the change (the kept questions and answers) is "
        "prefilled again."
    )
    expects: list[Expect | None] = [
        Expect("cold", FIRST),
        Expect("extends", extends, matched=0),
        Expect("extends", extends, matched=1),
        Expect(
            "compaction",
            compaction,
            matched=2,
            prefill_cause="compaction",
            diverged_section="messages[1].content",
        ),
        Expect(
            "compaction",
            compaction + " Trimmed before every call: a compaction every turn.",
            matched=3,
            prefill_cause="compaction",
            diverged_section="messages[1].content",
        ),
    ]
    return Scenario(
        what="A 5-turn chat trimmed before every call by langchain_core.messages."
        "trim_messages(max_tokens=6, token_counter=len, strategy='last', include_system=True, "
        "start_on='human'): from the fourth call on, the oldest turn is dropped.",
        client="langchain-openai: ChatOpenAI.invoke on trim_messages(history)",
        replays={"full": one_conversation(expects)},
    )


def _dropped(matched: int, message: int) -> Expect:
    earlier = " (The answers before it lost theirs a turn earlier.)" if message > 2 else ""
    return Expect(
        "extends",
        "The next turn: the history grows, the previous prompt up to its generation prompt "
        f"is a prefix. But the previous answer (messages[{message}]) goes back with its "
        "reasoning_content, which the Qwen3 template drops before the last user question: "
        "the answer's generated tokens in the cache (its thinking first) are not in this "
        "prompt and are prefilled again." + earlier,
        matched=matched,
        prefill_cause="template_drops_history",
        diverged_section=f"messages[{message}].reasoning_content",
    )


def qwen3_thinking(requests: Requests) -> Scenario:
    later = [r["body"] for r in requests[1:]]
    assert all('"reasoning_content"' in body for body in later), "no reasoning went back"
    return Scenario(
        what="A planner chat with thinking on (3 requests): the model thinks (a grammar makes "
        "it open with <think>), llama-server returns the thought as reasoning_content, and "
        "the SDK's message object, reasoning included, is appended to the history.",
        client="openai: chat.completions.create, the answer's message object appended",
        replays={"full": one_conversation([Expect("cold", FIRST), _dropped(0, 2), _dropped(1, 4)])},
    )


def proxy_sees_part(requests: Requests) -> Scenario:
    assert [r["via"] for r in requests] == ["proxy", "direct", "proxy", "direct", "proxy"]
    return Scenario(
        what="Robot agents with the same tools; the proxy sees command X, the second turn of "
        "conversation Y (its first went straight to llama-server) and the second turn of a "
        "packing robot P (system prompt: the same plus a sentence; its first turn direct).",
        client="openai: chat.completions.create, two base URLs",
        replays={
            "full": [
                Expect("cold", FIRST, conversation="X", turn=1),
                None,
                Expect(
                    "branch",
                    "Y2 has history of its own, but the only prompt the proxy saw is X: they "
                    "differ in X's question (X's last turn), before Y2's last turn. Y2 "
                    "continued a conversation the proxy never saw: no cause from that "
                    "difference, and a conversation of its own.",
                    matched=0,
                    diverged_section="messages[1].content",
                    attribution_error="predecessor_unknown",
                    conversation="Y",
                    turn=1,
                ),
                None,
                Expect(
                    "rewrite",
                    "Against Y2, P2 differs at the end of the system prompt and repeats the "
                    "tools after it: a rewrite of messages[0]. But llama-server reused P1, "
                    "which the proxy never saw (cache_n far above the shared prefix): the "
                    "real predecessor is unknown, no cause.",
                    matched=2,
                    diverged_section="messages[0].content",
                    attribution_error="predecessor_unknown",
                ),
            ]
        },
    )


def chat_then_tools(requests: Requests) -> Scenario:
    return Scenario(
        what="One robot's three one-shot calls: a question with a system prompt, a tool call "
        "on another question with no system prompt, a third question with the first one's "
        "system prompt (one slot).",
        client="openai: chat.completions.create, a fresh message list per call",
        replays={
            "full": [
                Expect("cold", FIRST, conversation="question 1", turn=1),
                Expect(
                    "cold",
                    "Another task: the tool call shares only the template's header with the "
                    "first question. Its system block holds the tools where the first had "
                    "its system prompt, and its question is another; the template's markup "
                    "after the two questions' last character is the same, which is not the "
                    "first prompt repeated: no change to blame, a new conversation.",
                    conversation="tool call",
                    turn=1,
                ),
                Expect(
                    "branch",
                    "A new question after the first one's system prompt: a branch of the "
                    "first prompt, a new conversation. The tool call took the only slot in "
                    "between, so llama-server kept only the template header it shares and "
                    "prefilled the system prompt again: evicted.",
                    matched=0,
                    diverged_section="messages[1].content",
                    prefill_cause="slot_evicted",
                    conversation="question 3",
                    turn=1,
                ),
            ]
        },
    )


EXPECTATIONS = {
    "openai_tool_loop": openai_tool_loop,
    "agents_sdk_responses": _agents("OpenAIResponsesModel (/v1/responses)"),
    "agents_sdk_chat": _agents("OpenAIChatCompletionsModel (/v1/chat/completions)"),
    "langchain_tool_loop": langchain_tool_loop,
    "anthropic_tool_loop": anthropic_tool_loop,
    "chat_then_tools": chat_then_tools,
    "robot_commands": robot_commands,
    "two_agents_interleaved": two_agents_interleaved,
    "clock_in_system_prompt": clock_in_system_prompt,
    "reordered_tools": reordered_tools,
    "trimmed_history": trimmed_history,
    "qwen3_thinking": qwen3_thinking,
    "proxy_sees_part": proxy_sees_part,
}
"""Each scenario's expectations by the name of its file (``tests/corpus/NAME.json``)."""
