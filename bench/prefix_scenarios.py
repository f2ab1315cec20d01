"""The prefill-miss scenarios of docs/attribution.md, through a fresh proxy, then ``report``.

Against a llama-server (provisioned, or ``--upstream URL``), a fresh ``timing-proxy serve``
logs these requests, then ``timing-proxy report`` prints its findings ("why prefill was
paid"):

* a robot controller whose system prompt holds a clock, three calls;
* an agent with five tools, then the same tools in another order;
* the same agent's next turn (its call and the result written into the history), then the
  same request again;
* a request with ``cache_prompt: false``.

    .venv/bin/python bench/prefix_scenarios.py [--upstream URL] [--log requests.jsonl]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from bench.api_records import _post, _proxy, _upstream  # noqa: E402

COMMON = {"temperature": 0, "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}}
TOOL = {**COMMON, "max_tokens": 48, "stop": ["</tool_call>"], "parallel_tool_calls": False}


def _fn(name: str, description: str, **params: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in params.items()},
                "required": list(params),
            },
        },
    }


TOOLS = [
    _fn("get_weather", "Get the current weather for a city.", city="string"),
    _fn("move_arm", "Move the gripper to a position in metres.", x="number", y="number"),
    _fn("grip", "Close the gripper with a force in newtons.", force="number"),
    _fn("release", "Open the gripper."),
    _fn("read_sensor", "Read one sensor channel.", channel="string"),
]


def _chat(base: str, body: dict[str, Any]) -> None:
    _post(base + "/v1/chat/completions", body)


def scenarios(base: str) -> None:
    """Send every scenario's requests, in order."""
    for second in (1, 2, 3):
        system = f"You are a robot arm controller. Time: 2026-11-30T22:40:0{second}Z. Be brief."
        _chat(base, {**COMMON, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Where is the gripper?"},
        ]})  # fmt: skip
    question = [
        {"role": "system", "content": "You are a helpful robot."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    _chat(base, {**TOOL, "messages": question, "tools": TOOLS})
    _chat(base, {**TOOL, "messages": question, "tools": [TOOLS[1], TOOLS[0], *TOOLS[2:]]})
    _chat(base, {**TOOL, "messages": question, "tools": TOOLS})
    # the next turn, with the call written into the history (the small model does not always
    # call a tool: the scenario must not depend on it), then the same request again
    weather = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    call = {"id": "call_1", "type": "function", "function": weather}
    turn = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    _chat(base, {**TOOL, "messages": turn, "tools": TOOLS})
    _chat(base, {**TOOL, "messages": turn, "tools": TOOLS})
    _chat(base, {**TOOL, "messages": question, "tools": TOOLS, "cache_prompt": False})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", help="a running llama-server (default: provision one)")
    parser.add_argument("--log", type=Path, help="keep the proxy's log here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with _upstream(args.upstream, folder) as url, _proxy(url, folder) as (base, log):
            scenarios(base)
            time.sleep(1.0)  # the last record is written once its look-ups joined it
        if args.log:
            args.log.write_bytes(log.read_bytes())
        subprocess.run(
            [sys.executable, "-m", "proxy", "report", str(args.log or log)],
            cwd=CHECKOUT,
            check=True,
        )


if __name__ == "__main__":
    main()
