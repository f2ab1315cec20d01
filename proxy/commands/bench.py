"""``timing-proxy bench``: the Jetson measurement's method. Sends a prompt set through the
proxy (or, with ``--direct``, straight to llama-server) for N runs with the OpenAI SDK, as an
agent would, and writes one JSON-lines log per run that ``timing-proxy report`` reads.

Through the proxy, each log line is the proxy's own record (fetched from its admin
listener's ``/stats/records/{id}``) plus what the client saw (``client_ttft_ms``,
``client_e2e_ms``).
Direct, there is no proxy to record: the line is built from the client's clock and the
``timings`` llama-server sent, with the same field names.
"""

from __future__ import annotations

import json
import sys
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import IO, Any

from proxy.core.assemble import tool_calls_valid
from proxy.core.record import Kind, Record, ServerTimings, derive
from proxy.core.timestamps import iso_utc
from proxy.core.tracker import ToolCall

__all__ = ["Prompt", "PromptSet", "load_prompts", "run_bench"]

DEFAULT_PROMPTS = "robot.toml"


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request of the set."""

    name: str
    kind: Kind
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PromptSet:
    """Prompts plus the options sent with every request and with tool requests."""

    prompts: list[Prompt]
    options: dict[str, Any]
    tool_options: dict[str, Any]


def load_prompts(path: str | None = None) -> PromptSet:
    """Read a prompt set (TOML or JSON); ``None`` is the shipped robot set."""
    if path is None:
        data = tomllib.loads(
            (resources.files("proxy.commands") / "prompts" / DEFAULT_PROMPTS).read_text(
                encoding="utf-8"
            )
        )
    elif path.endswith(".json"):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    else:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    tools = {t["function"]["name"]: t for t in data.get("tools", [])}
    prompts = []
    for p in data["prompts"]:
        kind = Kind(p.get("kind", "chat"))
        missing = [n for n in p.get("tools", []) if n not in tools]
        if missing:
            raise ValueError(f"prompt {p['name']!r} names unknown tools {missing}")
        prompts.append(
            Prompt(p["name"], kind, p["messages"], [tools[n] for n in p.get("tools", [])])
        )
    return PromptSet(prompts, data.get("options", {}), data.get("tool_options", {}))


@dataclass(slots=True)
class _Seen:
    request_id: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    timings: dict[str, Any] | None = None
    finish_reason: str | None = None
    model: str | None = None
    calls: dict[int, list[str]] = field(default_factory=dict)


def _call(client: Any, model: str, prompt: Prompt, prompts: PromptSet) -> _Seen:
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": prompt.messages,
        "stream": True,
        **prompts.options,
    }
    if prompt.tools:
        kwargs.update(prompts.tool_options)
        kwargs["tools"] = prompt.tools
    seen = _Seen()
    t0 = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    seen.request_id = raw.headers.get("x-timing-proxy-request-id")
    for chunk in raw.parse():
        seen.model = seen.model or chunk.model
        timings = (chunk.model_extra or {}).get("timings")
        if timings:
            seen.timings = timings
        for choice in chunk.choices:
            delta = choice.delta
            if choice.finish_reason:
                seen.finish_reason = choice.finish_reason
            if (delta.content or delta.tool_calls) and seen.ttft_ms is None:
                seen.ttft_ms = (time.perf_counter() - t0) * 1000
            for tc in delta.tool_calls or []:
                name_args = seen.calls.setdefault(tc.index, ["", ""])
                if tc.function and tc.function.name:
                    name_args[0] = tc.function.name
                if tc.function and tc.function.arguments:
                    name_args[1] += tc.function.arguments
    seen.e2e_ms = (time.perf_counter() - t0) * 1000
    return seen


def _direct_record(prompt: Prompt, seen: _Seen) -> dict[str, Any]:
    """A record from the client's side, for ``--direct`` runs (no proxy to record)."""
    calls = tuple(ToolCall(i, n, a) for i, (n, a) in sorted(seen.calls.items()))
    names = frozenset(t["function"]["name"] for t in prompt.tools)
    ttft = round(seen.ttft_ms, 3) if seen.ttft_ms is not None else None
    derived = derive(ServerTimings.from_json(seen.timings), ttft)
    record = Record(
        id=f"direct-{time.time_ns():x}",
        ts=iso_utc(),
        method="POST",
        path="/v1/chat/completions",
        model=seen.model,
        stream=True,
        kind=prompt.kind,
        status=200,
        ttft_ms=ttft,
        e2e_ms=round(seen.e2e_ms, 3) if seen.e2e_ms is not None else None,
        tool_calls=len(calls),
        tool_call_valid=tool_calls_valid(calls, names),
        finish_reason=seen.finish_reason,
        tool_call_tokens=derived["predicted_n"]
        if calls and seen.finish_reason == "tool_calls"
        else None,
        **derived,
    )
    return record.to_dict()


def _fetch_record(
    proxy: str, request_id: str, token: str | None, within: float = 30.0
) -> dict[str, Any]:
    """The proxy's record of one request (tool records wait for the accounting)."""
    deadline = time.monotonic() + within
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    while True:
        req = urllib.request.Request(f"{proxy}/stats/records/{request_id}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                found: dict[str, Any] = json.loads(resp.read())
                return found
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _progress(out: IO[str]) -> Callable[[int, int, str], None]:
    def show(done: int, total: int, label: str) -> None:
        width = 30
        filled = width * done // total
        out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<28}")
        if done == total:
            out.write("\n")
        out.flush()

    return show


def run_bench(
    target: str,
    *,
    admin: str = "http://127.0.0.1:8082",
    direct: bool = False,
    prompts: PromptSet | None = None,
    runs: int = 3,
    out_dir: str = "bench-logs",
    model: str = "default",
    token: str | None = None,
    progress: IO[str] | None = sys.stderr,
) -> list[Path]:
    """Run the prompt set ``runs`` times against ``target``; returns the log files written.

    ``target`` is the proxy's base URL, or llama-server's with ``direct``; ``admin`` is the
    proxy's admin listener, where the records are read.
    """
    from openai import OpenAI

    pset = prompts or load_prompts()
    client = OpenAI(
        base_url=target.rstrip("/") + "/v1", api_key=token or "none", max_retries=0, timeout=600
    )
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    show = _progress(progress) if progress is not None else None
    total = runs * len(pset.prompts)
    done = 0
    files = []
    for run in range(1, runs + 1):
        path = folder / f"{'direct' if direct else 'proxy'}-{stamp}-run{run}.jsonl"
        with path.open("w", encoding="utf-8") as log:
            for prompt, line in _run_once(client, admin, pset, direct, model, token):
                line.update(event="request_completed", run=run, prompt=prompt.name)
                log.write(json.dumps(line) + "\n")
                done += 1
                if show:
                    show(done, total, f"run {run} {prompt.name}")
        files.append(path)
    return files


def _run_once(
    client: Any, admin: str, pset: PromptSet, direct: bool, model: str, token: str | None
) -> Iterator[tuple[Prompt, dict[str, Any]]]:
    for prompt in pset.prompts:
        seen = _call(client, model, prompt, pset)
        if direct or seen.request_id is None:
            line = _direct_record(prompt, seen)
        else:
            line = _fetch_record(admin.rstrip("/"), seen.request_id, token)
        line["client_ttft_ms"] = round(seen.ttft_ms, 3) if seen.ttft_ms is not None else None
        line["client_e2e_ms"] = round(seen.e2e_ms, 3) if seen.e2e_ms is not None else None
        yield prompt, line
