"""Pytest fixtures for the real llama-server (imported by ``tests/conftest.py``).

Provisioning (build llama-server, assemble the model) is part of the test run: it happens
here if ``python -m proxy.commands.provision`` has not warmed the cache already. If it fails, the
tests that need the server fail when ``CI`` is set or ``TIMING_PROXY_REQUIRE_REAL=1``, so
CI never skips them silently; on a developer's machine they are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from proxy.commands.provision import (
    LlamaServer,
    LlamaServerError,
    ProvisionError,
    chat_template_path,
    ensure_llama_server,
    ensure_model,
)
from tests.terminal import terminal_log

__all__ = [
    "LlamaArtifacts",
    "llama_artifacts",
    "llama_server",
    "provision_or_skip",
    "real_required",
    "started_llama_server",
]

START_TIMEOUT = 120.0


@dataclass(frozen=True)
class LlamaArtifacts:
    """Paths of a provisioned llama-server, model and chat template."""

    binary: Path
    model: Path
    template: Path


def real_required() -> bool:
    """True when missing real artefacts must fail the run (CI, or TIMING_PROXY_REQUIRE_REAL=1)."""
    ci = os.environ.get("CI", "").strip().lower()
    return ci not in ("", "0", "false", "no") or os.environ.get("TIMING_PROXY_REQUIRE_REAL") == "1"


def _unavailable(reason: str) -> NoReturn:
    if real_required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def debian_tool(path: str, package: str) -> str:
    """The executable at ``path`` (or found on PATH), from Debian package ``package``; when it
    is missing, skip, or fail if real tests are required."""
    found = shutil.which(path)
    if found is None:
        _unavailable(f"no {Path(path).name} at {path} (Debian package: {package})")
    return found


def provision_or_skip(log: Callable[[str], None] | None = None) -> LlamaArtifacts:
    """Ensure binary, model and template; on failure skip, or fail if real tests are required."""
    out = log or (lambda msg: print(f"[provision] {msg}", file=sys.stderr, flush=True))
    try:
        return LlamaArtifacts(
            binary=ensure_llama_server(log=out),
            model=ensure_model(log=out),
            template=chat_template_path(log=out),
        )
    except (ProvisionError, OSError) as exc:
        reason = f"real llama-server could not be provisioned: {exc}"
    _unavailable(reason)  # outside the except: no chained traceback in the report


@pytest.fixture(scope="session")
def llama_artifacts(request: pytest.FixtureRequest) -> LlamaArtifacts:
    """The provisioned llama-server binary, model and chat template (session-wide)."""
    return provision_or_skip(terminal_log(request.config, "provision"))


@contextmanager
def started_llama_server(
    artifacts: LlamaArtifacts,
    log_dir: Path,
    extra_args: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
    *,
    own_template: bool = False,
) -> Iterator[LlamaServer]:
    """A started llama-server (one slot, 4096 ctx, --metrics) with ``extra_args`` added,
    stopped on exit; a fallback to ``--no-repack`` after a start-up crash shows in ``log``.
    ``own_template`` serves the model's own chat template (Gemma 3's, which ignores tools)
    instead of the provisioned Qwen3 one. Failing to start is a test failure, never a skip
    (the artefacts are provisioned)."""
    server = LlamaServer(
        artifacts.binary,
        artifacts.model,
        None if own_template else artifacts.template,
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
    if failure:  # outside the except: no chained traceback in the report
        pytest.fail(failure, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama_server(
    llama_artifacts: LlamaArtifacts,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[LlamaServer]:
    """The llama-server shared by the session (see :func:`started_llama_server`)."""
    with started_llama_server(
        llama_artifacts,
        tmp_path_factory.mktemp("llama-server"),
        log=terminal_log(request.config, "llama-server"),
    ) as server:
        yield server
