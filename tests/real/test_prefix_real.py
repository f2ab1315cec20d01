"""Prefix attribution against the real llama-server and Gemma 3 270M (Qwen3 chat template).

Every scenario runs through a proxy of its own (``python -m proxy serve``, fresh prompt
history, findings and conversations), so the tests do not see each other's prompts. The
expected divergence is computed here, independently of the proxy: both request bodies are
rendered by llama-server's ``POST /apply-template``, tokenized by ``POST /tokenize``
(``add_special`` and ``parse_special`` on, so BOS counts as ``cache_n`` counts it), the first
differing token index is the expected ``diverged_at``, and the expected section is found by
locating the first differing character in the rendered text (a message's content, or the
line of one tool's JSON).

Servers: the session's ``llama_server`` (one slot, 4096 ctx, llama-server's defaults: Gemma
3 is a sliding-window model, so a prompt changed mid-way is resumed only from a context
checkpoint near its end; the RAM prompt cache is on), and one of this module's own started
with ``--swa-full --cache-ram 0``: a full-size sliding-window cache (a changed prompt is
reused up to the change) and no RAM prompt cache (an evicted prompt stays evicted).
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxy.commands.provision import LlamaServer
from proxy.core.findings import LOST_MIN_TOKENS
from proxy.serve.accounting import REFERENCE_MIN_TOKENS
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama import LlamaArtifacts, started_llama_server
from tests.llama_variants import post_json
from tests.terminal import terminal_log

pytestmark = pytest.mark.real

SWA_FULL_ARGS = ("--swa-full", "--cache-ram", "0")
CHAT: dict[str, Any] = {
    "temperature": 0,
    "max_tokens": 1,
    "chat_template_kwargs": {"enable_thinking": False},
}
"""One token: these tests need the prompt evaluated, not an answer (on a busy machine each
decoded token of llama-server costs more than the whole prefill)."""
TOOL_REQUEST: dict[str, Any] = {**CHAT, "stop": ["</tool_call>"], "parallel_tool_calls": False}
"""A tool request as the model needs it; no call is wanted (the history holds one where a
test needs it)."""
RECORD_WAIT_S = 60.0
"""The record is written after the prompt's renderings: bounded by the look-up timeouts."""


def _nonce() -> str:
    return uuid.uuid4().hex[:8]


# -- the independent expectation --------------------------------------------------------------


def _render(upstream: str, body: dict[str, Any]) -> str:
    """The prompt text llama-server's template makes of ``body``."""
    answer, _ = post_json(upstream + "/apply-template", body)
    return str(answer["prompt"])


def _tokens(upstream: str, text: str) -> list[int]:
    """The token ids of ``text`` with BOS, special tokens parsed (as the server evaluates)."""
    body = {"content": text, "add_special": True, "parse_special": True}
    answer, _ = post_json(upstream + "/tokenize", body)
    return [int(t) for t in answer["tokens"]]


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _tool_line_section(body: dict[str, Any], line: str) -> str | None:
    """``tools[i]:NAME`` when ``line`` is one of the body's tools as JSON (one per line)."""
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    name = parsed.get("function", {}).get("name") if isinstance(parsed, dict) else None
    names = [t["function"]["name"] for t in body.get("tools", [])]
    return f"tools[{names.index(name)}]:{name}" if name in names else None


def _section_holding(body: dict[str, Any], text: str, char: int) -> tuple[str, int]:
    """The part of ``body`` whose text in the rendering ``text`` holds character ``char``
    (one tool's JSON line, or a message's content, looked for in order; else whatever the
    template wrote there) and the character where that text starts."""
    line_start = text.rfind("\n", 0, char) + 1
    line_end = text.find("\n", char)
    line = text[line_start : len(text) if line_end < 0 else line_end]
    tool = _tool_line_section(body, line)
    if tool is not None:
        return tool, line_start
    cursor = 0
    for i, message in enumerate(body["messages"]):
        content = message.get("content")
        if not isinstance(content, str) or not content:
            continue
        at = text.find(content, cursor)
        if at < 0:
            continue
        if at <= char < at + len(content):
            return f"messages[{i}].content", at
        cursor = at + len(content)
    return "template markup", char


def _token_start(upstream: str, text: str, index: int, bos: int) -> int:
    """The character of ``text`` where token ``index`` (``bos`` tokens counted before the
    text) starts, from the pieces ``/tokenize`` gives (the prompts here are ASCII)."""
    body = {"content": text, "add_special": False, "parse_special": True, "with_pieces": True}
    answer, _ = post_json(upstream + "/tokenize", body)
    pieces = [t["piece"] for t in answer["tokens"]]
    assert all(isinstance(p, str) and p.isascii() for p in pieces)
    return sum(len(p) for p in pieces[: index - bos])


@dataclass(frozen=True)
class Expected:
    """Where the second prompt stops matching the first, found without the proxy."""

    diverged_at: int
    """First differing token index, BOS counted."""
    section: str
    offset: int
    """Where that token starts in the section's own text (0: in the markup before it)."""
    before_tokens: int
    after_tokens: int


def _expected(upstream: str, before: dict[str, Any], after: dict[str, Any]) -> Expected:
    text_a, text_b = _render(upstream, before), _render(upstream, after)
    tokens_a, tokens_b = _tokens(upstream, text_a), _tokens(upstream, text_b)
    diverged_at = _first_difference(tokens_a, tokens_b)
    section, start = _section_holding(after, text_b, _first_difference(text_a, text_b))
    token_start = _token_start(upstream, text_b, diverged_at, len(_tokens(upstream, "")))
    return Expected(
        diverged_at=diverged_at,
        section=section,
        offset=max(0, token_start - start),
        before_tokens=len(tokens_a),
        after_tokens=len(tokens_b),
    )


def _repeated(upstream: str, before: dict[str, Any], after: dict[str, Any]) -> int:
    """What ``before`` had after the first difference that ``after`` repeats after that
    point: from each token of ``before``, the longest run found anywhere in ``after``'s rest,
    counted and passed over when 16 tokens or more (a naive search over /tokenize's ids; the
    scenarios' runs all hold the request's own text)."""
    tokens_a = _tokens(upstream, _render(upstream, before))
    tokens_b = _tokens(upstream, _render(upstream, after))
    start = _first_difference(tokens_a, tokens_b)
    rest, total, i = tokens_b[start:], 0, start
    while i < len(tokens_a):
        longest = 0
        for j in range(len(rest)):
            n = 0
            while i + n < len(tokens_a) and j + n < len(rest) and tokens_a[i + n] == rest[j + n]:
                n += 1
            longest = max(longest, n)
        total, i = (total + longest, i + longest) if longest >= 16 else (total, i + 1)
    return total


# -- the proxy under test ---------------------------------------------------------------------

PREFIX_FIELDS = (
    "prefix_kind",
    "prefill_lost_tokens",
    "reusable_tokens",
    "cache_n",
    "prompt_n",
    "prompt_tokens",
    "cache_lost_tokens",
    "diverged_at",
    "diverged_section",
    "diverged_offset",
    "diverged_cost_ms",
    "prefill_cause",
    "prefill_lost_ms",
    "conversation",
    "turn",
    "attribution_error",
)


@dataclass
class Lab:
    """A proxy of the test's own in front of ``upstream``, and the records it wrote."""

    proxy: ProxyProcess
    upstream: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def ask(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Send a Chat Completions request through the proxy: its record and the answer."""
        answer, request_id = post_json(self.proxy.url + "/v1/chat/completions", body)
        assert request_id is not None
        record = self.proxy.record(request_id, within=RECORD_WAIT_S)
        self.records.append(record)
        return record, answer

    def findings(self) -> list[dict[str, Any]]:
        """``/stats`` ``cache.findings``, ranked."""
        with urllib.request.urlopen(self.proxy.admin_url + "/stats", timeout=30) as response:
            findings: list[dict[str, Any]] = json.loads(response.read())["cache"]["findings"]
        return findings

    def shown(self) -> str:
        """The records' prefix fields, for assertion messages."""
        rows = [{k: r.get(k) for k in PREFIX_FIELDS} for r in self.records]
        return "\n".join(json.dumps(row) for row in rows)


def reference_rate(before: Sequence[dict[str, Any]], record: dict[str, Any]) -> float:
    """The prefill ms per token the proxy prices ``record`` at: the latest earlier record
    that prefilled at least ``REFERENCE_MIN_TOKENS``, else the record's own rate."""
    for earlier in reversed(before):
        if (earlier["prompt_n"] or 0) >= REFERENCE_MIN_TOKENS and earlier["prefill_ms"]:
            return float(earlier["prefill_ms"]) / float(earlier["prompt_n"])
    return float(record["prefill_ms"]) / float(record["prompt_n"])


@pytest.fixture
def on_session_server(llama_server: LlamaServer, tmp_path: Path) -> Iterator[Lab]:
    """A fresh proxy in front of the session's llama-server (sliding window, RAM cache on)."""
    with proxy_in_front_of(llama_server.url, tmp_path / "proxy") as proxy:
        yield Lab(proxy, llama_server.url)


@pytest.fixture(scope="module")
def swa_full_server(
    llama_artifacts: LlamaArtifacts,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[LlamaServer]:
    """A one-slot llama-server with ``--swa-full --cache-ram 0``."""
    with started_llama_server(
        llama_artifacts,
        tmp_path_factory.mktemp("llama-swa-full"),
        SWA_FULL_ARGS,
        log=terminal_log(request.config, "llama-server swa-full"),
    ) as server:
        yield server


@pytest.fixture
def on_swa_full(swa_full_server: LlamaServer, tmp_path: Path) -> Iterator[Lab]:
    """A fresh proxy in front of the ``--swa-full --cache-ram 0`` llama-server."""
    with proxy_in_front_of(swa_full_server.url, tmp_path / "proxy") as proxy:
        yield Lab(proxy, swa_full_server.url)


# -- request bodies ---------------------------------------------------------------------------


def _clock_body(nonce: str, second: int) -> dict[str, Any]:
    """A chat whose system prompt carries a clock (the one value that changes per call)."""
    system = (
        f"You are robot arm controller {nonce}. "
        f"Current time: 2026-11-30T22:40:{second:02d}.{second * 37 % 1000:03d}Z. "
        "Answer briefly."
    )
    return {
        **CHAT,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Where is the gripper?"},
        ],
    }


def _tools(nonce: str) -> list[dict[str, Any]]:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": f"Get the current weather for a city (station {nonce}).",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    grip = {
        "type": "function",
        "function": {
            "name": "grip",
            "description": "Close the gripper with a force in newtons.",
            "parameters": {"type": "object", "properties": {"force": {"type": "number"}}},
        },
    }
    return [weather, grip]


def _tool_body(nonce: str, tools: list[dict[str, Any]], *later: dict[str, Any]) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": f"You are robot {nonce}. Use the tools."},
        {"role": "user", "content": "What is the weather in Paris?"},
        *later,
    ]
    return {**TOOL_REQUEST, "tools": tools, "messages": messages}


def _plain_body(nonce: str) -> dict[str, Any]:
    return {
        **CHAT,
        "messages": [
            {
                "role": "system",
                "content": f"You are the kitchen robot {nonce}. You fetch cups and plates "
                "and say where each item is.",
            },
            {"role": "user", "content": "Where are the cups?"},
        ],
    }


# -- the scenarios ----------------------------------------------------------------------------


def _assert_clock_rewrite(record: dict[str, Any], expected: Expected, shown: str) -> None:
    assert record["prefix_kind"] == "rewrite", shown
    assert record["diverged_at"] == expected.diverged_at, shown
    assert record["diverged_section"] == expected.section == "messages[0].content", shown
    assert record["diverged_offset"] == expected.offset, shown
    assert record["prompt_tokens"] == expected.after_tokens, shown
    assert record["reusable_tokens"] == expected.diverged_at, shown
    assert record["prefill_cause"] == "system_prompt_changed", shown


def test_clock_in_system_prompt_is_a_rewrite_of_messages_0(on_swa_full: Lab) -> None:
    """(a) A timestamp in the system prompt, changed on each call: each later call is a
    ``rewrite`` diverging at the independently computed token in ``messages[0].content``,
    cause ``system_prompt_changed``, ranked first in ``/stats`` ``cache.findings`` with the
    two calls' totals. It lost what the earlier prompt had after the clock and this one
    repeats (computed independently), never the changed digits; ``diverged_cost_ms`` is all
    the tokens after the divergence. Both are priced at the proxy's reference rate, the cold
    call's prefill ms per token: the rewrites prefill fewer tokens than the reference needs
    (on the ``--swa-full`` server, where a rewrite is reused up to the change; the session
    server prefills all of it and the rate moves with each call)."""
    lab = on_swa_full
    nonce = _nonce()
    bodies = [_clock_body(nonce, second) for second in (1, 2, 3)]
    cold, _ = lab.ask(bodies[0])
    assert cold["prefix_kind"] == "cold", lab.shown()
    rewrites = [lab.ask(body)[0] for body in bodies[1:]]
    rates = []
    for i, record in enumerate(rewrites):
        expected = _expected(lab.upstream, bodies[i], bodies[i + 1])
        _assert_clock_rewrite(record, expected, lab.shown())
        after = record["prompt_tokens"] - record["diverged_at"]
        lost = _repeated(lab.upstream, bodies[i], bodies[i + 1])
        assert LOST_MIN_TOKENS <= lost < after, lab.shown()
        assert record["prefill_lost_tokens"] == lost, lab.shown()
        assert record["prompt_n"] < REFERENCE_MIN_TOKENS, lab.shown()
        rate = reference_rate(lab.records[: lab.records.index(record)], record)
        assert record["diverged_cost_ms"] == pytest.approx(after * rate, rel=1e-4, abs=0.01)
        assert record["prefill_lost_ms"] == pytest.approx(lost * rate, rel=1e-4, abs=0.01)
        rates.append(record["diverged_cost_ms"] / after)
    assert rates[0] > 0
    assert rates[0] == pytest.approx(rates[1], rel=1e-4)
    assert rates[0] == pytest.approx(cold["prefill_ms"] / cold["prompt_n"], rel=1e-4)
    top = lab.findings()[0]
    assert (top["cause"], top["section"]) == ("system_prompt_changed", "messages[0].content")
    assert top["requests"] == 2
    assert top["offset"] == rewrites[-1]["diverged_offset"]
    assert top["lost_tokens"] == sum(r["prefill_lost_tokens"] for r in rewrites)
    assert top["lost_ms"] == pytest.approx(sum(r["prefill_lost_ms"] for r in rewrites), abs=0.01)
    assert "system prompt" in top["fix"]


def test_reordered_tools_name_the_first_moved_tool(on_session_server: Lab) -> None:
    """(b) The same tools sent in another order: a ``rewrite`` at the independently computed
    token, in the section of the first tool that moved (``tools[0]:grip``), cause
    ``tools_changed``."""
    lab = on_session_server
    nonce = _nonce()
    weather, grip = _tools(nonce)
    first, second = _tool_body(nonce, [weather, grip]), _tool_body(nonce, [grip, weather])
    cold, _ = lab.ask(first)
    record, _ = lab.ask(second)
    expected = _expected(lab.upstream, first, second)
    assert cold["prefix_kind"] == "cold", lab.shown()
    assert (cold["prompt_tokens"], record["prompt_tokens"]) == (
        expected.before_tokens,
        expected.after_tokens,
    ), lab.shown()
    assert record["prefix_kind"] == "rewrite", lab.shown()
    assert record["diverged_at"] == expected.diverged_at, lab.shown()
    assert record["diverged_section"] == expected.section == "tools[0]:grip", lab.shown()
    assert record["diverged_offset"] == expected.offset, lab.shown()
    assert record["prefill_cause"] == "tools_changed", lab.shown()
    assert record["prefill_lost_tokens"] == _repeated(lab.upstream, first, second), lab.shown()
    assert record["prefill_lost_tokens"] > 0, lab.shown()
    assert record["conversation"] == cold["conversation"], lab.shown()
    # the prefix before the change, not reused on this sliding-window server, is its own
    # finding (its fix is --swa-full), when it is long enough to name
    window = record["cache_lost_tokens"] >= LOST_MIN_TOKENS
    assert record["cache_lost_cause"] == ("sliding_window" if window else None), lab.shown()
    assert sorted(f["cause"] for f in lab.findings()) == sorted(
        ["tools_changed", *(["sliding_window"] if window else [])]
    )


def _tool_turns(nonce: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A tool conversation: the call turn, then the same history with the assistant's call
    and the tool's result appended (the call is written here, not taken from the model, so
    the prompt is the same on every run)."""
    tools = _tools(nonce)
    call = {
        "id": f"call_{nonce}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    first = _tool_body(nonce, tools)
    second = _tool_body(
        nonce,
        tools,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C, light rain"},
    )
    return first, second


def _assert_next_turn(
    lab: Lab, turn1: dict[str, Any], turn2: dict[str, Any], expected: Expected
) -> None:
    assert (turn1["prefix_kind"], turn1["turn"]) == ("cold", 1), lab.shown()
    assert turn1["prompt_tokens"] == expected.before_tokens, lab.shown()
    assert turn2["prompt_tokens"] == expected.after_tokens, lab.shown()
    assert turn2["prefix_kind"] == "extends", lab.shown()
    assert (turn2["conversation"], turn2["turn"]) == (turn1["conversation"], 2), lab.shown()
    assert turn2["reusable_tokens"] == expected.diverged_at, lab.shown()
    assert turn2["diverged_at"] is None and turn2["diverged_section"] is None, lab.shown()


def test_tool_result_turn_extends_the_call_turn(on_swa_full: Lab) -> None:
    """(c) A tool conversation (call turn, then call and result appended): the second turn
    ``extends`` the first, the same ``conversation``, ``turn`` 2, ``reusable_tokens`` the
    independently computed shared prefix, and nothing lost to name (no ``prefill_cause``,
    no finding). On the ``--swa-full`` server: on the session's sliding-window server the
    same turn loses the tokens after llama-server's last context checkpoint (next test)."""
    lab = on_swa_full
    first, second = _tool_turns(_nonce())
    turn1, _ = lab.ask(first)
    turn2, _ = lab.ask(second)
    _assert_next_turn(lab, turn1, turn2, _expected(lab.upstream, first, second))
    assert turn2["cache_n"] == turn2["reusable_tokens"], lab.shown()
    assert turn2["prefill_cause"] is None, lab.shown()
    assert lab.findings() == []


def test_tool_result_turn_on_sliding_window_server_names_the_window(
    on_session_server: Lab,
) -> None:
    """(c, h) The same tool conversation on the session's server (Gemma 3 without
    ``--swa-full``): the second turn still ``extends`` the first, but llama-server resumes
    only from a context checkpoint before the end of the shared prefix, with no other
    prompt in between, so the cause is ``sliding_window``: its lost tokens are
    ``reusable_tokens - cache_n`` and its finding carries the ``--swa-full`` fix."""
    lab = on_session_server
    first, second = _tool_turns(_nonce())
    turn1, _ = lab.ask(first)
    turn2, _ = lab.ask(second)
    _assert_next_turn(lab, turn1, turn2, _expected(lab.upstream, first, second))
    lost = turn2["reusable_tokens"] - turn2["cache_n"]
    assert turn2["cache_lost_tokens"] == lost >= LOST_MIN_TOKENS, lab.shown()
    assert turn2["prefill_cause"] == "sliding_window", lab.shown()
    (finding,) = lab.findings()
    assert (finding["cause"], finding["lost_tokens"]) == ("sliding_window", lost)
    assert "--swa-full" in finding["fix"]


def test_identical_repeat_is_a_retry(on_session_server: Lab) -> None:
    """(d) The same request twice: a ``retry`` of the same conversation and turn, every
    token but the last reusable (llama-server always evaluates the last one again), no
    cause."""
    lab = on_session_server
    body = _plain_body(_nonce())
    first, _ = lab.ask(body)
    again, _ = lab.ask(body)
    tokens = _tokens(lab.upstream, _render(lab.upstream, body))
    assert first["prefix_kind"] == "cold", lab.shown()
    assert again["prefix_kind"] == "retry", lab.shown()
    assert (again["conversation"], again["turn"]) == (first["conversation"], 1), lab.shown()
    assert again["reusable_tokens"] == len(tokens) - 1, lab.shown()
    assert again["prefill_cause"] is None, lab.shown()
    assert again["diverged_at"] is None, lab.shown()


def test_cache_prompt_off_loses_every_reusable_token(on_session_server: Lab) -> None:
    """(e) A repeat sent with ``cache_prompt: false``: llama-server reuses nothing, so
    ``cache_lost_tokens`` equals ``reusable_tokens`` (all but the last token), cause
    ``cache_prompt_off`` with its fix and the lost milliseconds priced."""
    lab = on_session_server
    body = _plain_body(_nonce())
    lab.ask(body)
    record, _ = lab.ask({**body, "cache_prompt": False})
    tokens = _tokens(lab.upstream, _render(lab.upstream, body))
    assert record["prefix_kind"] == "retry", lab.shown()
    assert record["cache_n"] == 0, lab.shown()
    assert record["reusable_tokens"] == len(tokens) - 1, lab.shown()
    assert record["cache_lost_tokens"] == record["reusable_tokens"], lab.shown()
    assert record["prefill_cause"] == "cache_prompt_off", lab.shown()
    rate = reference_rate(lab.records[:-1], record)
    lost = record["cache_lost_tokens"] * rate
    assert record["prefill_lost_ms"] == pytest.approx(lost, rel=1e-4, abs=0.01), lab.shown()
    (finding,) = lab.findings()
    assert finding["cause"] == "cache_prompt_off" and "cache_prompt" in finding["fix"]


def test_interleaved_conversations_on_one_slot_name_the_eviction(on_swa_full: Lab) -> None:
    """(f) Two conversations interleaved on one slot (A, B, A's second turn): the turn that
    came back ``extends`` A's first turn but llama-server reused only what it shares with B
    (the template header), so it is ``slot_evicted`` with ``cache_lost_tokens`` the rest of
    the reusable prefix; A and B are two conversations. On a server with llama-server's RAM
    prompt cache on (the default, 8192 MiB) the evicted prompt came back from RAM (measured
    with ``--swa-full``: cache_n 67 of 67 reusable, no cause), so this runs on the
    ``--cache-ram 0`` server."""
    lab = on_swa_full
    nonce = _nonce()
    a1 = _plain_body(nonce)
    b1 = {
        **CHAT,
        "messages": [
            {
                "role": "system",
                "content": f"You are warehouse drone {nonce}. You count the pallets on "
                "each shelf and report the missing ones.",
            },
            {"role": "user", "content": "How many pallets on shelf 3?"},
        ],
    }
    a2 = {
        **a1,
        "messages": [
            *a1["messages"],
            {"role": "assistant", "content": "The cups are in the top cupboard."},
            {"role": "user", "content": "And the plates?"},
        ],
    }
    first_a, _ = lab.ask(a1)
    first_b, _ = lab.ask(b1)
    back, _ = lab.ask(a2)
    shared_with_a = _expected(lab.upstream, a1, a2).diverged_at
    shared_with_b = _expected(lab.upstream, b1, a2).diverged_at
    assert first_a["conversation"] != first_b["conversation"], lab.shown()
    assert first_b["prefill_cause"] is None, lab.shown()
    assert back["prefix_kind"] == "extends", lab.shown()
    assert (back["conversation"], back["turn"]) == (first_a["conversation"], 2), lab.shown()
    assert back["reusable_tokens"] == shared_with_a, lab.shown()
    assert back["cache_n"] == shared_with_b, lab.shown()
    assert back["cache_lost_tokens"] == shared_with_a - shared_with_b, lab.shown()
    assert back["prefill_cause"] == "slot_evicted", lab.shown()
    assert [f["cause"] for f in lab.findings()] == ["slot_evicted"]


REASONING = "The door is to the north. I should go straight."


def _dropped_reasoning_turns(lab: Lab) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A chat (thinking on: the template's default), then its next turn with the previous
    answer's ``reasoning_content`` in the history: the records and the second body."""
    nonce = _nonce()
    messages = [
        {"role": "system", "content": f"You are planner robot {nonce}."},
        {"role": "user", "content": "Plan a route to the door."},
    ]
    # 8 tokens: the previous answer, whose tokens the dropped history costs
    first = {"temperature": 0, "max_tokens": 8, "messages": messages}
    later = [
        {"role": "assistant", "reasoning_content": REASONING, "content": "Go north."},
        {"role": "user", "content": "Now to the window."},
    ]
    second = {**first, "messages": [*messages, *later]}
    turn1, _ = lab.ask(first)
    turn2, _ = lab.ask(second)
    return turn1, turn2, second


def test_template_dropping_reasoning_is_named(on_session_server: Lab) -> None:
    """(g) Qwen3's template drops the reasoning of assistant turns before the last user
    query (checked here on the rendering): the next turn still ``extends`` the previous
    prompt (turn 2 of its conversation), and its cause is ``template_drops_history``, its
    lost tokens the previous answer's generated tokens (``predicted_n``), priced."""
    lab = on_session_server
    turn1, turn2, second = _dropped_reasoning_turns(lab)
    assert REASONING not in _render(lab.upstream, second)
    assert turn2["prefix_kind"] == "extends", lab.shown()
    assert (turn2["conversation"], turn2["turn"]) == (turn1["conversation"], 2), lab.shown()
    assert turn2["prefill_cause"] == "template_drops_history", lab.shown()
    rate = reference_rate(lab.records[:-1], turn2)
    lost_ms = turn1["predicted_n"] * rate
    assert turn2["prefill_lost_ms"] == pytest.approx(lost_ms, rel=1e-4, abs=0.01), lab.shown()
    (finding,) = lab.findings()
    assert finding["cause"] == "template_drops_history"
    assert finding["lost_tokens"] == turn1["predicted_n"]


def test_template_dropping_reasoning_names_the_assistant_turn(on_session_server: Lab) -> None:
    """(g) The ``template_drops_history`` finding names the assistant turn whose reasoning
    the template dropped (``messages[2]``, the previous answer)."""
    lab = on_session_server
    _, turn2, _ = _dropped_reasoning_turns(lab)
    assert turn2["prefill_cause"] == "template_drops_history", lab.shown()
    (finding,) = lab.findings()
    assert str(finding["section"]).startswith("messages[2]"), lab.shown()


def test_clock_on_sliding_window_server(on_session_server: Lab) -> None:
    """(h) The clock on the session's server (Gemma 3 without ``--swa-full``): llama-server
    reuses nothing of the prefix before the change (no context checkpoint that early; at most
    the BOS), so ``cache_lost_tokens`` is the reusable prefix. Two losses, two fixes: the record's
    cause is ``system_prompt_changed`` (the tokens after the change) and its
    ``cache_lost_cause`` is ``sliding_window`` (the prefix before it), each a finding."""
    lab = on_session_server
    nonce = _nonce()
    before, after = _clock_body(nonce, 1), _clock_body(nonce, 2)
    lab.ask(before)
    record, _ = lab.ask(after)
    expected = _expected(lab.upstream, before, after)
    _assert_clock_rewrite(record, expected, lab.shown())
    # nothing reused but, at most, the BOS the slot's previous prompt also began with
    assert record["cache_n"] <= 1, lab.shown()
    assert record["cache_lost_tokens"] == record["reusable_tokens"] - record["cache_n"]
    assert record["cache_lost_tokens"] >= LOST_MIN_TOKENS, lab.shown()
    assert record["cache_lost_cause"] == "sliding_window", lab.shown()
    findings = {(f["cause"], f["section"]): f for f in lab.findings()}
    assert set(findings) == {
        ("system_prompt_changed", "messages[0].content"),
        ("sliding_window", None),
    }
    changed = findings[("system_prompt_changed", "messages[0].content")]
    assert changed["lost_tokens"] == _repeated(lab.upstream, before, after) > 0
    window = findings[("sliding_window", None)]
    assert window["lost_tokens"] == record["cache_lost_tokens"]
    assert "--swa-full" in window["fix"]


def test_clock_with_swa_full_reuses_up_to_the_change(on_swa_full: Lab) -> None:
    """(h) The clock on the ``--swa-full`` server: llama-server reuses the prompt up to the
    change, so ``diverged_at`` (computed independently) equals its ``cache_n`` within two
    tokens, and nothing of the reusable prefix is lost to name."""
    lab = on_swa_full
    nonce = _nonce()
    before, after = _clock_body(nonce, 1), _clock_body(nonce, 2)
    lab.ask(before)
    record, _ = lab.ask(after)
    expected = _expected(lab.upstream, before, after)
    _assert_clock_rewrite(record, expected, lab.shown())
    assert abs(record["cache_n"] - record["diverged_at"]) <= 2, lab.shown()
    assert record["cache_lost_tokens"] <= 2, lab.shown()
