"""The load client's side: the chat request bodies, and timed reads of a response (to the
last byte, per stamped event, or a long stream drained as fast as possible)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from tests.fakes import CHAT_PATH

HEADERS = {"Content-Type": "application/json"}
PATH = CHAT_PATH


def chat_body(tokens: int, stream: bool, interval_ms: float = 0.0, stamp: bool = False) -> bytes:
    """A chat request for ``tokens`` tokens; ``interval_ms`` paces the fake upstream's token
    events and ``stamp`` makes it stamp them (``tests.fakes.llama_chat``)."""
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": stream,
    }
    if interval_ms:
        body["bench_interval_ms"] = interval_ms
    if stamp:
        body["bench_stamp"] = True
    return orjson.dumps(body)


async def timed_request(session: Any, url: str, body: bytes) -> tuple[float, bytes]:
    """Wall time (ms) from sending to the last body byte, and the body."""
    t0 = time.perf_counter_ns()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        data = await resp.read()
        status = resp.status
    t1 = time.perf_counter_ns()
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {data[:200]!r}")
    return (t1 - t0) / 1e6, data


def _take_events(buf: bytes, now: int, delays: list[float]) -> tuple[bytes, int]:
    """Split the whole events off ``buf``; for each stamped one append ``now`` - stamp (ms).
    Returns the rest of ``buf`` and the number of events taken."""
    events = 0
    while True:
        i = buf.find(b"\n\n")
        if i < 0:
            return buf, events
        ev = buf[:i]
        buf = buf[i + 2 :]
        events += 1
        j = ev.find(b'"t_ns":')
        if j >= 0:
            delays.append((now - int(ev[j + 7 : ev.index(b"}", j)])) / 1e6)


async def stamped_stream(session: Any, url: str, body: bytes, delays: list[float]) -> int:
    """Read a stamped stream; append arrival - upstream stamp (ms) per token event."""
    events = 0
    buf = b""
    async with session.post(url, data=body, headers=HEADERS) as resp:
        async for chunk in resp.content.iter_any():
            now = time.monotonic_ns()
            buf, got = _take_events(buf + chunk, now, delays)
            events += got
    if buf:
        raise RuntimeError("stream ended mid-event")
    return events


async def drain_stream(session: Any, url: str, body: bytes) -> tuple[float, int, bytes]:
    """Read a long stream as fast as possible: (seconds to last byte, bytes, last bytes)."""
    size = 0
    tail = b""
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            tail = (tail + chunk)[-32:]
    return time.perf_counter() - t0, size, tail
