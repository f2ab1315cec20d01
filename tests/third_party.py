"""Third-party clients for ``tests/real/test_third_party_real.py``: NVIDIA AIPerf and
TrustedRouter's provider check, each in a virtualenv of its own, and the tokenizer AIPerf needs
offline.

``aiperf`` pulls in about 140 packages (transformers, datasets, plotly, kubernetes…; 1.2 GB)
that the project's ``.venv`` has no use for and pins differently; the provider check needs
only httpx and jsonschema but is kept apart the same way, so the project's own test
dependencies stay what ``pyproject.toml`` says. Both live in ``$TIMING_PROXY_CACHE/venvs``
(default ``~/.cache/timing-proxy/venvs``), built on first use and reused while their marker
names the same requirement, like the Phoenix venv of ``tests/otel_receiver.py``.

AIPerf's ``--tokenizer builtin`` downloads its vocabulary, which fails offline: it gets a
Hugging Face ``tokenizers`` folder (``tokenizer.json`` + ``tokenizer_config.json``) written
here from the served GGUF's own vocabulary (read by the ``gguf`` package): a byte-fallback
BPE whose merges are the vocabulary's pairs ranked by the merged piece's score, which is how
llama.cpp's SentencePiece tokenizer merges. AIPerf uses it only to size its synthetic prompts;
the token counts it reports are the server's (``--use-server-token-count``). The folder is
cached beside the venvs, keyed by the model file's size and modification time (reading the
vocabulary takes the ``gguf`` package about 35 s).

``python -m tests.third_party`` builds all three ahead of the tests (``.ci/run`` does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.commands.provision import ensure_model
from proxy.commands.provision.cache import cache_root, locked, tail

__all__ = [
    "AIPERF_REQUIREMENT",
    "PROVIDER_CHECK_REQUIREMENT",
    "AiperfRequest",
    "ProviderVerdict",
    "aiperf_venv",
    "gguf_tokenizer",
    "provider_check_venv",
    "run_aiperf",
    "run_provider_check",
]

AIPERF_REQUIREMENT = "aiperf==0.13.0"
PROVIDER_CHECK_REQUIREMENT = "trustedrouter-provider-check==0.1.8"
INSTALL_TIMEOUT = 1800.0
"""aiperf's packages took 6 to 9 min here from the PyPI mirror on 2 busy cores."""
RUN_TIMEOUT = 600.0

Log = Callable[[str], None]

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
"""llama.cpp's token types (``tokenizer.ggml.token_type``); bytes (``<0xNN>``) are 6."""
SPACE = "\u2581"
"""SentencePiece's visible space, the one the vocabulary's pieces spell spaces with."""


def _stderr(message: str) -> None:
    print(f"[third-party] {message}", file=sys.stderr, flush=True)


def tool_venv(name: str, requirement: str, executable: str, log: Log = _stderr) -> Path:
    """``executable`` of the virtualenv ``venvs/name`` holding ``requirement``, built on
    first use (under a lock: parallel sessions wait for one install)."""
    venv = cache_root() / "venvs" / name
    marker = venv / ".timing-proxy-installed"
    path = venv / "bin" / executable
    with locked(cache_root() / "locks" / f"{name}-venv.lock", log, f"{name} install"):
        if marker.is_file() and marker.read_text() == requirement and path.exists():
            return path
        started = time.monotonic()
        log(f"installing {requirement} into {venv} (once)")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        install_log = venv.parent / f"{name}-install.log"
        with install_log.open("wb") as out:
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", requirement],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=INSTALL_TIMEOUT,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            )
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"pip install {requirement} failed:\n{tail(install_log)}")
        marker.write_text(requirement)
        log(f"installed {requirement} in {time.monotonic() - started:.0f} s")
        return path


def aiperf_venv(log: Log = _stderr) -> Path:
    """The ``aiperf`` executable of its own virtualenv."""
    return tool_venv("aiperf", AIPERF_REQUIREMENT, "aiperf", log)


def provider_check_venv(log: Log = _stderr) -> Path:
    """The ``trustedrouter-provider-check`` executable of its own virtualenv."""
    return tool_venv(
        "provider-check", PROVIDER_CHECK_REQUIREMENT, "trustedrouter-provider-check", log
    )


# --- the tokenizer -------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """A GGUF's SentencePiece vocabulary: pieces, scores and token types by token id."""

    tokens: list[str]
    scores: list[float]
    types: list[int]


def gguf_vocabulary(model: Path) -> Vocabulary:
    """The ``tokenizer.ggml.*`` arrays of ``model``, read by the ``gguf`` package."""
    from gguf import GGUFReader  # the package parses every key of the file: import it late

    fields = GGUFReader(model).fields
    tokens = fields["tokenizer.ggml.tokens"]
    model_kind = fields["tokenizer.ggml.model"].contents()
    assert model_kind == "llama", f"not a SentencePiece vocabulary: {model_kind!r}"
    return Vocabulary(
        tokens=[bytes(tokens.parts[i]).decode("utf-8") for i in tokens.data],
        scores=[float(x) for x in fields["tokenizer.ggml.scores"].contents()],
        types=[int(x) for x in fields["tokenizer.ggml.token_type"].contents()],
    )


def bpe_merges(vocab: Vocabulary) -> list[list[str]]:
    """Every split of a normal piece into two normal pieces, the merged piece's higher
    score first (llama.cpp's SentencePiece tokenizer merges the best-scored pair first)."""
    normal = {t: i for i, t in enumerate(vocab.tokens) if vocab.types[i] == NORMAL}
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for piece, merged in normal.items():
        for cut in range(1, len(piece)):
            left, right = normal.get(piece[:cut]), normal.get(piece[cut:])
            if left is not None and right is not None:
                ranked.append(
                    (-vocab.scores[merged], merged, left, right, piece[:cut], piece[cut:])
                )
    ranked.sort()
    return [[a, b] for *_, a, b in ranked]


def tokenizer_json(vocab: Vocabulary, bos: str) -> dict[str, Any]:
    """A Hugging Face ``tokenizers`` document for ``vocab``: spaces as ``▁``, no dummy
    prefix, byte fallback, control and user-defined pieces matched whole before the model,
    ``bos`` in front of every sequence."""
    special = {"id": bos, "type_id": 0}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": kind == CONTROL,
            }
            for i, (token, kind) in enumerate(zip(vocab.tokens, vocab.types, strict=True))
            if kind in (CONTROL, USER_DEFINED)
        ],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": special}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": special},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [vocab.tokens.index(bos)], "tokens": [bos]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(vocab.tokens)},
            "merges": bpe_merges(vocab),
        },
    }


TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "add_bos_token": True,
    "add_eos_token": False,
    "model_max_length": 32768,
}


def gguf_tokenizer(model: Path | None = None, log: Log = _stderr) -> Path:
    """A Hugging Face tokenizer folder for ``model`` (default: the provisioned one), built
    once and cached by the model's name, size and modification time."""
    model = model or ensure_model(log=log)
    stat = model.stat()
    folder = cache_root() / "tokenizers" / f"{model.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    with locked(cache_root() / "locks" / "tokenizer.lock", log, "tokenizer build"):
        if (folder / "tokenizer_config.json").is_file():
            return folder
        started = time.monotonic()
        log(f"writing a tokenizer from {model.name}'s vocabulary into {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        document = tokenizer_json(gguf_vocabulary(model), str(TOKENIZER_CONFIG["bos_token"]))
        (folder / "tokenizer.json").write_text(json.dumps(document, ensure_ascii=False))
        # written last: its presence says the folder is complete
        (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
        log(f"tokenizer written in {time.monotonic() - started:.0f} s")
        return folder


# --- running the clients -------------------------------------------------------------------


@dataclass(frozen=True)
class AiperfRequest:
    """One request of an AIPerf run, from its records and raw exports."""

    request_id: str
    """AIPerf's ``X-Request-ID``."""
    start_ns: int
    """Wall clock (``time.time_ns``) when AIPerf started the request."""
    end_ns: int
    prompt: str | None
    """The user message it sent."""
    ttft_ms: float | None
    latency_ms: float | None
    connect_ms: float
    """Of the TTFT and latency, the time AIPerf spent getting a connection (pool, DNS, TCP),
    before any server could have the request."""
    output_tokens: int | None
    error: str | None
    """The error's type (``ServerDisconnectedError``…), ``None`` for a success."""
    error_message: str | None = None
    """What the error said (``[Errno 104] Connection reset by peer``…)."""


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def _prompt(payload: dict[str, Any] | None) -> str | None:
    messages = (payload or {}).get("messages") or [{}]
    content = messages[-1].get("content")
    return content if isinstance(content, str) else None


def aiperf_requests(artifacts: Path) -> list[AiperfRequest]:
    """The requests of an AIPerf run's ``profile_export.jsonl`` (metrics) and
    ``profile_export_raw.jsonl`` (payloads), in the order AIPerf started them."""
    prompts = {
        raw["metadata"]["x_request_id"]: _prompt(raw.get("payload"))
        for raw in _jsonl(artifacts / "profile_export_raw.jsonl")
    }
    out = []
    for row in _jsonl(artifacts / "profile_export.jsonl"):
        meta = row["metadata"]
        metrics = {name: metric["value"] for name, metric in row["metrics"].items()}
        error = row.get("error")
        tokens = metrics.get("output_token_count")
        out.append(
            AiperfRequest(
                request_id=meta["x_request_id"],
                start_ns=meta["request_start_ns"],
                end_ns=meta["request_end_ns"],
                prompt=prompts.get(meta["x_request_id"]),
                ttft_ms=metrics.get("time_to_first_token"),
                latency_ms=metrics.get("request_latency"),
                connect_ms=metrics.get("http_req_connection_overhead", 0.0),
                output_tokens=None if tokens is None else int(tokens),
                error=None if error is None else str(error.get("type") or error.get("message")),
                error_message=None if error is None else error.get("message"),
            )
        )
    return sorted(out, key=lambda request: request.start_ns)


def _run(command: Sequence[str], log_file: Path, what: str) -> None:
    with log_file.open("wb") as out:
        done = subprocess.run(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=RUN_TIMEOUT,
            env={**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1"},
        )
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{tail(log_file)}"


@dataclass(frozen=True)
class AiperfLoad:
    """What AIPerf sends: ``requests`` streamed chats at ``concurrency``, prompts of ``isl``
    tokens drawn from ``entries`` distinct ones, ``osl`` tokens each (``ignore_eos``); with
    ``system_tokens``, one system prompt of that many tokens shared by every prompt; with
    ``warmup``, that many requests sent first (not in AIPerf's export, but through the proxy);
    with ``conversations``, that many conversations of ``turns`` turns each, every turn sent
    with the history before it (``requests`` should be their product)."""

    requests: int = 20
    entries: int = 20
    isl: int = 32
    osl: int = 16
    concurrency: int = 1
    seed: int = 42
    system_tokens: int = 0
    warmup: int = 0
    conversations: int = 0
    turns: int = 1


def run_aiperf(
    url: str, model: str, tokenizer: Path, out: Path, load: AiperfLoad = AiperfLoad()
) -> list[AiperfRequest]:
    """``aiperf profile`` against ``url`` (streamed chat, greedy, server token counts), its
    artefacts in ``out``; its requests in start order. AIPerf exits 0 when requests fail:
    their ``error`` says so."""
    command = [
        str(aiperf_venv()), "profile", "-m", model, "--url", url,
        "--endpoint-type", "chat", "--streaming",
        "--request-count", str(load.requests), "--concurrency", str(load.concurrency),
        "--num-dataset-entries", str(load.entries),
        "--isl", str(load.isl), "--isl-stddev", "0", "--osl", str(load.osl), "--osl-stddev", "0",
        "--extra-inputs", json.dumps({"temperature": 0, "ignore_eos": True}),
        "--tokenizer", str(tokenizer), "--use-server-token-count",
        "--random-seed", str(load.seed), "--ui", "none",
        "--no-gpu-telemetry", "--no-server-metrics",
        "--export-level", "raw", "--artifact-dir", str(out),
    ]  # fmt: skip
    if load.system_tokens:
        command += ["--shared-system-prompt-length", str(load.system_tokens)]
    if load.warmup:
        command += ["--warmup-request-count", str(load.warmup)]
    if load.conversations:
        command += ["--conversation-num", str(load.conversations)]
        command += ["--conversation-turn-mean", str(load.turns), "--conversation-turn-stddev", "0"]
    out.mkdir(parents=True, exist_ok=True)
    _run(command, out / "aiperf-output.txt", "aiperf")
    return aiperf_requests(out)


@dataclass(frozen=True)
class ProviderVerdict:
    """One of the provider check's checks: its verdict and, when the check's request got no
    HTTP response at all, the ``httpx`` error it got instead."""

    status: str
    no_response: str | None


def run_provider_check(url: str, model: str, out: Path, tier: int) -> dict[str, ProviderVerdict]:
    """``trustedrouter-provider-check`` against ``url`` (an OpenAI API root, ``/v1``) up to
    ``tier``: each check's id and verdict (pass, fail, warn or skip). Its exit status says
    whether the conformance gate passed; the verdicts say more, so it is not checked."""
    report = out / "provider-check.json"
    command = [
        str(provider_check_venv()), "--base-url", url, "--model", model,
        "--tier", str(tier), "--json", str(report),
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    log_file = out / "provider-check-output.txt"
    with log_file.open("wb") as output:
        subprocess.run(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=RUN_TIMEOUT,
            env={k: v for k, v in os.environ.items() if k != "TR_PROVIDER_API_KEY"},
        )
    assert report.is_file(), f"provider check wrote no report:\n{tail(log_file)}"
    checks = json.loads(report.read_text(encoding="utf-8"))["checks"]
    return {check["id"]: _provider_verdict(check) for check in checks}


def _provider_verdict(check: dict[str, Any]) -> ProviderVerdict:
    """A check's verdict; a probe that caught an ``httpx`` error names it in ``measured`` as
    ``error`` or ``error_type`` beside no ``http_status``."""
    measured = check.get("measured") or {}
    error = measured.get("error") or measured.get("error_type")
    answered = measured.get("http_status") is not None
    return ProviderVerdict(check["status"], None if answered or not error else str(error))


if __name__ == "__main__":
    print(aiperf_venv())
    print(provider_check_venv())
    print(gguf_tokenizer())
