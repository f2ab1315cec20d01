"""A real OTLP receiver for the tests: Arize Phoenix (``phoenix serve``), in a virtualenv of
its own.

Phoenix takes OTLP/HTTP protobuf on ``/v1/traces`` of its HTTP port, stores the spans in a
SQLite file under its working directory and gives them back through its REST API
(``GET /v1/projects/{project}/spans``): attributes, events, parent ids and times as stored.
It pulls in about a hundred packages (FastAPI, SQLAlchemy, grpcio, pandas…), some of which
the project's own ``.venv`` pins differently, so it lives in
``$TIMING_PROXY_CACHE/venvs/phoenix`` (default ``~/.cache/timing-proxy/venvs/phoenix``),
built here on first use (about a minute from the PyPI mirror) and reused while its marker
names the same requirement. ``python -m tests.otel_receiver`` builds it ahead of the tests
(``.ci/run`` can, to keep the install out of the test's time).

Phoenix keeps only a span's own attributes: the resource's (``service.name``, the fleet's
labels) are read for the project name and dropped, so the resource is checked on the wire by
``tests/serve/test_otel.py`` instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.commands.ports import free_port
from proxy.commands.provision.cache import cache_root, locked, tail

__all__ = ["PHOENIX_REQUIREMENT", "Phoenix", "phoenix_running", "phoenix_venv"]

PHOENIX_REQUIREMENT = "arize-phoenix>=20,<21"
"""The REST API the tests read (``/v1/projects/{project}/spans``) as of Phoenix 20."""
START_TIMEOUT = 180.0
"""Phoenix creates its database (migrations) at first start: ~15 s here, on 2 busy cores."""
INSTALL_TIMEOUT = 1200.0

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"[phoenix] {message}", file=sys.stderr, flush=True)


def phoenix_venv(log: Log = _stderr) -> Path:
    """The ``phoenix`` executable of the Phoenix virtualenv, built on first use."""
    venv = cache_root() / "venvs" / "phoenix"
    marker = venv / ".timing-proxy-installed"
    executable = venv / "bin" / "phoenix"
    with locked(cache_root() / "locks" / "phoenix-venv.lock", log, "Phoenix install"):
        if marker.is_file() and marker.read_text() == PHOENIX_REQUIREMENT and executable.exists():
            return executable
        started = time.monotonic()
        log(f"installing {PHOENIX_REQUIREMENT} into {venv} (once; about a minute)")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        install_log = venv.parent / "phoenix-install.log"
        with install_log.open("wb") as out:
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", PHOENIX_REQUIREMENT],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=INSTALL_TIMEOUT,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            )
        if done.returncode != 0:
            raise RuntimeError(f"pip install {PHOENIX_REQUIREMENT} failed:\n{tail(install_log)}")
        marker.write_text(PHOENIX_REQUIREMENT)
        log(f"installed in {time.monotonic() - started:.0f} s")
        return executable


@dataclass
class Phoenix:
    """A running Phoenix: its base URL (OTLP/HTTP at ``/v1/traces``), process and log."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def otlp_endpoint(self) -> str:
        """What ``[otel] endpoint`` takes: the base URL (the proxy adds ``/v1/traces``)."""
        return self.url

    def spans(self, project: str = "default") -> list[dict[str, Any]]:
        """Every span of ``project`` as the REST API returns it (all pages)."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
            url = f"{self.url}/v1/projects/{project}/spans?{urllib.parse.urlencode(query)}"
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    body = json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # no span has arrived yet: the project does not exist
                    return out
                raise
            out.extend(body["data"])
            cursor = body.get("next_cursor")
            if not cursor:
                return out


def _wait_ready(phoenix: Phoenix) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(phoenix.url + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert phoenix.proc.poll() is None, tail(phoenix.log)
        assert time.monotonic() < deadline, "phoenix did not start:\n" + tail(phoenix.log)
        time.sleep(0.25)


@contextmanager
def phoenix_running(folder: Path, log: Log = _stderr) -> Iterator[Phoenix]:
    """``phoenix serve`` on free loopback ports, its database and files in ``folder``;
    stopped on exit."""
    executable = phoenix_venv(log)
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "PHOENIX_"))  # Phoenix traces itself when told to
    }
    env.update(
        {
            "PHOENIX_WORKING_DIR": str(folder),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(port),
            "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
    )
    log_path = folder / "phoenix.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [str(executable), "serve"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            env=env,
        )
    phoenix = Phoenix(url=f"http://127.0.0.1:{port}", proc=proc, log=log_path)
    try:
        _wait_ready(phoenix)
        yield phoenix
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


if __name__ == "__main__":
    print(phoenix_venv())
