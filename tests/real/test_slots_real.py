"""Requests sent at once through the proxy, against the real llama-server (Gemma 3 270M, the
Qwen3 template) with two slots and with one, sent by the OpenAI SDK.

On two slots, the first burst after a warm-up request has one request on the slot holding the
shared system prompt and tools, and the other on the slot that holds nothing: llama-server's
``cache_n`` (the ground truth; ``--swa-full --cache-ram 0``, so nothing comes back from RAM
and nothing is lost to the sliding window) says which. That one is ``slot_busy``, priced at
the prefix it prefilled, and its schema is not "prefilled again". Everything else is silent:
the request on the warm slot, the second burst (both slots hold the prefix now), the same
traffic on one slot (the requests queue and each finds the prefix), and two agents each
continuing its own conversation at once on its own slot.

NVIDIA's AIPerf, a benchmark client, sends the same shapes of traffic on its own: prompts
behind one shared system prompt, four at a time on the two slots; and its multi-turn
conversations, one request at a time on one slot, then all at once on two. There every
record is checked against ``cache_n``: a cause is named exactly where the server kept less
of the reusable prompt than it could have, and nowhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI

from proxy.commands.provision import LlamaServer
from proxy.core.findings import LOST_MIN_TOKENS
from tests.client_capture import AsyncTee, Exchange
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama import LlamaArtifacts, started_llama_server
from tests.real.cache_truth import (
    SHARED_PROMPT_BURST,
    aiperf_records,
    causes_where_cache_n_lost,
    shown,
)
from tests.terminal import terminal_log
from tests.third_party import AiperfLoad

pytestmark = pytest.mark.real

SERVER_ARGS = ("-c", "8192", "--swa-full", "--cache-ram", "0")
"""4096 tokens a slot on two slots; the exact cache, nothing restored from RAM."""
SYSTEM = "You are the control agent of a warehouse robot. " * 12
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": f"Does thing number {i} for the robot arm and the base.",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x"],
            },
        },
    }
    for i in range(4)
]
QUESTIONS = ["Where is the red box?", "Move to the dock.", "Say hello.", "Turn left."]
EXTRA = {"chat_template_kwargs": {"enable_thinking": False}}
RECORD_WAIT_S = 60.0
AIPERF_CONVERSATIONS = AiperfLoad(
    requests=12, entries=12, isl=24, osl=8, concurrency=1, conversations=4, turns=3
)
"""Four conversations of three turns, each turn sent with the history before it."""
CAUSES_ON_THIS_SERVER = frozenset({"slot_busy", "slot_evicted"})
"""What can cost a prompt its reusable prefix on these servers: a slot busy with another
request, or a slot that served other prompts since (never the sliding window: ``--swa-full``)."""


def _server(
    artifacts: LlamaArtifacts, folder: Path, slots: int, config: pytest.Config
) -> Iterator[LlamaServer]:
    with started_llama_server(
        artifacts,
        folder,
        (*SERVER_ARGS, "-np", str(slots)),
        log=terminal_log(config, f"llama-server {slots} slots"),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def two_slots(
    llama_artifacts: LlamaArtifacts,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[LlamaServer]:
    """A llama-server of two slots."""
    yield from _server(llama_artifacts, tmp_path_factory.mktemp("two-slots"), 2, request.config)


@pytest.fixture(scope="module")
def one_slot(
    llama_artifacts: LlamaArtifacts,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[LlamaServer]:
    """The same llama-server with one slot."""
    yield from _server(llama_artifacts, tmp_path_factory.mktemp("one-slot"), 1, request.config)


class Agents:
    """The OpenAI SDK's async client through a proxy of the test's own; ``ask`` sends
    requests at once and returns their records in the order given."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy = proxy
        self.records: list[dict[str, Any]] = []

    def ask(self, *conversations: list[dict[str, Any]], tools: bool = True) -> list[dict[str, Any]]:
        exchanges = asyncio.run(self._send(conversations, tools))
        records = [self.proxy.record(e.request_id, within=RECORD_WAIT_S) for e in exchanges]
        self.records.extend(records)
        return records

    async def _send(
        self, conversations: tuple[list[dict[str, Any]], ...], tools: bool
    ) -> list[Exchange]:
        tee = AsyncTee()
        client = AsyncOpenAI(
            base_url=self.proxy.url + "/v1",
            api_key="unused",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=tee, timeout=300),
        )
        try:
            await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model="gemma",
                        messages=messages,  # type: ignore[arg-type]
                        tools=TOOLS if tools else [],  # type: ignore[arg-type]
                        max_tokens=8,
                        temperature=0,
                        extra_body=EXTRA,
                    )
                    for messages in conversations
                )
            )
        finally:
            await client.close()
        by_body = {e.request_body: e for e in tee.exchanges}
        return [by_body[_body_of(tee.exchanges, m)] for m in conversations]

    def proxy_findings(self) -> list[dict[str, Any]]:
        """``/stats`` ``cache.findings``."""
        with urllib.request.urlopen(self.proxy.admin_url + "/stats", timeout=30) as response:
            findings: list[dict[str, Any]] = json.loads(response.read())["cache"]["findings"]
        return findings

    def shown(self) -> str:
        keys = ("cache_n", "prompt_n", "prefix_kind", "reusable_tokens", "cache_lost_tokens")
        more = ("prefill_cause", "prefill_lost_tokens", "schema_prefilled_again")
        return "\n".join(str({k: r.get(k) for k in (*keys, *more)}) for r in self.records)


def _body_of(exchanges: list[Exchange], messages: list[dict[str, Any]]) -> bytes:
    """The request body among ``exchanges`` that carried ``messages``."""
    (body,) = [e.request_body for e in exchanges if e.request_json()["messages"] == messages]
    return body


def _one_shot(nonce: str, question: str) -> list[dict[str, Any]]:
    """A one-shot question after the test's own system prompt (``nonce`` first: the slots
    the module's other tests left hold nothing of it beyond the template's header)."""
    return [
        {"role": "system", "content": f"Robot {nonce}. {SYSTEM}"},
        {"role": "user", "content": question},
    ]


@pytest.fixture
def on_two_slots(two_slots: LlamaServer, tmp_path: Path) -> Iterator[Agents]:
    with proxy_in_front_of(two_slots.url, tmp_path / "proxy") as proxy:
        yield Agents(proxy)


@pytest.fixture
def on_one_slot(one_slot: LlamaServer, tmp_path: Path) -> Iterator[Agents]:
    with proxy_in_front_of(one_slot.url, tmp_path / "proxy") as proxy:
        yield Agents(proxy)


def test_a_burst_on_two_slots_names_the_busy_slot_once(on_two_slots: Agents) -> None:
    """After a warm-up, two one-shot questions at once on two slots: the one llama-server
    gave the other slot (``cache_n`` the template's header at most) is ``slot_busy``, its
    lost tokens the prefix it prefilled, its schema not prefilled again; the other, on the
    warm slot, is silent. A second burst finds the prefix on both slots: silent. No record
    blames the sliding window or an eviction."""
    agents, nonce = on_two_slots, uuid.uuid4().hex[:8]
    (warm,) = agents.ask(_one_shot(nonce, "warm up"))
    assert warm["prefix_kind"] == "cold" and warm["prefill_cause"] is None, agents.shown()
    first = agents.ask(*(_one_shot(nonce, q) for q in QUESTIONS[:2]))
    second = agents.ask(*(_one_shot(nonce, q) for q in QUESTIONS[2:]))
    busy = [r for r in first if r["cache_n"] < LOST_MIN_TOKENS]
    assert len(busy) == 1, agents.shown()
    (lost,) = busy
    assert lost["prefix_kind"] == "branch", agents.shown()
    assert lost["prefill_cause"] == "slot_busy", agents.shown()
    lost_tokens = lost["reusable_tokens"] - lost["cache_n"]
    assert lost["prefill_lost_tokens"] == lost_tokens > 500, agents.shown()
    assert lost["schema_prefilled_again"] is False, agents.shown()
    for record in [r for r in first if r is not lost] + second:
        assert record["cache_n"] == record["reusable_tokens"], agents.shown()
        assert record["prefill_cause"] is None, agents.shown()
        assert record["schema_prefilled_again"] is False, agents.shown()
    assert [f["cause"] for f in agents.proxy_findings()] == ["slot_busy"], agents.shown()


def test_a_first_burst_on_an_empty_server_is_silent(on_two_slots: Agents) -> None:
    """Two one-shot questions at once before anything was cached: both prefill the shared
    prefix (``cache_n`` the template's header at most), since neither could reuse the
    other's (it was running): no cause, no finding, no schema prefilled again."""
    agents, nonce = on_two_slots, uuid.uuid4().hex[:8]
    both = agents.ask(*(_one_shot(nonce, q) for q in QUESTIONS[:2]))
    for record in both:
        assert record["cache_n"] < LOST_MIN_TOKENS, agents.shown()
        assert record["prefill_cause"] is None, agents.shown()
        assert record["schema_prefilled_again"] is not True, agents.shown()
    assert agents.proxy_findings() == [], agents.shown()


def test_the_same_traffic_on_one_slot_is_silent(on_one_slot: Agents) -> None:
    """The warm-up and the two bursts on one slot: the requests queue, each finds the
    prefix the one before left (``cache_n`` all of it): no cause, no finding."""
    agents, nonce = on_one_slot, uuid.uuid4().hex[:8]
    agents.ask(_one_shot(nonce, "warm up"))
    agents.ask(*(_one_shot(nonce, q) for q in QUESTIONS[:2]))
    agents.ask(*(_one_shot(nonce, q) for q in QUESTIONS[2:]))
    for record in agents.records[1:]:
        assert record["cache_n"] == record["reusable_tokens"] > 500, agents.shown()
        assert record["prefill_cause"] is None, agents.shown()
    assert agents.proxy_findings() == [], agents.shown()


def test_two_agents_continuing_at_once_on_their_own_slots_are_silent(
    on_two_slots: Agents,
) -> None:
    """Two agents with system prompts of their own (no tools), each first turn alone, then
    both next turns at once: each finds its conversation on its own slot (``cache_n`` all
    of the previous turn); nothing is said although they ran side by side."""
    agents, nonce = on_two_slots, uuid.uuid4().hex[:8]
    first = [
        [
            {"role": "system", "content": f"You are robot {name} {nonce}. " * 20},
            {"role": "user", "content": "Hi."},
        ]
        for name in ("Alpha", "Bravo")
    ]
    for conversation in first:
        agents.ask(conversation, tools=False)
    later = [
        [*c, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Status?"}]
        for c in first
    ]
    both = agents.ask(*later, tools=False)
    for record in both:
        assert record["prefix_kind"] == "extends", agents.shown()
        assert record["cache_n"] >= record["reusable_tokens"], agents.shown()
        assert record["prefill_cause"] is None, agents.shown()
    assert agents.proxy_findings() == [], agents.shown()


def test_aiperf_at_concurrency_four_names_a_cause_exactly_where_cache_n_shows_a_loss(
    two_slots: LlamaServer, tmp_path: Path
) -> None:
    """AIPerf's prompts behind a shared system prompt, four at a time on two slots: a record
    names a cause (``slot_busy`` or ``slot_evicted``), with the tokens lost equal to the
    reusable prompt less ``cache_n``, exactly where that difference is at least
    ``LOST_MIN_TOKENS``; every other record is silent. The first burst, which finds the
    prefix on one slot only, has such a loss; most requests find the prefix and say nothing."""
    records = aiperf_records(
        two_slots.url, two_slots.alias, two_slots.model, tmp_path, SHARED_PROMPT_BURST
    )
    lost, seen = causes_where_cache_n_lost(records, CAUSES_ON_THIS_SERVER), shown(records)
    assert [r["prefill_cause"] for r in lost].count("slot_busy") >= 1, seen
    kept = [r for r in records if r["cache_n"] >= SHARED_PROMPT_BURST.system_tokens]
    assert len(kept) >= SHARED_PROMPT_BURST.requests // 2, seen


def test_aiperf_conversations_one_at_a_time_on_one_slot_extend_silently(
    one_slot: LlamaServer, tmp_path: Path
) -> None:
    """AIPerf's multi-turn mode, its four three-turn conversations one request at a time on
    one slot: each later turn finds the turn before it (``cache_n`` at least the reusable
    prompt) and is ``extends``; nothing is said; the records form four conversations of
    turns 1, 2, 3, none folded into another."""
    records = aiperf_records(
        one_slot.url, one_slot.alias, one_slot.model, tmp_path, AIPERF_CONVERSATIONS
    )
    seen = shown(records)
    assert causes_where_cache_n_lost(records, CAUSES_ON_THIS_SERVER) == [], seen
    turns: dict[str, list[int]] = {}
    for record in records:
        turns.setdefault(record["conversation"], []).append(record["turn"])
        if record["turn"] > 1:
            assert record["prefix_kind"] == "extends", seen
            assert record["cache_n"] >= record["reusable_tokens"] > 0, seen
    assert sorted(turns.values()) == [[1, 2, 3]] * 4, seen


def test_aiperf_conversations_at_once_on_two_slots_are_evicted_where_cache_n_says(
    two_slots: LlamaServer, tmp_path: Path
) -> None:
    """The same four conversations all at once on two slots: two conversations take turns on
    each slot, so a later turn finds the other one's prompt there. A cause is named exactly
    where ``cache_n`` kept at least ``LOST_MIN_TOKENS`` less than the turn before left, with
    that loss; here that is ``slot_evicted`` at least once."""
    load = dataclasses.replace(AIPERF_CONVERSATIONS, concurrency=4)
    records = aiperf_records(two_slots.url, two_slots.alias, two_slots.model, tmp_path, load)
    lost = causes_where_cache_n_lost(records, CAUSES_ON_THIS_SERVER)
    assert "slot_evicted" in {r["prefill_cause"] for r in lost}, shown(records)
