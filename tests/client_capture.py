"""What an SDK's HTTP client received, byte for byte, and an independent reading of it.

The ``openai``, ``anthropic`` and ``openai-agents`` packages installed here speak HTTP through
``httpx2`` and take an ``http_client``. ``Tee`` and ``AsyncTee`` are transports that wrap the
default one and copy every response body into a buffer as the SDK reads it, so a test holds
the very bytes the SDK parsed, the request body it sent and the response headers (the
proxy's request id among them).

The readers below parse those bytes with nothing but ``json``, independently of the proxy's
framer and dialects, into the values a record should hold (docs/apis.md; the wire shapes:
llama-server-protocol §8).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2

from proxy.core.headers import REQUEST_ID_HEADER

__all__ = [
    "AsyncTee",
    "Exchange",
    "Received",
    "Tee",
    "completion_stream",
    "messages_body",
    "messages_stream",
    "responses_body",
    "responses_stream",
    "sse_data",
]


@dataclass
class Exchange:
    """One request the SDK sent and the response bytes it read."""

    method: str
    path: str
    request_body: bytes
    status: int
    headers: httpx2.Headers
    chunks: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        """The response body as the SDK read it (all chunks joined)."""
        return b"".join(self.chunks)

    @property
    def request_id(self) -> str:
        """The proxy's request id (empty when the request went straight to llama-server)."""
        return self.headers.get(REQUEST_ID_HEADER, "")

    def request_json(self) -> dict[str, Any]:
        """The JSON body the SDK sent."""
        body = json.loads(self.request_body)
        assert isinstance(body, dict)
        return body


class _TeeStream(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, sink: list[bytes]) -> None:
        self._inner = inner
        self._sink = sink

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._sink.append(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _AsyncTeeStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, sink: list[bytes]) -> None:
        self._inner = inner
        self._sink = sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._sink.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _exchange(request: httpx2.Request, response: httpx2.Response) -> Exchange:
    return Exchange(
        method=request.method,
        path=request.url.path,
        request_body=request.content,
        status=response.status_code,
        headers=response.headers,
    )


class Tee(httpx2.BaseTransport):
    """The default transport, with every response body copied into ``exchanges``."""

    def __init__(self) -> None:
        self._inner = httpx2.HTTPTransport()
        self.exchanges: list[Exchange] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.read()
        response = self._inner.handle_request(request)
        exchange = _exchange(request, response)
        self.exchanges.append(exchange)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, exchange.chunks),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()

    @property
    def last(self) -> Exchange:
        """The latest exchange."""
        return self.exchanges[-1]


class AsyncTee(httpx2.AsyncBaseTransport):
    """The default async transport, with every response body copied into ``exchanges``."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await request.aread()
        response = await self._inner.handle_async_request(request)
        exchange = _exchange(request, response)
        self.exchanges.append(exchange)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncTeeStream(response.stream, exchange.chunks),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass(frozen=True)
class Received:
    """The values a record should hold, as read from the bytes a client received."""

    prompt_n: int | None
    cache_n: int | None
    predicted_n: int | None
    prefill_ms: float | None
    decode_ms: float | None
    finish_reason: str | None
    calls: list[tuple[str, str]]
    """(name, arguments) of each tool call, in order."""
    text: str
    raw: dict[str, Any]
    """The usage and timings objects exactly as received, for the printed comparison."""


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    """The JSON ``data:`` payload of every Server-Sent Event in ``raw`` (llama-server ends
    each event with a blank line; comments and ``event:`` lines carry no data)."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if data and data[0] != b"[DONE]":
            out.append(json.loads(b"\n".join(data)))
    return out


def _responses_calls(output: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(i["name"], i["arguments"]) for i in output if i.get("type") == "function_call"]


def _responses_text(output: list[dict[str, Any]]) -> str:
    return "".join(
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content", [])
    )


def _from_usage(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt_n, cache_n, predicted_n) from a Responses ``usage``: the uncached part of the
    prompt is ``input_tokens`` less ``cached_tokens``."""
    cached = usage["input_tokens_details"]["cached_tokens"]
    return usage["input_tokens"] - cached, cached, usage["output_tokens"]


def responses_stream(raw: bytes) -> Received:
    """A streamed ``/v1/responses``: ``timings`` beside ``response`` in ``response.completed``
    (the calls and text from its ``output``, which the deltas must add up to)."""
    (done,) = [e for e in sse_data(raw) if e.get("type") == "response.completed"]
    response, timings = done["response"], done["timings"]
    calls = _responses_calls(response["output"])
    return Received(
        prompt_n=timings["prompt_n"],
        cache_n=timings["cache_n"],
        predicted_n=timings["predicted_n"],
        prefill_ms=timings["prompt_ms"],
        decode_ms=timings["predicted_ms"],
        finish_reason="tool_calls" if calls else None,
        calls=calls,
        text=_responses_text(response["output"]),
        raw={"usage": response["usage"], "timings": timings},
    )


def responses_body(raw: bytes) -> Received:
    """A plain ``/v1/responses`` body: only ``usage``, no ``timings``."""
    response = json.loads(raw)
    prompt_n, cache_n, predicted_n = _from_usage(response["usage"])
    calls = _responses_calls(response["output"])
    return Received(
        prompt_n=prompt_n,
        cache_n=cache_n,
        predicted_n=predicted_n,
        prefill_ms=None,
        decode_ms=None,
        finish_reason="tool_calls" if calls else None,
        calls=calls,
        text=_responses_text(response["output"]),
        raw={"usage": response["usage"]},
    )


_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


def messages_stream(raw: bytes) -> Received:
    """A streamed ``/v1/messages``: ``message_start`` usage (``input_tokens`` uncached,
    ``cache_read_input_tokens``), ``message_delta`` usage (``output_tokens``); no timings."""
    start: dict[str, Any] = {}
    delta: dict[str, Any] = {}
    calls: dict[int, list[str]] = {}
    text: list[str] = []
    for event in sse_data(raw):
        kind = event.get("type")
        if kind == "message_start":
            start = event["message"]["usage"]
        elif kind == "message_delta":
            delta = event
        elif kind == "content_block_start" and event["content_block"]["type"] == "tool_use":
            calls[event["index"]] = [event["content_block"]["name"], ""]
        elif kind == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            calls[event["index"]][1] += event["delta"]["partial_json"]
        elif kind == "content_block_delta" and event["delta"]["type"] == "text_delta":
            text.append(event["delta"]["text"])
    return Received(
        prompt_n=start["input_tokens"],
        cache_n=start["cache_read_input_tokens"],
        predicted_n=delta["usage"]["output_tokens"],
        prefill_ms=None,
        decode_ms=None,
        finish_reason=_STOP_REASONS[delta["delta"]["stop_reason"]],
        calls=[(name, arguments) for name, arguments in (calls[i] for i in sorted(calls))],
        text="".join(text),
        raw={"message_start.usage": start, "message_delta.usage": delta["usage"]},
    )


def messages_body(raw: bytes) -> Received:
    """A plain ``/v1/messages`` body; a ``tool_use`` block's ``input`` is the parsed
    arguments, so they are given re-serialised."""
    message = json.loads(raw)
    usage = message["usage"]
    blocks = message["content"]
    return Received(
        prompt_n=usage["input_tokens"],
        cache_n=usage["cache_read_input_tokens"],
        predicted_n=usage["output_tokens"],
        prefill_ms=None,
        decode_ms=None,
        finish_reason=_STOP_REASONS[message["stop_reason"]],
        calls=[(b["name"], json.dumps(b["input"])) for b in blocks if b["type"] == "tool_use"],
        text="".join(b["text"] for b in blocks if b["type"] == "text"),
        raw={"usage": usage},
    )


_STOP_TYPES = {"eos": "stop", "word": "stop", "limit": "length"}


def completion_stream(raw: bytes) -> Received:
    """A streamed native ``/completion``: a ``content`` piece per event, then the final
    object (``stop: true``) with ``timings``, ``tokens_predicted`` and ``stop_type``."""
    events = sse_data(raw)
    (final,) = [e for e in events if e.get("stop") is True]
    timings = final["timings"]
    return Received(
        prompt_n=timings["prompt_n"],
        cache_n=timings["cache_n"],
        predicted_n=timings["predicted_n"],
        prefill_ms=timings["prompt_ms"],
        decode_ms=timings["predicted_ms"],
        finish_reason=_STOP_TYPES.get(final["stop_type"]),
        calls=[],
        text="".join(e.get("content", "") for e in events),
        raw={
            "timings": timings,
            "tokens_predicted": final["tokens_predicted"],
            "tokens_evaluated": final["tokens_evaluated"],
        },
    )
