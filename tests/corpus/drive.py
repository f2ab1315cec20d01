"""The traffic of each corpus scenario: real clients driven against a base URL.

Each function runs one scenario's agents against ``proxy`` (the relay the proxy stands in
for on replay) and ``direct`` (requests that go straight to llama-server on replay too:
traffic the proxy never sees). What the proxy must conclude of that traffic is
``tests/corpus/expect.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.corpus.agents import AnthropicAgent, LangChainAgent, OpenAIAgent, agents_sdk_run
from tests.corpus.common import tools

__all__ = [
    "COMMANDS",
    "agents_sdk_chat",
    "agents_sdk_responses",
    "anthropic_tool_loop",
    "chat_then_tools",
    "clock_in_system_prompt",
    "langchain_tool_loop",
    "openai_tool_loop",
    "proxy_sees_part",
    "qwen3_thinking",
    "reordered_tools",
    "robot_commands",
    "trimmed_history",
    "two_agents_interleaved",
]

ROBOT = "Kitchen robot."
"""A trivial system prompt: with a sentence more (even "Use the tools.") Gemma 3 270M under
the Qwen3 template stops calling tools; the tool loops of the clients send none."""


def openai_tool_loop(proxy: str, direct: str) -> None:
    """A tool loop on the OpenAI SDK's ``chat.completions.create``: 3 requests."""
    agent = OpenAIAgent(
        proxy,
        [{"role": "user", "content": "What is the weather in Paris?"}],
        tools("get_weather", "move_arm"),
        follow_ups=["And in Berlin?", "And in Rome?"],
    )
    for _ in range(3):
        agent.ask()


def agents_sdk_responses(proxy: str, direct: str) -> None:
    """A ``Runner.run`` on the Agents SDK's Responses model, two model calls at most."""
    agents_sdk_run(proxy, True, "What is the weather in Paris?", turns=2)


def agents_sdk_chat(proxy: str, direct: str) -> None:
    """A ``Runner.run`` on the Agents SDK's Chat Completions model, two model calls at most."""
    agents_sdk_run(proxy, False, "What is the weather in Paris?", turns=2)


def langchain_tool_loop(proxy: str, direct: str) -> None:
    """A LangChain tool loop, streamed: 3 requests."""
    from langchain_core.messages import HumanMessage

    agent = LangChainAgent(
        proxy,
        [HumanMessage("Move the arm to x 10, y 20, z 5.")],
        tools("move_arm", "grip"),
        follow_ups=["Now grip with 15 newtons.", "Move the arm up to z 30."],
        streaming=True,
    )
    for _ in range(3):
        agent.ask()


def anthropic_tool_loop(proxy: str, direct: str) -> None:
    """A tool loop on the Anthropic SDK's ``messages.create``: 3 requests."""
    agent = AnthropicAgent(
        proxy,
        None,
        tools("get_weather", "grip"),
        [{"role": "user", "content": "What is the weather in Oslo?"}],
        follow_ups=["And in Madrid?", "And in Lisbon?"],
    )
    for _ in range(3):
        agent.ask()


COMMANDS = [
    "Move the arm to x 10, y 20, z 5.",
    "Move the arm to x 0, y 0, z 30.",
    "Grip with 15 newtons.",
    "Grip with 2 newtons.",
]
"""In this order each command shares the longest prefix with the one just before (or ties
with all earlier ones), so the prompt it is compared with is the last one sent."""


def robot_commands(proxy: str, direct: str) -> None:
    """Four one-shot commands sharing the system prompt and the tools."""
    for command in COMMANDS:
        OpenAIAgent(
            proxy,
            [{"role": "system", "content": ROBOT}, {"role": "user", "content": command}],
            tools("move_arm", "grip"),
        ).ask()


def two_agents_interleaved(proxy: str, direct: str) -> None:
    """Two tool agents with their own system prompts and tools, alternating: A1 B1 A2 B2
    A3, streamed."""
    a = OpenAIAgent(
        proxy,
        [
            {"role": "system", "content": "Kitchen robot."},
            {"role": "user", "content": "Move the arm to x 10, y 20, z 5."},
        ],
        tools("move_arm", "grip"),
        follow_ups=["Now grip with 15 newtons.", "Move the arm up to z 30."],
        stream=True,
    )
    b = OpenAIAgent(
        proxy,
        [
            {"role": "system", "content": "Warehouse drone."},
            {"role": "user", "content": "How many pallets are on shelf 3?"},
        ],
        tools("scan_shelf", "fly_to"),
        follow_ups=["Fly to aisle B.", "And shelf 4?"],
        stream=True,
    )
    for agent in (a, b, a, b, a):
        agent.ask()


def _clock(_: int) -> str:
    """The system prompt with the time of the call: as short as Gemma 3 270M still calls
    tools with."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"Kitchen robot ({now})."


def clock_in_system_prompt(proxy: str, direct: str) -> None:
    """A tool loop whose system prompt carries the time of each call: 3 requests."""
    agent = OpenAIAgent(
        proxy,
        [
            {"role": "system", "content": ""},
            {"role": "user", "content": "Move the arm to x 10, y 20, z 5."},
        ],
        tools("move_arm", "grip"),
        follow_ups=["Grip with 15 newtons.", "Move the arm to x 0, y 0, z 30."],
        system_at=_clock,
    )
    for _ in range(3):
        agent.ask()


TOOL_ORDERS = [
    ("get_weather", "move_arm", "grip"),
    ("get_weather", "move_arm", "grip"),
    ("grip", "get_weather", "move_arm"),
    ("grip", "get_weather", "move_arm"),
]


def reordered_tools(proxy: str, direct: str) -> None:
    """A tool loop of 4 calls whose tools array is in another order from the third on."""
    agent = OpenAIAgent(
        proxy,
        [{"role": "user", "content": "What is the weather in Paris?"}],
        None,
        follow_ups=["Grip with 15 newtons.", "Move the arm to x 0, y 0, z 30."],
        tools_at=lambda i: tools(*TOOL_ORDERS[i]),
    )
    for _ in TOOL_ORDERS:
        agent.ask()


QUESTIONS = [
    "Where are the cups?",
    "And the plates?",
    "Which shelf holds the bowls?",
    "Where do the knives go?",
    "Is the dishwasher empty?",
]


def trimmed_history(proxy: str, direct: str) -> None:
    """A LangChain chat whose history is trimmed before each call to the system prompt and
    the last messages (``trim_messages``): 5 requests."""
    from langchain_core.messages import HumanMessage, SystemMessage, trim_messages

    def trim(messages: list[Any]) -> list[Any]:
        return list(
            trim_messages(
                messages,
                max_tokens=6,
                token_counter=len,
                strategy="last",
                include_system=True,
                start_on="human",
            )
        )

    agent = LangChainAgent(
        proxy,
        [SystemMessage("Kitchen robot. Answer briefly."), HumanMessage(QUESTIONS[0])],
        follow_ups=QUESTIONS[1:],
        trim=trim,
    )
    for _ in QUESTIONS:
        agent.ask()


THINK = r'root ::= "<think>\n" [^<\n]{8,60} "\n</think>\n\n" [^<\n]{4,40}'
"""Gemma 3 270M does not think by itself: this grammar makes it open its answer with a
thought, as a thinking model does, which llama-server returns as ``reasoning_content``."""


def qwen3_thinking(proxy: str, direct: str) -> None:
    """A chat with thinking on (the template's default) whose answers, their
    ``reasoning_content`` included, go back in the history: 3 requests."""
    agent = OpenAIAgent(
        proxy,
        [
            {"role": "system", "content": "You are the planner robot."},
            {"role": "user", "content": "Plan a route to the door."},
        ],
        None,
        follow_ups=["Now to the window.", "And back to the charger."],
        extra={"extra_body": {"grammar": THINK}, "max_tokens": 48},
    )
    for _ in range(3):
        agent.ask()


def proxy_sees_part(proxy: str, direct: str) -> None:
    """Robot agents with the same tools of which the proxy sees only some calls: command
    X; Y's first turn direct, its second through the proxy; a packing robot's first turn
    direct (its system prompt: the same plus a sentence), its second through the proxy."""
    shared = tools("move_arm", "grip")
    OpenAIAgent(
        proxy,
        [
            {"role": "system", "content": ROBOT},
            {"role": "user", "content": "Grip with 15 newtons."},
        ],
        shared,
    ).ask()
    y = OpenAIAgent(
        direct,
        [
            {"role": "system", "content": ROBOT},
            {"role": "user", "content": "Move the arm to x 10, y 20, z 5."},
        ],
        shared,
        follow_ups=["Now grip with 15 newtons."],
    )
    y.ask()
    y.base = proxy
    y.ask()
    packer = OpenAIAgent(
        direct,
        [
            {"role": "system", "content": ROBOT + " You pack parcels."},
            {"role": "user", "content": "Grip with 5 newtons."},
        ],
        shared,
        follow_ups=["Move the arm to x 0, y 0, z 30."],
    )
    packer.ask()
    packer.base = proxy
    packer.ask()


ASSISTANT = "You are a helpful assistant on a warehouse robot. Answer briefly."


def chat_then_tools(proxy: str, direct: str) -> None:
    """Three one-shot calls of one robot: a question with a system prompt and no tools, a
    tool call on another question with the tools and no system prompt, then a third question
    with the first one's system prompt."""
    questions = ["What time is it?", "How many pallets are on shelf 3?", "Is the dock open?"]
    plain = [{"role": "system", "content": ASSISTANT}, {"role": "user", "content": questions[0]}]
    OpenAIAgent(proxy, plain, None).ask()
    OpenAIAgent(proxy, [{"role": "user", "content": questions[1]}], tools("scan_shelf")).ask()
    plain = [{"role": "system", "content": ASSISTANT}, {"role": "user", "content": questions[2]}]
    OpenAIAgent(proxy, plain, None).ask()
