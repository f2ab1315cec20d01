"""A short functional load test: many concurrent streams through the proxy as its own process.

The proxy runs as ``python -m proxy serve ... --log-file ...``, as in production, in front of
the fake llama-server (``tests.fakes.llama_chat``) served on the test's loop, which also runs
the clients. Nothing is timed: the checks are that every client got exactly the upstream's
bytes and that every request was recorded. The figures under load (streams per second,
``/stats`` latency, memory over time) are ``bench/load.py``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.fakes import CHAT_PATH, FakeUpstream, llama_chat

pytestmark = pytest.mark.load

CONCURRENCY = 100
STREAMS = 500
TOKENS = 16
GAP_MS = 2  # between two token events: the streams overlap in time


async def _stream(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes]:
    async with session.post(url + CHAT_PATH, data=body) as resp:
        return resp.status, await resp.read()


async def _drive(url: str, body: bytes) -> list[tuple[int, bytes]]:
    """``STREAMS`` streams, ``CONCURRENCY`` of them in flight at any time."""
    results: list[tuple[int, bytes]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as s:

        async def client(n: int) -> None:
            for _ in range(n):
                results.append(await _stream(s, url, body))

        await asyncio.gather(*(client(STREAMS // CONCURRENCY) for _ in range(CONCURRENCY)))
    return results


def _completed(proxy: ProxyProcess, count: int, within: float = 30.0) -> list[dict[str, Any]]:
    """The ``request_completed`` lines once there are ``count`` of them (or ``within`` s)."""
    deadline = time.monotonic() + within
    while True:
        lines = [e for e in proxy.events() if e.get("event") == "request_completed"]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


async def test_concurrent_streams_are_relayed_whole_and_each_is_recorded(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    """500 streams, 100 at a time, through a proxy process: every client gets exactly the
    bytes the upstream sends directly, and each request has one completed record in the log
    and is counted by ``/stats``, with no other log event than the start's."""
    server = await aiohttp_server(FakeUpstream(llama_chat(), keep_seen=False).app)
    upstream = str(server.make_url("")).rstrip("/")
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        | {"max_tokens": TOKENS, "bench_interval_ms": GAP_MS}
    )
    async with aiohttp.ClientSession() as s:
        status, direct = await _stream(s, upstream, body)
    assert status == 200 and direct.endswith(b"data: [DONE]\n\n")
    starting = proxy_in_front_of(upstream, tmp_path / "proxy")
    proxy = await asyncio.to_thread(starting.__enter__)
    try:
        results = await asyncio.wait_for(_drive(proxy.url, body), timeout=120)
        lines = await asyncio.to_thread(_completed, proxy, STREAMS)
        async with aiohttp.ClientSession() as s, s.get(proxy.admin_url + "/stats") as resp:
            stats = await resp.json()
        events = Counter(e.get("event") for e in await asyncio.to_thread(proxy.events))
    finally:
        await asyncio.to_thread(starting.__exit__, None, None, None)
    assert Counter(status for status, _ in results) == {200: STREAMS}
    assert sum(got == direct for _, got in results) == STREAMS
    assert Counter((r["outcome"], r["status"], r["path"]) for r in lines) == {
        ("completed", 200, CHAT_PATH): STREAMS
    }
    assert len({r["id"] for r in lines}) == STREAMS
    assert stats["requests"] == STREAMS
    assert set(events) <= {"proxy_started", "upstream_ok", "request_completed"}, events
