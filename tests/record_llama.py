"""Record raw llama-server responses for the relay tests.

Run by hand against a running llama-server (see tests/recordings/README.md):

    python -m tests.record_llama --upstream http://127.0.0.1:PORT --out tests/recordings

Each request goes straight to the server through a raw aiohttp client (no decompression,
``Accept-Encoding: identity``). For each one a JSON file is written holding the request, the
status line, the response headers exactly as received (raw order, hop-by-hop ones included) and
the body chunks exactly as ``resp.content.iter_any()`` delivered them, each with its arrival time
in seconds since the request was sent.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

MODEL = "gemma-3-270m"
NO_THINKING: dict[str, Any] = {"enable_thinking": False}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "move_arm",
            "description": "Move the robot arm to a position in centimetres.",
            "parameters": {
                "type": "object",
                "properties": {
                    "x": {"type": "number"},
                    "y": {"type": "number"},
                    "z": {"type": "number"},
                },
                "required": ["x", "y", "z"],
            },
        },
    },
]

CHAT_MESSAGES: list[dict[str, str]] = [
    {"role": "user", "content": "Say hello to me in one short sentence."},
]
TOOL_MESSAGES: list[dict[str, str]] = [
    {"role": "user", "content": "What is the weather like in Paris right now?"},
]


def _chat(stream: bool, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": CHAT_MESSAGES,
        "stream": stream,
        "max_tokens": 24,
        "temperature": 0,
        "chat_template_kwargs": NO_THINKING,
    }
    body.update(extra)
    return body


def _tool(stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": TOOL_MESSAGES,
        "tools": TOOLS,
        "stream": stream,
        "max_tokens": 64,
        "temperature": 0,
        "stop": ["</tool_call>"],
        # Without this the 270M model follows get_weather with a made-up move_arm call and
        # runs into max_tokens.
        "parallel_tool_calls": False,
        "chat_template_kwargs": NO_THINKING,
    }


@dataclass(frozen=True)
class Spec:
    """One request to record."""

    name: str
    method: str
    path: str
    body: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _json_spec(name: str, path: str, body: dict[str, Any]) -> Spec:
    return Spec(
        name=name,
        method="POST",
        path=path,
        body=orjson.dumps(body).decode(),
        headers={"Content-Type": "application/json"},
    )


def specs() -> list[Spec]:
    """The fixed set of requests, in recording order."""
    # Gemma's tokenizer splits numbers into single digits: 4,500 digits is > 4,096 tokens
    # while the request body stays small.
    too_long = "0123456789" * 450
    return [
        Spec("health", "GET", "/health"),
        Spec("models", "GET", "/v1/models"),
        _json_spec("chat_stream", "/v1/chat/completions", _chat(True)),
        _json_spec(
            "chat_stream_usage",
            "/v1/chat/completions",
            _chat(True, stream_options={"include_usage": True}),
        ),
        _json_spec("chat_nostream", "/v1/chat/completions", _chat(False)),
        _json_spec("tool_stream", "/v1/chat/completions", _tool(True)),
        _json_spec("tool_nostream", "/v1/chat/completions", _tool(False)),
        _json_spec(
            "completions_stream",
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": "The capital of France is",
                "stream": True,
                "max_tokens": 12,
                "temperature": 0,
            },
        ),
        _json_spec(
            "native_completion_stream",
            "/completion",
            {
                "prompt": "The capital of France is",
                "stream": True,
                "n_predict": 12,
                "max_tokens": 12,
                "temperature": 0,
            },
        ),
        _json_spec(
            "error_context",
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": too_long}],
                "stream": True,
                "max_tokens": 8,
                "temperature": 0,
                "chat_template_kwargs": NO_THINKING,
            },
        ),
        Spec(
            "error_badjson",
            "POST",
            "/v1/chat/completions",
            body='{"model": "gemma-3-270m", "messages": [',
            headers={"Content-Type": "application/json"},
        ),
    ]


async def record_one(session: aiohttp.ClientSession, upstream: str, spec: Spec) -> dict[str, Any]:
    """Send one request and capture the response exactly as it arrived."""
    headers = {"Accept-Encoding": "identity", **spec.headers}
    data = spec.body.encode() if spec.body is not None else None
    chunks: list[dict[str, Any]] = []
    t0 = time.monotonic()
    async with session.request(
        spec.method, upstream.rstrip("/") + spec.path, headers=headers, data=data
    ) as resp:
        async for chunk in resp.content.iter_any():
            chunks.append(
                {"t": round(time.monotonic() - t0, 6), "b64": base64.b64encode(chunk).decode()}
            )
        sent_headers = [[k, v] for k, v in resp.request_info.headers.items()]
        return {
            "name": spec.name,
            "request": {
                "method": spec.method,
                "path": spec.path,
                "headers": sent_headers,
                "body": spec.body if spec.body is not None else "",
            },
            "response": {
                "status": resp.status,
                "reason": resp.reason,
                "headers": [
                    [k.decode("latin-1"), v.decode("latin-1")] for k, v in resp.raw_headers
                ],
                "chunks": chunks,
            },
        }


async def record_all(upstream: str, out: Path, only: list[str] | None) -> None:
    timeout = aiohttp.ClientTimeout(total=300)
    for spec in specs():
        if only and spec.name not in only:
            continue
        # A fresh session (so a fresh connection) per request, without force_close: the client
        # sends no "Connection: close", so the server answers with its usual keep-alive headers.
        async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as session:
            record = await record_one(session, upstream, spec)
        path = out / f"{spec.name}.json"
        path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n")
        resp = record["response"]
        print(f"{spec.name}: {resp['status']} {len(resp['chunks'])} chunks -> {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--upstream", required=True, help="llama-server base URL")
    parser.add_argument("--out", type=Path, default=Path("tests/recordings"))
    parser.add_argument("--only", nargs="*", help="record only these names")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(record_all(args.upstream, args.out, args.only))


if __name__ == "__main__":
    main()
