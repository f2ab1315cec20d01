"""``timing-proxy explain`` against the real llama-server (Gemma 3 270M with the Qwen3
template), and the demo's probe of the served template's tool support (Gemma 3's own template
against the Qwen3 one). The demo's choice of template is checked without a server."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.commands.bench import PromptSet, load_prompts
from proxy.commands.demo import DemoError, DemoOptions, _template, read_props, tool_support_line
from proxy.commands.explain import (
    DEFAULT_MAX_TOKENS,
    ExplainOptions,
    Streamed,
    request_body,
    run_explain,
)
from proxy.commands.provision import LlamaServer
from proxy.core.experiment import ToolCallSeen
from tests.conftest import proxy_in_front_of
from tests.llama import LlamaArtifacts, started_llama_server


def one_tool_prompt() -> dict[str, Any]:
    """One tool prompt of the robot set ("weather", its five tools, max_tokens 48): the
    smallest experiment that has every tool term, with a schema that is most of the prompt."""
    pset = load_prompts(None)
    prompt = next(p for p in pset.prompts if p.name == "weather")
    return {
        "options": pset.options,
        "tool_options": pset.tool_options,
        "tools": prompt.tools,
        "prompts": [
            {
                "name": prompt.name,
                "kind": "tool",
                "tools": [t["function"]["name"] for t in prompt.tools],
                "messages": prompt.messages,
            }
        ],
    }


@pytest.mark.real
def test_explain_two_runs_on_the_small_model(llama_server: LlamaServer, tmp_path: Path) -> None:
    """``explain --runs 2`` through a proxy: the schema term is positive and within a factor
    of 2 of the proxy's own ``schema_prefill_ms`` for the same with-tools requests; the warm
    cache saves prefill; the decode comparison reports llama-server's decode rate of both
    paths, and a difference only when both wrote the same call (on this model the raw
    completion, without the tool path's grammar, may not); the JSON file holds every
    measurement."""
    prompts_file = tmp_path / "one.json"
    prompts_file.write_text(json.dumps(one_tool_prompt()), encoding="utf-8")
    out = tmp_path / "explain.json"
    with proxy_in_front_of(llama_server.url, tmp_path / "proxy") as proxy:
        doc = run_explain(
            ExplainOptions(
                upstream=proxy.url,
                prompts=load_prompts(str(prompts_file)),
                runs=2,
                json_path=str(out),
            ),
            progress=None,
            say=lambda _: None,
        )
        cold_ids = [m["request_id"] for m in doc["measurements"] if m["variant"] == "tools_cold"]
        records = [proxy.record(request_id, within=60) for request_id in cold_ids]
    assert json.loads(out.read_text()) == doc
    terms = {t["term"]: t for t in doc["terms"]}
    variants = [m["variant"] for m in doc["measurements"] if m["run"] == 1]
    assert {"tools_cold", "no_tools_cold", "primer", "tools_warm", "raw_completion"} <= set(
        variants
    )

    schema = terms["schema prefill"]
    assert schema["n"] == 2
    assert schema["p50_ms"] > 0
    recorded = statistics.median(r["schema_prefill_ms"] for r in records)
    assert recorded > 0
    assert 0.5 <= schema["p50_ms"] / recorded <= 2.0, (schema, recorded)
    assert schema["schema_tokens_p50"] == records[0]["schema_tokens"]

    cache = terms["free fix (cache warm)"]
    assert cache["p50_ms"] > 0
    assert 0 < cache["saving_percent_p50"] < 100
    assert cache["warm_cached_tokens_p50"] >= schema["schema_tokens_p50"]

    decode = terms["tool-path decode"]
    assert decode["pairs"] == 2
    assert decode["all_chat_tok_s_p50"] > 0
    assert decode["all_raw_tok_s_p50"] > 0
    if decode["matching"]:
        assert decode["chat_tok_s_p50"] > 0
        assert decode["raw_tok_s_p50"] > 0
        assert decode["p50_ms"] is not None
    else:
        assert decode["p50_ms"] is None
        assert decode["suggests"].startswith("not compared")

    assert doc["server"]["supports_tools"] is True
    assert doc["load"]["start"] is not None


@pytest.mark.real
def test_demo_probe_says_gemma_3s_own_template_drops_tools(
    llama_artifacts: LlamaArtifacts, llama_server: LlamaServer, tmp_path: Path
) -> None:
    """The demo's probe of ``/props``: with Gemma 3's own template (no
    ``--chat-template-file``) one line says the tools never reach the model and names the
    fix; with the Qwen3 template it says nothing."""
    assert tool_support_line(read_props(llama_server.url)) is None
    with started_llama_server(llama_artifacts, tmp_path, own_template=True) as own:
        assert "--chat-template-file" not in own.command()
        line = tool_support_line(read_props(own.url))
    assert line is not None
    assert "never reach the model" in line
    assert "supports_tools false" in line
    assert "--chat-template-file" in line
    assert "\n" not in line


def _provisioned(path: Path) -> Callable[[], Path]:
    def provisioned() -> Path:
        return path

    return provisioned


def test_demo_template_choice(tmp_path: Path) -> None:
    """The demo serves the user's ``--chat-template-file`` when given (a missing file is a
    one-line error); else the provisioned Qwen3 template for the provisioned model, and the
    model's own template (none passed) for the user's own model."""
    qwen = tmp_path / "qwen.jinja"
    mine = tmp_path / "mine.jinja"
    mine.write_text("{{ messages }}", encoding="utf-8")
    assert _template(DemoOptions(), _provisioned(qwen)) == qwen
    assert _template(DemoOptions(model="own.gguf"), _provisioned(qwen)) is None
    opts = DemoOptions(model="own.gguf", chat_template_file=str(mine))
    assert _template(opts, _provisioned(qwen)) == mine
    with pytest.raises(DemoError, match="no such file"):
        _template(DemoOptions(chat_template_file=str(tmp_path / "nope")), _provisioned(qwen))


def test_tool_support_line_names_what_is_missing() -> None:
    """The probe's line: silent for a template with tools and tool calls; otherwise what is
    missing (the tools dropped, or rendered without a call format) and the fix."""
    full = {"chat_template_caps": {"supports_tools": True, "supports_tool_calls": True}}
    assert tool_support_line(full) is None
    no_calls = {"chat_template_caps": {"supports_tools": True, "supports_tool_calls": False}}
    line = tool_support_line(no_calls)
    assert line is not None
    assert "no tool-call format" in line
    assert "supports_tool_calls false" in line
    none = tool_support_line({})
    assert none is not None
    assert "never reach the model" in none


def test_request_body_is_what_bench_sends() -> None:
    """explain sends the set's request as bench does: options, then for a tool prompt the
    tool options with ``extra_body`` merged into the body, the tools, and ``max_tokens``
    always (the set's, or a bound when it gives none)."""
    pset = load_prompts(None)
    tool = next(p for p in pset.prompts if p.tools)
    body = request_body(pset, tool, "m")
    assert body["model"] == "m"
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "extra_body" not in body
    assert body["tools"] == tool.tools
    assert body["max_tokens"] == pset.options["max_tokens"]
    bare = PromptSet(pset.prompts, {}, {})
    assert request_body(bare, tool, "m")["max_tokens"] == DEFAULT_MAX_TOKENS


def test_streamed_marks_the_server_clock_at_the_first_call_delta() -> None:
    """A streamed tool call: the name and argument fragments joined, and ``predicted_n`` /
    ``predicted_ms`` of the chunk that carried the first tool-call delta."""
    seen = Streamed()
    chunks = [
        {"choices": [{"delta": {"reasoning_content": "hm"}}],
         "timings": {"predicted_n": 3, "predicted_ms": 30.0}},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
            "name": "get_weather", "arguments": "{"}}]}}],
         "timings": {"predicted_n": 9, "predicted_ms": 90.0}},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
            "arguments": '"city": "Paris"}'}}]}}],
         "timings": {"predicted_n": 14, "predicted_ms": 140.0}},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}],
         "timings": {"predicted_n": 15, "predicted_ms": 150.0}},
    ]  # fmt: skip
    for chunk in chunks:
        seen.see(chunk)
    assert seen.before_call == {"predicted_n": 9, "predicted_ms": 90.0}
    assert seen.call() == ToolCallSeen("get_weather", {"city": "Paris"})
    assert seen.finish_reason == "tool_calls"
    assert seen.timings["predicted_n"] == 15
    assert seen.reasoning == "hm"
