"""``bench``, ``report`` and ``demo`` against the real llama-server and model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.commands.bench import Prompt, PromptSet, load_prompts, run_bench
from proxy.commands.report import build_report, load_runs
from proxy.core.record import Kind
from tests.conftest import ProxyProcess
from tests.llama import LlamaArtifacts

pytestmark = pytest.mark.real


def _small_set() -> PromptSet:
    full = load_prompts()
    chat = next(p for p in full.prompts if p.kind is Kind.CHAT)
    tool = next(p for p in full.prompts if p.name == "weather")
    options = {**full.options, "max_tokens": 12}
    return PromptSet(
        [chat, Prompt(tool.name, tool.kind, tool.messages, tool.tools)], options, full.tool_options
    )


class TestBench:
    """The harness writes logs that report reads."""

    def test_bench_through_the_proxy_then_report(
        self, proxy_process: ProxyProcess, tmp_path: Path
    ) -> None:
        """Two runs of a chat and a tool prompt give two logs of proxy records; report
        summarises both kinds and both runs."""
        files = run_bench(
            proxy_process.url,
            admin=proxy_process.admin_url,
            prompts=_small_set(),
            runs=2,
            out_dir=str(tmp_path),
            progress=None,
        )
        assert len(files) == 2
        lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
        assert len(lines) == 4
        logged = proxy_process.records()
        for line in lines:
            assert line["event"] == "request_completed"
            assert line["id"] in logged, "a bench line is the proxy's own record"
            assert line["prefill_ms"] == logged[line["id"]]["prefill_ms"]
            assert line["client_e2e_ms"] >= line["e2e_ms"] * 0.9
        report = build_report(load_runs([str(f) for f in files]))
        assert report["kinds"]["chat"]["count"] == 2
        assert report["kinds"]["tool"]["count"] == 2
        assert report["kinds"]["tool"]["schema"]["tokens"]["p50"] > 0

    def test_bench_direct(self, llama_server: object, tmp_path: Path) -> None:
        """--direct sends the same set straight to llama-server and still writes records."""
        url = llama_server.url  # type: ignore[attr-defined]
        files = run_bench(
            url, direct=True, prompts=_small_set(), runs=1, out_dir=str(tmp_path), progress=None
        )
        lines = [json.loads(line) for line in files[0].read_text().splitlines()]
        assert [line["kind"] for line in lines] == ["chat", "tool"]
        for line in lines:
            assert line["prefill_ms"] is not None and line["client_e2e_ms"] is not None
            assert line["id"].startswith("direct-")
        assert lines[0]["ttft_ms"] == lines[0]["client_ttft_ms"] is not None


class TestDemo:
    """The README's first command, with the cache present."""

    def test_demo_runs_end_to_end(self, llama_artifacts: LlamaArtifacts, tmp_path: Path) -> None:
        """`timing-proxy demo --no-wait` provisions from the cache, serves, benches and
        prints a report and the URLs; the records name the model by its file stem."""
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy",
                "demo",
                "--no-wait",
                "--runs",
                "1",
                "--port",
                "0",
                "--admin-port",
                "0",
                "--llama-port",
                "0",
                "--out",
                str(tmp_path / "demo"),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ},
            check=False,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        text = out.stdout
        assert "timing-proxy report" in text
        assert "chat: 5 requests" in text and "tool: 5 requests" in text
        assert "/dashboard" in text and "base_url" in text
        requests = (tmp_path / "demo" / "requests.jsonl").read_text().splitlines()
        completed = [r for r in map(json.loads, requests) if r["event"] == "request_completed"]
        assert completed and {r["model"] for r in completed} == {llama_artifacts.model.stem}
