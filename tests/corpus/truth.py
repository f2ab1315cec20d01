"""The corpus's ground truth, computed without any of the proxy's code.

Each request body is put in the Chat Completions form llama-server's own converters give it
(``tests/corpus/chat_form.py``), rendered by llama-server's ``POST /apply-template`` (with and
without the generation prompt) and tokenized by ``POST /tokenize`` (``add_special`` and
``parse_special``: BOS counted, as ``cache_n`` counts it). The rendering must count what
llama-server evaluated (the response's own prompt tokens), or the truth is not trusted.

From two such prompts, plain loops give: the first differing token ``d``; whether the
earlier prompt up to its generation prompt is a prefix of the new one; where each prompt's
last turn starts; the section holding ``d``; and the earlier prompt's tokens after ``d`` that
the new prompt repeats, in runs of at least 16 tokens (a naive search of every run), each
holding at least 8 tokens of the request's own text. What
llama-server reused (``cache_n``), evaluated (``prompt_n``) and generated (``predicted_n``)
is read from the response bytes it sent, with ``json`` alone.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tests.corpus.chat_form import chat_form

__all__ = [
    "MIN_CONTENT",
    "RUN",
    "Prompt",
    "Served",
    "first_difference",
    "naive_repeated",
    "prompt_of",
    "relation",
    "repeated",
    "section_at",
    "served",
]

RUN = 16
"""The shortest run of an earlier prompt's tokens counted as repeated (the spec's figure)."""

MIN_CONTENT = 8
"""A run of repeated tokens counts only when this many of them are the request's own text,
not template markup (the spec's figure)."""

_ANSWERS = ("assistant", "tool", "function")
_SYSTEM = ("system", "developer")


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


# -- a prompt as llama-server evaluates it ----------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One prompt's tokens (BOS counted) and where its parts start."""

    tokens: tuple[int, ...]
    text: str
    chat: dict[str, Any]
    generation_start: int
    """The first token of the generation prompt (what ``add_generation_prompt`` adds)."""
    last_turn_start: int
    """The first token of the last turn (the generation prompt's when the turn holds no
    message)."""
    char_of_token: tuple[int, ...]
    """The character of ``text`` where each token after BOS starts."""
    bos: int


def _tokens(upstream: str, text: str) -> list[int]:
    answer = _post(
        upstream + "/tokenize", {"content": text, "add_special": True, "parse_special": True}
    )
    return [int(t) for t in answer["tokens"]]


def _char_starts(upstream: str, text: str) -> tuple[int, ...]:
    """Where each token of ``text`` (no BOS) starts, in characters, from its byte pieces."""
    answer = _post(
        upstream + "/tokenize",
        {"content": text, "add_special": False, "parse_special": True, "with_pieces": True},
    )
    data = text.encode()
    starts, at = [], 0
    for token in answer["tokens"]:
        piece = token["piece"]
        starts.append(len(data[:at].decode(errors="ignore")))
        at += len(piece.encode()) if isinstance(piece, str) else len(piece)
    assert at == len(data), "the pieces do not spell the text"
    return tuple(starts)


def _last_turn_message(messages: list[dict[str, Any]]) -> int:
    """The first message of the last turn: after the last answer (assistant or tool), else
    after the leading system messages; ``len(messages)`` when the turn holds none."""
    answered = [i for i, m in enumerate(messages) if m.get("role") in _ANSWERS]
    if answered:
        return answered[-1] + 1
    return next((i for i, m in enumerate(messages) if m.get("role") not in _SYSTEM), len(messages))


def _plain(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _token_at_char(upstream: str, text: str, char: int, tokens: list[int]) -> int:
    """The number of tokens (BOS counted) of ``text`` before character ``char``, checked to
    be a prefix of the whole text's ``tokens`` (``char`` is at a special token)."""
    head = _tokens(upstream, text[:char])
    assert tokens[: len(head)] == head, f"the tokens of the text before {char} are no prefix"
    return len(head)


def prompt_of(upstream: str, path: str, body: dict[str, Any]) -> Prompt:
    """The prompt llama-server evaluates for a request to ``path`` with ``body``."""
    chat = chat_form(path, body)
    text = str(_post(upstream + "/apply-template", chat)["prompt"])
    bare = str(
        _post(upstream + "/apply-template", {**chat, "add_generation_prompt": False})["prompt"]
    )
    assert text.startswith(bare), "the prompt without its generation prompt is no prefix"
    tokens = _tokens(upstream, text)
    generation = _token_at_char(upstream, text, len(bare), tokens)
    messages = chat["messages"]
    first = _last_turn_message(messages)
    if first < len(messages):
        # the last turn opens with its first message's role marker (ChatML: <|im_start|>)
        content = _plain(messages[first]["content"])
        at = text.rfind(content, 0, len(bare))
        assert at >= 0, "the last turn's first message is not in the rendering"
        last_turn = _token_at_char(upstream, text, text.rfind("<|im_start|>", 0, at), tokens)
    else:
        last_turn = generation
    bos = len(_tokens(upstream, ""))
    return Prompt(
        tuple(tokens), text, chat, generation, last_turn, _char_starts(upstream, text), bos
    )


# -- two prompts ------------------------------------------------------------------------------


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def relation(new: Prompt, earlier: Prompt) -> str:
    """How ``new`` relates to ``earlier`` by the spec's positions: ``retry``, ``extends``,
    ``branch`` (the difference in either last turn) or ``rewrite`` (before both; a
    compaction is a rewrite by position)."""
    if new.tokens == earlier.tokens:
        return "retry"
    d = first_difference(new.tokens, earlier.tokens)
    if d >= earlier.generation_start and len(new.tokens) > d:
        return "extends"
    if d >= new.last_turn_start or d >= earlier.last_turn_start:
        return "branch"
    return "rewrite"


def repeated(earlier: Prompt, new: Prompt, d: int) -> int:
    """The tokens of ``earlier`` after ``d`` (to its end) that ``new`` holds after ``d``, by
    :func:`naive_repeated` with the request's own text (:func:`content_of`)."""
    return naive_repeated(earlier.tokens, new.tokens, d, own=content_of(earlier))


def naive_repeated(
    earlier: Sequence[int],
    new: Sequence[int],
    start: int,
    stop: int | None = None,
    own: Sequence[int] | None = None,
) -> int:
    """From each token of ``earlier`` in ``[start, stop)`` (``stop``: its end), the longest
    run of ``earlier`` found anywhere in ``new[start:]`` (every place tried); one of at least
    :data:`RUN` tokens is counted and passed over, else the next position is tried. With
    ``own`` (1 for each token of the request's own text), a run counts only when it holds
    :data:`MIN_CONTENT` such tokens, or, starting outside a text or at its first token, all
    that remain before ``stop`` and at least one."""
    end = len(earlier) if stop is None else stop
    tail = new[start:]
    total, i = 0, start
    while i < end:
        longest = 0
        for j in range(len(tail)):
            n = 0
            while i + n < end and j + n < len(tail) and earlier[i + n] == tail[j + n]:
                n += 1
            longest = max(longest, n)
        counts = longest >= RUN
        if counts and own is not None:
            mid_text = i > 0 and own[i] == 1 and own[i - 1] == 1
            needed = MIN_CONTENT if mid_text else max(1, min(MIN_CONTENT, sum(own[i:end])))
            counts = sum(own[i : i + longest]) >= needed
        total, i = (total + longest, i + longest) if counts else (total, i + 1)
    return total


def content_of(prompt: Prompt) -> list[int]:
    """1 for each token (BOS counted) that starts inside the request's own text: a tool's
    JSON line, a message's reasoning, content or call arguments, found in order."""
    text, spans = prompt.text, []
    for tool in prompt.chat.get("tools", []):
        at = text.find(f'"name": "{tool["function"]["name"]}"')
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        spans.append((start, len(text) if end < 0 else end))
    cursor = 0
    for message in prompt.chat["messages"]:
        parts = [message.get("reasoning_content") or "", _plain(message.get("content") or "")]
        parts += [c["function"]["arguments"] for c in message.get("tool_calls") or []]
        for part in parts:
            at = text.find(part, cursor) if part else -1
            if at >= 0:
                spans.append((at, at + len(part)))
                cursor = at + len(part)
    out = [0] * prompt.bos
    for char in prompt.char_of_token:
        out.append(int(any(a <= char < b for a, b in spans)))
    return out


def section_at(prompt: Prompt, token: int) -> str:
    """The section of the request holding token ``token`` (BOS counted): each tool's line
    (``tools[i]:NAME``), each message's reasoning, content and tool calls, found in order in
    the rendering; a section owns the markup before its own text; after the last one, the
    ``generation_prompt``."""
    char = (
        prompt.char_of_token[token - prompt.bos]
        if token - prompt.bos < len(prompt.char_of_token)
        else len(prompt.text)
    )
    ends: list[tuple[int, str]] = []
    text = prompt.text
    for j, tool in enumerate(prompt.chat.get("tools", [])):
        name = tool["function"]["name"]
        at = text.find(f'"name": "{name}"')
        ends.append((text.find("\n", at), f"tools[{j}]:{name}"))
    cursor = 0
    for i, message in enumerate(prompt.chat["messages"]):
        parts = [
            ("reasoning_content", message.get("reasoning_content") or ""),
            ("content", _plain(message.get("content") or "")),
        ]
        parts += [
            (f"tool_calls[{k}]", call["function"]["arguments"])
            for k, call in enumerate(message.get("tool_calls") or [])
        ]
        for name, part in parts:
            at = text.find(part, cursor) if part else -1
            if at >= 0:
                cursor = at + len(part)
                ends.append((cursor, f"messages[{i}].{name}"))
    for end, name in sorted(ends):
        if char < end:
            return name
    return "generation_prompt"


# -- what llama-server did --------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """llama-server's own counts for one request."""

    cache_n: int
    prompt_n: int
    predicted_n: int

    @property
    def prompt_tokens(self) -> int:
        """Every prompt token, reused or evaluated."""
        return self.cache_n + self.prompt_n


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a response: its body, or each ``data:`` line of its stream."""
    text = raw.decode()
    if not text.lstrip().startswith(("data:", "event:")):
        return [json.loads(text)]
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            out.append(json.loads(line[5:]))
    return out


def _found(obj: Any, key: str) -> list[Any]:
    """Every value of ``key`` in ``obj``, depth first."""
    if isinstance(obj, dict):
        here = [obj[key]] if key in obj else []
        return here + [v for value in obj.values() for v in _found(value, key)]
    if isinstance(obj, list):
        return [v for value in obj for v in _found(value, key)]
    return []


def served(raw: bytes) -> Served:
    """The counts in a response (any of the three APIs, streamed or not): the last
    ``timings`` (Chat Completions, streamed Responses), else the usage (Responses:
    ``input_tokens`` counts every prompt token; Messages: ``input_tokens`` those
    evaluated, ``cache_read_input_tokens`` those reused)."""
    events = _events(raw)
    timings = [t for e in events for t in _found(e, "timings")]
    if timings:
        t = timings[-1]
        return Served(int(t["cache_n"]), int(t["prompt_n"]), int(t["predicted_n"]))
    usages = [u for e in events for u in _found(e, "usage") if isinstance(u, dict)]
    if any("cache_read_input_tokens" in u for u in usages):
        start = next(u for u in usages if "cache_read_input_tokens" in u)
        output = max(int(u.get("output_tokens", 0)) for u in usages)
        cached = int(start["cache_read_input_tokens"])
        return Served(cached, int(start["input_tokens"]), output)
    usage = usages[-1]
    cached = int(usage["input_tokens_details"]["cached_tokens"])
    return Served(cached, int(usage["input_tokens"]) - cached, int(usage["output_tokens"]))
