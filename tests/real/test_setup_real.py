"""Setup findings against the real llama-server.

Gemma 3 270M with its own chat template (no ``--chat-template-file``): the template renders no
tools and llama-server answers every tool request 200. The proxy must say so at start (from
``/props``, before any request), mark the request ``tools_in_prompt: false`` and count the
finding. With the Qwen3 template (the session's server) the tools are in the prompt and there
is no such finding; a ``max_tokens`` too small for the call cuts it off.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from proxy.commands.provision import LlamaServer
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama import LlamaArtifacts, started_llama_server
from tests.llama_variants import GET_WEATHER, post_json

pytestmark = pytest.mark.real

RECORD_WAIT_S = 60.0
TOOL_REQUEST: dict[str, Any] = {
    "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
    "tools": [GET_WEATHER],
    "temperature": 0,
    "max_tokens": 48,
    "stop": ["</tool_call>"],
    "parallel_tool_calls": False,
    "chat_template_kwargs": {"enable_thinking": False},
}


def _stats(proxy: ProxyProcess) -> dict[str, Any]:
    with urllib.request.urlopen(proxy.admin_url + "/stats", timeout=30) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def _warnings(proxy: ProxyProcess, within: float = 20.0) -> list[dict[str, Any]]:
    """The setup_finding lines of the proxy's log, once at least one is there (or none
    after ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        found = [e for e in proxy.events() if e.get("event") == "setup_finding"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_gemma_3s_own_template_drops_tools_and_the_proxy_says_so(
    llama_artifacts: LlamaArtifacts, tmp_path: Path
) -> None:
    """With Gemma 3's own template: a setup_finding warning at start from /props (before
    any request), the tool request's record has tools_in_prompt false (schema_tokens 0,
    counted by the server), and /stats findings holds the setup finding with its count."""
    with (
        started_llama_server(llama_artifacts, tmp_path / "llama", own_template=True) as own,
        proxy_in_front_of(own.url, tmp_path / "proxy") as proxy,
    ):
        at_start = _warnings(proxy)
        assert [(w["cause"], w.get("source")) for w in at_start] == [
            ("tools_never_reach_model", "/props")
        ]
        assert not proxy.records(), "the warning came before any request"
        _, request_id = post_json(proxy.url + "/v1/chat/completions", TOOL_REQUEST)
        assert request_id is not None
        record = proxy.record(request_id, within=RECORD_WAIT_S)
        assert (record["schema_tokens"], record["schema_tokens_source"]) == (0, "server")
        assert record["tools_in_prompt"] is False
        found = [f for f in _stats(proxy)["findings"] if f["category"] == "setup"]
        assert [(f["cause"], f["requests"]) for f in found] == [("tools_never_reach_model", 1)]
        assert "--chat-template-file" in found[0]["fix"]


def test_a_tool_capable_template_has_the_tools_in_the_prompt(
    proxy_process: ProxyProcess, llama_server: LlamaServer
) -> None:
    """With the Qwen3 template the tools reach the prompt (tools_in_prompt true) and no
    tools_never_reach_model finding is counted."""
    _, request_id = post_json(proxy_process.url + "/v1/chat/completions", TOOL_REQUEST)
    assert request_id is not None
    record = proxy_process.record(request_id, within=RECORD_WAIT_S)
    assert record["schema_tokens"] > 0 and record["tools_in_prompt"] is True
    causes = {f["cause"] for f in _stats(proxy_process)["findings"]}
    assert "tools_never_reach_model" not in causes


def test_max_tokens_too_small_cuts_the_call_off(
    proxy_process: ProxyProcess, llama_server: LlamaServer
) -> None:
    """A tool request whose max_tokens ends the turn inside the call's arguments: the record
    says tool_call_truncated with the limit it had; /stats counts the finding."""
    cut = {**TOOL_REQUEST, "max_tokens": 18, "stream": False}  # the call starts at 16
    answer, request_id = post_json(proxy_process.url + "/v1/chat/completions", cut)
    assert request_id is not None
    choice = answer["choices"][0]
    record = proxy_process.record(request_id, within=RECORD_WAIT_S)
    assert record["max_tokens"] == 18
    if choice["finish_reason"] != "length" or not choice["message"].get("tool_calls"):
        pytest.fail(f"the model did not start a call within 18 tokens: {choice}")
    assert record["finish_reason"] == "length"
    assert record["tool_call_truncated"] is True
    found = {f["cause"]: f for f in _stats(proxy_process)["findings"]}
    assert found["tool_call_truncated"]["requests"] >= 1


def _streamed(url: str, body: dict[str, Any]) -> tuple[str, bool, str]:
    """POST a streamed request; the reasoning text streamed, whether a call came, the id."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    thoughts: list[str] = []
    called = False
    with urllib.request.urlopen(request, timeout=300) as resp:
        request_id = resp.headers["X-Timing-Proxy-Request-Id"]
        for line in resp.read().decode().splitlines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[len("data: ") :]).get("choices", []):
                delta = choice.get("delta", {})
                thoughts.append(delta.get("reasoning_content") or "")
                called = called or bool(delta.get("tool_calls"))
    return "".join(thoughts), called, request_id


def test_thinking_before_the_call_is_timed_and_counted(
    llama_artifacts: LlamaArtifacts, tmp_path: Path
) -> None:
    """With a template that opens the model's thinking (QwQ's: ``<think>`` after the
    generation prompt), what the model streams is reasoning: the record has reasoning_ms from
    its first to its last delta, and reasoning_tokens equal to llama-server's own /tokenize
    count of the reasoning text the test read from the stream."""
    qwq = llama_artifacts.template.parent / "Qwen-QwQ-32B.jinja"
    args = ("--chat-template-file", str(qwq))
    body = {**TOOL_REQUEST, "stream": True, "max_tokens": 40}
    del body["chat_template_kwargs"]
    with (
        started_llama_server(
            llama_artifacts, tmp_path / "llama", extra_args=args, own_template=True
        ) as server,
        proxy_in_front_of(server.url, tmp_path / "proxy") as proxy,
    ):
        thoughts, called, request_id = _streamed(proxy.url + "/v1/chat/completions", body)
        if not thoughts:
            pytest.fail("the model streamed no reasoning with the thinking template")
        record = proxy.record(request_id, within=RECORD_WAIT_S)
        counted, _ = post_json(
            server.url + "/tokenize",
            {"content": thoughts, "add_special": False, "parse_special": True},
        )
        assert record["reasoning_tokens"] == len(counted["tokens"])
        assert record["reasoning_ms"] is not None and record["reasoning_ms"] > 0
        if called:  # the small model rarely gets to a call after thinking: when it does
            assert record["reasoning_share"] is not None
            found = {f["cause"] for f in _stats(proxy)["findings"]}
            assert "thinking_before_call" in found
