"""What the corpus scenarios share: the model's settings for tool calls, the robot tools and
what they answer, and the expectation entries written into each scenario file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "CHAT_ARGS",
    "MODEL",
    "NO_THINKING",
    "STOP",
    "TOOLS",
    "TOOL_ARGS",
    "Expect",
    "Scenario",
    "one_conversation",
    "run_tool",
    "tools",
]

MODEL = "gemma-3-270m"
NO_THINKING: dict[str, Any] = {"enable_thinking": False}
STOP = ["</tool_call>"]
TOOL_ARGS: dict[str, Any] = {
    "temperature": 0,
    "max_tokens": 40,
    "stop": STOP,
    "parallel_tool_calls": False,
    "extra_body": {"chat_template_kwargs": NO_THINKING},
}
"""The OpenAI SDK's arguments of a tool request: Gemma 3 270M calls tools under the Qwen3
template at temperature 0 without thinking, stopped at the end of its first call; 40
tokens hold one call."""
CHAT_ARGS: dict[str, Any] = {
    "temperature": 0,
    "max_tokens": 16,
    "extra_body": {"chat_template_kwargs": NO_THINKING},
}
"""A short plain chat answer."""


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }


TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": _function(
        "get_weather", "Get the current weather in a city.", {"city": {"type": "string"}}
    ),
    "move_arm": _function(
        "move_arm",
        "Move the robot arm to a position in centimetres.",
        {"x": {"type": "number"}, "y": {"type": "number"}, "z": {"type": "number"}},
    ),
    "grip": _function(
        "grip", "Close the gripper with a force in newtons.", {"force": {"type": "number"}}
    ),
    "scan_shelf": _function(
        "scan_shelf", "Count the pallets on a warehouse shelf.", {"shelf": {"type": "integer"}}
    ),
    "fly_to": _function(
        "fly_to", "Fly the drone to a warehouse aisle.", {"aisle": {"type": "string"}}
    ),
}


def tools(*names: str) -> list[dict[str, Any]]:
    """The named tools in Chat Completions form, in that order."""
    return [TOOLS[name] for name in names]


def run_tool(name: str, arguments: str | dict[str, Any]) -> str:
    """What the robot answers to a call (whatever the model put in the arguments)."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    except ValueError:
        return "error: the arguments are not JSON"
    if not isinstance(args, dict):
        return "error: the arguments are not an object"
    answers = {
        "get_weather": lambda: f"18 C and light rain in {args.get('city', 'the city')}.",
        "move_arm": lambda: f"The arm is at x={args.get('x')} y={args.get('y')} z={args.get('z')}.",
        "grip": lambda: f"The gripper closed with {args.get('force')} N and holds the part.",
        "scan_shelf": lambda: f"Shelf {args.get('shelf')} holds 12 pallets, 2 are missing.",
        "fly_to": lambda: f"The drone hovers over aisle {args.get('aisle')}.",
    }
    answer = answers.get(name)
    return answer() if answer is not None else f"error: no tool named {name}"


@dataclass(frozen=True)
class Expect:
    """What the proxy must conclude for one request it sees, and why that is right."""

    prefix_kind: str
    why: str
    matched: int | None = None
    """The index (in the scenario's requests) of the earlier prompt the request is compared
    with: its real predecessor, or the prompt it shares its prefix with."""
    prefill_cause: str | None = None
    cache_lost_cause: str | None = None
    diverged_section: str | None = None
    attribution_error: str | None = None
    conversation: str | None = None
    """The scenario's own name of the request's conversation: requests of one name must be
    in one conversation of the proxy, requests of two names in two (None: not checked)."""
    turn: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The scenario file's entry."""
        return {
            "prefix_kind": self.prefix_kind,
            "matched": self.matched,
            "prefill_cause": self.prefill_cause,
            "cache_lost_cause": self.cache_lost_cause,
            "diverged_section": self.diverged_section,
            "attribution_error": self.attribution_error,
            "conversation": self.conversation,
            "turn": self.turn,
            "why": self.why,
        }


def one_conversation(expects: list[Expect | None], name: str = "a") -> list[Expect | None]:
    """``expects`` as the turns 1, 2, ... of one conversation."""
    return [
        replace(e, conversation=name, turn=turn) if e is not None else None
        for turn, e in enumerate(expects, start=1)
    ]


@dataclass
class Scenario:
    """A recorded scenario's description and, per server it is replayed on, what the proxy
    must conclude for each request (None for one sent straight to llama-server)."""

    what: str
    client: str
    replays: dict[str, list[Expect | None]] = field(default_factory=dict)
