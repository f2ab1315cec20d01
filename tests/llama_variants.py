"""Extra llama-servers (other flags than the session's) and proxies of a test's own, for the
prefix-attribution tests against the real server (``tests/test_prefix_real.py``).

Each is a context manager: a module-scoped fixture enters it and stops the process on exit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from proxy.commands.ports import free_port
from proxy.commands.provision import LlamaServer, LlamaServerError
from proxy.core.headers import REQUEST_ID_HEADER
from tests.conftest import ProxyProcess
from tests.llama import START_TIMEOUT, LlamaArtifacts

__all__ = ["extra_llama_server", "post_json", "proxy_in_front_of"]


@contextmanager
def extra_llama_server(
    artifacts: LlamaArtifacts,
    log_dir: Path,
    extra_args: Sequence[str],
    log: Callable[[str], None] | None = None,
) -> Iterator[LlamaServer]:
    """A llama-server like the session's (one slot, 4096 ctx) with ``extra_args`` added;
    failing to start is a test failure, never a skip (the artefacts are provisioned)."""
    server = LlamaServer(
        artifacts.binary,
        artifacts.model,
        artifacts.template,
        extra_args=extra_args,
        log_dir=log_dir,
        log=log,
    )
    try:
        server.start(timeout=START_TIMEOUT)
    except LlamaServerError as exc:
        failure = str(exc)
    else:
        failure = ""
    if failure:
        pytest.fail(failure, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def proxy_in_front_of(upstream: str, folder: Path) -> Iterator[ProxyProcess]:
    """``python -m proxy serve`` of its own in front of ``upstream`` (fresh prompt history,
    findings and conversations), its records in ``folder / "requests.jsonl"``."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_file = folder / "requests.jsonl"
    with (folder / "stderr.txt").open("wb") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proxy",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--upstream",
                upstream,
                "--log-file",
                str(log_file),
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_started(url, proc, folder / "stderr.txt")
            yield ProxyProcess(url=url, log_file=log_file, proc=proc)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _wait_started(url: str, proc: subprocess.Popen[bytes], stderr: Path) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url + "/stats", timeout=1):
                return
        except OSError:
            assert proc.poll() is None, stderr.read_text()
            assert time.monotonic() < deadline, "proxy did not start"
            time.sleep(0.05)


def post_json(url: str, body: dict[str, Any], timeout: float = 300) -> tuple[Any, str | None]:
    """POST ``body`` as JSON; the parsed answer and the proxy's request id header (if any)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        request_id = response.headers.get(REQUEST_ID_HEADER)
        return json.loads(response.read()), request_id
