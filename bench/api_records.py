"""One streamed tool request per agent API through the proxy: the record beside the raw values.

For Chat Completions, the Responses API, Anthropic Messages and native ``/completion``, this
script sends one streamed request (a tool request where the API has tools) through a fresh
``timing-proxy serve`` in front of a llama-server, reads the bytes itself with a clock of its
own, and prints, per API, the proxy's record, the counts and timings the raw bytes state, and
the client's first-delta and total times. It is what the README's records per API come from.

    .venv/bin/python bench/api_records.py                      # provisions llama-server + model
    .venv/bin/python bench/api_records.py --upstream http://127.0.0.1:8080
    .venv/bin/python bench/api_records.py --out bench/results/NAME.json

The model's answers are greedy (``temperature: 0``), so the same build and model give the
same calls; times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from proxy.core.headers import REQUEST_ID_HEADER  # noqa: E402

QUESTION = "What is the weather in Paris right now?"
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
COMMON = {"model": "gemma", "temperature": 0, "stream": True}
COMMON["chat_template_kwargs"] = {"enable_thinking": False}


RECORD_FIELDS = (  # the record's fields to show, space-separated
    "api kind outcome ttfb_ms ttft_ms e2e_ms prompt_n cache_n predicted_n prefill_ms "
    "decode_ms tool_calls tool_call_valid tool_call_ms finish_reason token_events "
    "schema_tokens schema_cached schema_prefill_ms tool_args_tokens"
)
TIMING_KEYS = ("prompt_n", "cache_n", "predicted_n", "prompt_ms", "predicted_ms")


def _chat_raw(events: list[Any]) -> dict[str, Any]:
    timings = next(e["timings"] for e in reversed(events) if "timings" in e)
    choices = [c for e in events for c in e.get("choices", [])]
    return {
        "timings": {k: timings[k] for k in TIMING_KEYS},
        "finish_reason": [c["finish_reason"] for c in choices if c.get("finish_reason")],
        "arguments": "".join(
            call["function"].get("arguments") or ""
            for c in choices
            for call in (c.get("delta") or {}).get("tool_calls") or []
        ),
    }


def _responses_raw(events: list[Any]) -> dict[str, Any]:
    done = next(e for e in events if e.get("type") == "response.completed")
    return {
        "usage": done["response"]["usage"],
        "timings": {k: done["timings"][k] for k in TIMING_KEYS},
        "function_calls": [
            [item["name"], item["arguments"]]
            for item in done["response"]["output"]
            if item["type"] == "function_call"
        ],
    }


def _messages_raw(events: list[Any]) -> dict[str, Any]:
    start = next(e for e in events if e.get("type") == "message_start")
    delta = next(e for e in events if e.get("type") == "message_delta")
    return {
        "message_start.usage": start["message"]["usage"],
        "message_delta": {"stop_reason": delta["delta"]["stop_reason"], "usage": delta["usage"]},
        "tool_use": [
            e["content_block"]["name"]
            for e in events
            if e.get("type") == "content_block_start" and e["content_block"]["type"] == "tool_use"
        ],
        "arguments": "".join(
            e["delta"].get("partial_json", "")
            for e in events
            if e.get("type") == "content_block_delta"
        ),
    }


def _completion_raw(events: list[Any]) -> dict[str, Any]:
    final = events[-1]
    return {
        "timings": {k: final["timings"][k] for k in TIMING_KEYS},
        "stop_type": final.get("stop_type"),
    }


Request = tuple[str, dict[str, Any], tuple[bytes, ...], Callable[[list[Any]], dict[str, Any]]]
"""Path, body, the byte patterns of a token delta (the client's first-delta clock), reader."""

REQUESTS: dict[str, Request] = {
    "chat_completions": (
        "/v1/chat/completions",
        {
            **COMMON,
            "max_tokens": 48,
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": [{"type": "function", "function": WEATHER}],
            "stop": ["</tool_call>"],
            "parallel_tool_calls": False,
        },
        (b'"tool_calls":[{', b'"content":"'),
        _chat_raw,
    ),
    "responses": (
        "/v1/responses",
        {
            **COMMON,
            "max_output_tokens": 48,
            "input": QUESTION,
            "tools": [{"type": "function", **WEATHER}],
            "stop": ["</tool_call>"],
            "parallel_tool_calls": False,
        },
        (b"function_call_arguments.delta", b"output_text.delta"),
        _responses_raw,
    ),
    "messages": (
        "/v1/messages",
        {
            **COMMON,
            "max_tokens": 48,
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": [
                {
                    "name": WEATHER["name"],
                    "description": WEATHER["description"],
                    "input_schema": WEATHER["parameters"],
                }
            ],
            "stop_sequences": ["</tool_call>"],
        },
        (b"input_json_delta", b"text_delta"),
        _messages_raw,
    ),
    "completions": (
        "/completion",
        {"prompt": "The capital of France is", "n_predict": 12, "stream": True, "temperature": 0},
        (b'"content":"',),
        _completion_raw,
    ),
}


def _events(raw: bytes) -> list[Any]:
    lines = (line for block in raw.decode().split("\n\n") for line in block.split("\n"))
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def _send(base: str, path: str, body: dict[str, Any], marks: tuple[bytes, ...]) -> dict[str, Any]:
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    first, raw = None, b""
    with urllib.request.urlopen(req, timeout=600) as resp:
        request_id = resp.headers.get(REQUEST_ID_HEADER)
        while chunk := resp.read1(65536):
            raw += chunk
            if first is None and any(m in raw for m in marks):
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return {
        "id": request_id,
        "raw": raw,
        "client_first_delta_ms": None if first is None else round(first * 1000, 1),
        "client_total_ms": round(total * 1000, 1),
    }


def _record(log: Path, request_id: str | None, fields: str = RECORD_FIELDS) -> dict[str, Any]:
    """The ``fields`` (space-separated) of one request's record in the proxy's log, waiting
    up to 30 s."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "request_completed" and event.get("id") == request_id:
                return {k: event.get(k) for k in fields.split()}
        time.sleep(0.1)
    raise SystemExit(f"no record for {request_id} in {log}")


@contextmanager
def _proxy(upstream: str, folder: Path, config: str = "") -> Iterator[tuple[str, Path]]:
    """``python -m proxy serve`` in front of ``upstream`` with ``config`` added to its
    config file, its log in ``folder``; the base URL and the log, once it answers."""
    from bench.overhead.procs import start_proxy

    folder.mkdir(parents=True, exist_ok=True)
    proxy = start_proxy("proxy", upstream, folder, folder / "requests.jsonl", config)
    try:
        for _ in range(400):  # /stats answers once the proxy listens
            with contextlib.suppress(OSError):
                urllib.request.urlopen(proxy.admin_url + "/stats", timeout=1).close()
                break
            time.sleep(0.05)
        yield proxy.url, folder / "requests.jsonl"
    finally:
        proxy.stop()


def _post(url: str, body: dict[str, Any]) -> tuple[Any, str | None]:
    """A plain (not streamed) request: the JSON answer and the proxy's request id."""
    data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=600) as resp:
        return json.loads(resp.read()), resp.headers.get(REQUEST_ID_HEADER)


@contextmanager
def _upstream(url: str | None, folder: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    """``url``, or the provisioned llama-server on one thread with ``extra`` arguments."""
    if url:
        yield url
        return
    from proxy.commands import provision as p

    folder.mkdir(parents=True, exist_ok=True)
    server = p.LlamaServer(
        p.ensure_llama_server(),
        p.ensure_model(),
        p.chat_template_path(),
        extra_args=("-t", "1", *extra),
        log_dir=folder,
    )
    server.start(timeout=180)
    try:
        yield server.url
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", help="a running llama-server (default: provision one)")
    parser.add_argument("--out", type=Path, help="JSON file (default: bench/results/...)")
    args = parser.parse_args()
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    out = args.out or CHECKOUT / "bench" / "results" / f"api_records-{stamp}.json"
    results: dict[str, Any] = {"run": stamp}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with _upstream(args.upstream, folder) as url, _proxy(url, folder) as (base, log):
            for name, (path, body, marks, read) in REQUESTS.items():
                sent = _send(base, path, body, marks)
                raw = sent.pop("raw")
                results[name] = {
                    "record": _record(log, sent.pop("id")),
                    "raw": read(_events(raw)),
                    **sent,
                }
                print(json.dumps({name: results[name]}), flush=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
