"""Every structure that grows with traffic stays within its bound: schema totals and per-tool
counts (least recently used first, evictions counted), the attribution's renderings and
prompts (by bytes), and streamed tool-call arguments (capped; beyond the cap the fields read
from them are unknown, with the reason). Each is driven past its bound through the proxy
against the toy llama-server of tests/serve/test_accounting.py."""

from __future__ import annotations

import tracemalloc
from typing import Any

import orjson
import pytest

from proxy.core.bounded import Bounded
from proxy.core.tracker import MAX_ARGUMENT_BYTES
from proxy.serve.keys import ACCOUNTING
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import make_timings
from tests.serve.test_accounting import (
    READ_FILE,
    ToyLlama,
    ask,
    body_of,
    input_tokens,
    settle,
    tool,
    toy,
    wait_record,
)

__all__ = ["toy"]  # the fixture, imported for the tests below


class TestBounded:
    def test_least_recently_used_goes_first_and_is_counted(self) -> None:
        """Past the limit the least recently used entry goes (a get makes an entry recent)
        and each one let go is counted."""
        kept: Bounded[str, int] = Bounded(2)
        kept.put("a", 1)
        kept.put("b", 2)
        assert kept.get("a") == 1
        kept.put("c", 3)
        assert [k for k, _ in kept.items()] == ["a", "c"]
        assert (kept.get("b"), kept.evicted, len(kept)) == (None, 1, 2)

    def test_within_the_limit_nothing_goes(self) -> None:
        """Entries within the limit, put again or read, are all kept and nothing is counted."""
        kept: Bounded[int, int] = Bounded(3)
        for i in (1, 2, 3, 1, 2, 3):
            kept.put(i, i)
            kept.get(i)
        assert (len(kept), kept.evicted) == (3, 0)


async def _schemas(proxy: ProxyUnderTest) -> dict[str, Any]:
    stats: dict[str, Any] = orjson.loads(await (await proxy.admin.get("/stats")).read())
    return dict(stats["schemas"])


def _described(i: int) -> dict[str, Any]:
    """A tools array whose description changes with ``i`` (a distinct schema each)."""
    changing = tool("read_file", "path")
    changing["function"]["description"] = f"Read a file (version {i})."
    return body_of([changing])


async def test_schema_totals_keep_the_most_recent(toy: ToyLlama, make_proxy: ProxyFactory) -> None:
    """Ten requests with a tool description that changes each time, three schemas kept:
    /stats lists three and counts seven let go; the same tools ten times are one entry and
    nothing is let go."""
    accounting = {"enabled": True, "attribution": False, "schema_entries": 3}
    proxy = await make_proxy(toy.url, accounting=accounting)
    for i in range(10):
        await ask(proxy, _described(i))
        await wait_record(proxy, i + 1)
    await settle(toy)
    schemas = await _schemas(proxy)
    assert (len(schemas["by_hash"]), schemas["evicted"]) == (3, 7)
    same = await make_proxy(toy.url, accounting=accounting)
    for i in range(10):
        await ask(same, body_of([READ_FILE]))
        await wait_record(same, i + 1)
    schemas = await _schemas(same)
    assert (len(schemas["by_hash"]), schemas["evicted"]) == (1, 0)


def _long(i: int, words: int) -> dict[str, Any]:
    """A chat request whose user message is ``words`` distinct words long."""
    text = " ".join(f"w{i}x{j}" for j in range(words))
    return body_of([], user=text)


def _held_by_the_proxy() -> int:
    """Bytes alive that were allocated with a frame of the proxy's package on the stack."""
    only = tracemalloc.Filter(True, "*/proxy/*", all_frames=True)
    snapshot = tracemalloc.take_snapshot().filter_traces([only])
    return sum(stat.size for stat in snapshot.statistics("filename"))


@pytest.mark.slow  # tracemalloc over sixteen 4,000-word prompts: 10-25 s
async def test_attribution_stays_within_its_bytes(toy: ToyLlama, make_proxy: ProxyFactory) -> None:
    """Sixteen distinct long prompts with 0.5 MiB for attribution: the cached renderings and
    the held prompts each stay within 0.5 MiB, and what the proxy's code holds (objects
    allocated with a frame of ``proxy/`` on the stack; the toy keeps every body it got) does
    not grow between the 8th and the 16th prompt by more than twice that bound."""
    proxy = await make_proxy(
        toy.url, accounting={"enabled": True, "attribution": True, "attribution_cache_mb": 0.5}
    )
    attributor = proxy.app[ACCOUNTING].attributor  # type: ignore[union-attr]
    assert attributor is not None
    bodies = [_long(i, 4000) for i in range(16)]  # made before tracing: tracing slows them
    totals = [input_tokens(body) for body in bodies]
    tracemalloc.start(12)
    try:
        held: dict[int, int] = {}
        for i, (body, total) in enumerate(zip(bodies, totals, strict=True)):
            toy.timings = make_timings(prompt_n=total, prompt_ms=total * 0.5, cache_n=0)
            await ask(proxy, body)
            await wait_record(proxy, i + 1, within=30.0)
            assert attributor.cached_bytes <= 1 << 19
            assert attributor.history.held_bytes <= 1 << 19
            if i in (7, 15):  # a snapshot is slow: only the two compared
                held[i] = _held_by_the_proxy()
    finally:
        tracemalloc.stop()
    assert attributor.history.held < 16
    assert held[15] - held[7] < 1 << 20, held


async def test_tool_call_arguments_over_the_cap_are_not_kept(
    toy: ToyLlama, make_proxy: ProxyFactory
) -> None:
    """A call streaming more argument text than the cap: the agent gets every byte, the
    record's argument-derived fields are unknown with the reason, and nothing of it is sent
    to /tokenize; a call within the cap is checked and counted."""
    proxy = await make_proxy(toy.url, accounting={"enabled": True, "attribution": False})
    piece = '"' + "x" * 4094 + '",'
    pieces = ['{"path": [', *[piece] * (MAX_ARGUMENT_BYTES // len(piece) + 8), '""]}']
    toy.tool_calls = [("read_file", pieces)]
    status, data, _ = await ask(proxy, body_of([READ_FILE]))
    assert status == 200 and data == toy.sent[-1]
    record = await wait_record(proxy)
    assert (record.tool_calls, record.tool_args_chars, record.tool_call_valid) == (1, None, None)
    assert record.tool_args_tokens is None
    assert "tool_args: over 256 KiB, not counted" in (record.accounting_error or "")
    await settle(toy)
    assert all(len(b.get("content", "")) < MAX_ARGUMENT_BYTES for b in toy.bodies["/tokenize"])
    toy.tool_calls = [("read_file", ['{"path": ', '"/etc/hosts"}'])]
    await ask(proxy, body_of([READ_FILE]))
    fine = await wait_record(proxy, 2)
    assert (fine.tool_args_chars, fine.tool_call_valid) == (len('{"path": "/etc/hosts"}'), True)
    assert fine.tool_args_tokens is not None
