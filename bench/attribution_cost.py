"""What prefix attribution costs per request: upstream look-up time and the proxy's CPU.

A 20-turn conversation with a 5-tool schema is rendered and tokenized by a real llama-server
(the look-ups the proxy makes for each new prompt: ``/apply-template``, then ``/tokenize``
with pieces), then attributed against a full history of 64 earlier prompts, as the proxy's
attributor does it, on this process's CPU clock.

    .venv/bin/python bench/attribution_cost.py                  # provisions llama-server
    .venv/bin/python bench/attribution_cost.py --upstream http://127.0.0.1:8080

Prints one JSON object per turn count: the look-ups' wall time (median of 5), and the CPU
time of parsing ``/tokenize``'s answer and building the prompt, and of attributing it against
the history (medians of 20).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from array import array
from pathlib import Path
from typing import Any

import orjson

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from bench.api_records import _upstream  # noqa: E402
from proxy.core.lineage import PromptHistory  # noqa: E402
from proxy.core.prefix import RenderedPrompt  # noqa: E402


def _tool(name: str, *params: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The robot's {name.replace('_', ' ')} action.",
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "number", "description": f"The {p}."} for p in params},
                "required": list(params),
            },
        },
    }


TOOLS = [
    _tool("move_arm", "x", "y", "z"),
    _tool("grip", "force"),
    _tool("release"),
    _tool("read_sensor", "channel"),
    _tool("drive", "speed", "heading"),
]


def conversation(turns: int) -> dict[str, Any]:
    """A chat body at turn ``turns``: each earlier turn a user request, the assistant's tool
    call and the tool's result, then this turn's request (so turn n extends turn n-1)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are the controller of a mobile robot arm."}
    ]
    for i in range(turns - 1):
        messages.append({"role": "user", "content": f"Step {i}: move the arm to the next bin."})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": "move_arm",
                            "arguments": json.dumps({"x": 0.1 * i, "y": 0.2, "z": 0.05}),
                        },
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"ok {i}"})
    messages.append({"role": "user", "content": f"Step {turns - 1}: move the arm to the next bin."})
    return {
        "messages": messages,
        "tools": TOOLS,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _lookups(base: str, chat: dict[str, Any]) -> tuple[float, str, list[Any]]:
    """One rendering and tokenization, as the attributor makes them: ms, text, tokens."""
    t0 = time.perf_counter()
    text = str(_post(base + "/apply-template", chat)["prompt"])
    tokens = _post(
        base + "/tokenize",
        {"content": text, "add_special": False, "parse_special": True, "with_pieces": True},
    )["tokens"]
    return (time.perf_counter() - t0) * 1000, text, tokens


def _build(text: str, tokens: list[Any], chat: dict[str, Any]) -> RenderedPrompt:
    ids = [int(t["id"]) for t in tokens]
    pieces = [p.encode() if isinstance(p := t["piece"], str) else bytes(p) for t in tokens]
    return RenderedPrompt.build(ids, pieces, text, chat)


def measure(base: str, turns: int) -> dict[str, Any]:
    """Look-up wall time and CPU time of building and attributing one prompt."""
    chat = conversation(turns)
    walls: list[float] = []
    text, tokens = "", list[Any]()
    for _ in range(5):
        wall, text, tokens = _lookups(base, chat)
        walls.append(wall)
    # a full history: the previous turn, and 63 prompts of other conversations (the same
    # tokens with their first ones changed, so each is compared at full length)
    previous = conversation(turns - 1)
    _, ptext, ptokens = _lookups(base, previous)
    before = _build(ptext, ptokens, previous)
    history = PromptHistory(size=64)
    for i in range(63):
        filler = dataclasses.replace(
            before, tokens=array("I", [i, i]).tobytes() + before.tokens[8:]
        )
        history.attribute(filler, offset=1, cache_n=None, ms_per_token=None)
    history.attribute(before, offset=1, cache_n=None, ms_per_token=None)
    builds, attributions = [], []
    kind = ""
    raw = orjson.dumps({"tokens": tokens})  # /tokenize's answer, as the attributor reads it
    for _ in range(20):
        t0 = time.process_time()
        prompt = _build(text, orjson.loads(raw)["tokens"], chat)
        t1 = time.process_time()
        fresh = copy.deepcopy(history)  # the same full history
        t2 = time.process_time()
        kind = str(fresh.attribute(prompt, offset=1, cache_n=0, ms_per_token=1.0).prefix_kind)
        t3 = time.process_time()
        builds.append((t1 - t0) * 1000)
        attributions.append((t3 - t2) * 1000)
    return {
        "turns": turns,
        "prompt_tokens": len(tokens) + 1,
        "lookups_wall_ms_p50": round(statistics.median(walls), 2),
        "tokenize_bytes": len(raw),
        "parse_and_build_cpu_ms_p50": round(statistics.median(builds), 3),
        "attribute_cpu_ms_p50": round(statistics.median(attributions), 3),
        "matched_kind": kind,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", help="a running llama-server (default: provision one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, _upstream(args.upstream, Path(tmp)) as base:
        for turns in (2, 20):
            print(json.dumps(measure(base, turns)), flush=True)


if __name__ == "__main__":
    main()
