"""A Qwen3 chat template and a toy tokenizer, as llama-server renders and tokenizes prompts,
for the tests of prefix attribution (tests/core/test_prefix.py, test_lineage.py, test_findings.py).

The prompts are rendered as llama-server renders a Qwen3 chat template (the system turn holds
the tools, one JSON line each inside ``<tools>...</tools>``; the generation prompt is
``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``; reasoning is kept only for assistant turns
after the last user message) and tokenized by a toy tokenizer in the manner of Qwen's
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

from proxy.core.lineage import Attribution, PromptHistory, Rival
from proxy.core.prefix import RenderedPrompt

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
VOCAB: dict[bytes, int] = {}


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
    ids = [VOCAB.setdefault(p, len(VOCAB)) for p in pieces]
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
    model: str = "",
    rivals: Sequence[Rival] = (),
) -> Attribution:
    """``prompt`` attributed by ``history`` as the attributor does, at ``MS_PER_TOKEN``,
    with ``rivals`` in flight beside it when its prefill began."""
    return history.attribute(
        prompt,
        offset=offset,
        cache_n=cache_n,
        ms_per_token=MS_PER_TOKEN,
        conversation_id=conversation_id,
        model=model,
        rivals=rivals,
    )


def clock_changed(body: dict[str, Any], seconds: int = 7) -> dict[str, Any]:
    """``body`` with the system prompt's clock (at 22:41:05) at ``seconds`` past 22:41."""
    out = copy.deepcopy(body)
    content = out["messages"][0]["content"]
    assert "22:41:05" in content
    out["messages"][0]["content"] = content.replace("22:41:05", f"22:41:{seconds:02d}")
    return out
