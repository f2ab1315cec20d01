"""Shared fixtures: a fake upstream, the proxy in front of it, and the real llama-server."""

from __future__ import annotations

import ast
import contextlib
import gc
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.commands.ports import free_port
from proxy.commands.provision import LlamaServer
from proxy.config import Config, load_config
from proxy.core.record import Record
from proxy.core.request import RequestFacts
from proxy.core.tracker import Observation
from proxy.serve.app import SINKS, build_admin_app, build_app
from tests.fakes import FakeUpstream
from tests.llama import llama_artifacts, llama_server  # noqa: F401
from tests.profiles import use_dev_profile_off_ci

use_dev_profile_off_ci()


@dataclass
class Captured:
    """Everything the proxy reported through its record sinks."""

    records: list[Record] = field(default_factory=list)
    facts: list[RequestFacts] = field(default_factory=list)
    observations: list[Observation | None] = field(default_factory=list)

    def sink(self, record: Record, facts: RequestFacts, obs: Observation | None) -> None:
        self.records.append(record)
        self.facts.append(facts)
        self.observations.append(obs)

    @property
    def last(self) -> Record:
        return self.records[-1]


@dataclass
class ProxyUnderTest:
    """A running proxy in front of ``upstream_url``: the agent's test client, the admin
    listener's (``/stats``, ``/metrics``, ``/dashboard``) and the captured records."""

    client: TestClient[web.Request, web.Application]
    app: web.Application
    captured: Captured
    config: Config
    admin: TestClient[web.Request, web.Application]

    @property
    def url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")

    @property
    def admin_url(self) -> str:
        return str(self.admin.make_url("")).rstrip("/")


ProxyFactory = Callable[..., Awaitable[ProxyUnderTest]]


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeUpstream, TestServer]:
    """A started fake llama-server."""
    upstream = FakeUpstream()
    server = await aiohttp_server(upstream.app)
    return upstream, server


@pytest.fixture
def make_proxy(aiohttp_server: Any, aiohttp_client: Any) -> ProxyFactory:
    """Start the proxy against an upstream URL, with config overrides per section.

    Accounting is off unless a test passes ``accounting={"enabled": True}``. The proxies
    stop before the test's ``aiohttp_server`` upstreams (fixtures end in the reverse order
    of their start): an upstream stopping first can accept a background read of the proxy
    (``/props``) as it closes and then wait for that read's own timeout.
    """

    async def start(upstream_url: str, **sections: dict[str, object]) -> ProxyUnderTest:
        app, captured, config = proxy_app(upstream_url, **sections)
        client = await aiohttp_client(app)
        admin = await aiohttp_client(build_admin_app(app))
        return ProxyUnderTest(client=client, app=app, captured=captured, config=config, admin=admin)

    return start


def proxy_app(
    upstream_url: str, **sections: dict[str, object]
) -> tuple[web.Application, Captured, Config]:
    """The proxy's app for ``upstream_url`` with config overrides per section, its records
    captured. Accounting is off unless ``accounting={"enabled": True}`` is passed."""
    overrides: dict[str, dict[str, object]] = {
        "upstream": {"url": upstream_url},
        # look-ups would reach the fake too; tests of accounting switch it on
        "accounting": {"enabled": False},
    }
    for name, values in sections.items():
        overrides.setdefault(name, {}).update(values)
    config = load_config(None, overrides)
    app = build_app(config)
    captured = Captured()
    app[SINKS].append(captured.sink)
    return app, captured, config


@pytest.fixture
async def proxied(
    fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory
) -> tuple[FakeUpstream, ProxyUnderTest]:
    """The fake upstream and a proxy in front of it."""
    upstream, server = fake
    proxy = await make_proxy(str(server.make_url("")).rstrip("/"))
    return upstream, proxy


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """The URL of a port that is bound but not listening: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class ProxyProcess:
    """The proxy started as a user would: the agent's URL, the admin listener's, the log."""

    url: str
    log_file: Path
    proc: subprocess.Popen[bytes]
    admin_url: str = ""

    @property
    def metrics_url(self) -> str:
        """The proxy's Prometheus page: the one place tests take its URL from."""
        return self.admin_url + "/metrics"

    def events(self) -> list[dict[str, Any]]:
        """The log's events so far. A line the proxy is still writing is left for the next
        call: a reader can see part of a ``write`` to a file, so only lines ending in a
        newline are whole."""
        text = self.log_file.read_text()
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]

    def records(self) -> dict[str, dict[str, Any]]:
        """request_completed lines by request id."""
        return {
            event["id"]: event
            for event in self.events()
            if event.get("event") == "request_completed"
        }

    def record(self, request_id: str, within: float = 5.0) -> dict[str, Any]:
        """Wait for the record of one request (it is written when the exchange ends)."""
        deadline = time.monotonic() + within
        while True:
            found = self.records().get(request_id)
            if found is not None:
                return found
            assert time.monotonic() < deadline, f"no record for {request_id}"
            time.sleep(0.02)

    def records_of(self, path: str, count: int, within: float = 10.0) -> list[dict[str, Any]]:
        """The records of requests to ``path`` in the order the proxy had them, once
        ``count`` were written or ``within`` seconds passed (a client that names no request
        id, such as AIPerf)."""
        deadline = time.monotonic() + within
        while True:
            found = [r for r in self.records().values() if r["path"] == path]
            if len(found) >= count or time.monotonic() > deadline:
                return sorted(found, key=lambda record: record["ts"])
            time.sleep(0.1)


PROXY_START_S = 60.0
"""How long ``python -m proxy serve`` may take to answer ``/stats``: under a second on an
idle machine, a minute for a CI host whose cores are lent elsewhere (the budget of the
other servers the tests start is one to three minutes)."""


def _not_started(proc: subprocess.Popen[bytes], stderr: Path) -> str:
    """Why a proxy that is still running never answered: its stderr, with the stack of every
    thread (``SIGABRT`` under ``PYTHONFAULTHANDLER``), and how busy the machine was."""
    proc.send_signal(signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    load = ", ".join(f"{n:.2f}" for n in os.getloadavg())
    return (
        f"proxy did not answer /stats within {PROXY_START_S:.0f} s (load average {load});"
        f" its stderr:\n{stderr.read_text(errors='replace')}"
    )


@contextmanager
def proxy_in_front_of(
    upstream: str, folder: Path, config: Path | None = None
) -> Iterator[ProxyProcess]:
    """``python -m proxy serve`` in front of ``upstream``, as a user starts it (with
    ``--config config`` when given: the flags below win over it), its records in
    ``folder / "requests.jsonl"``; stopped on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    port, admin_port = free_port(), free_port()
    log_file = folder / "requests.jsonl"
    with (folder / "stderr.txt").open("wb") as stderr:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}"),
                *("--admin-listen", f"127.0.0.1:{admin_port}"),
                *("--upstream", upstream, "--log-file", str(log_file)),
                *(("--config", str(config)) if config is not None else ()),
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            # a fatal signal dumps every thread's stack to stderr: a start that hangs shows where
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
        url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
        try:
            deadline = time.monotonic() + PROXY_START_S
            while True:
                try:
                    with urllib.request.urlopen(admin_url + "/stats", timeout=1):
                        break
                except OSError:
                    assert proc.poll() is None, (folder / "stderr.txt").read_text()
                if time.monotonic() >= deadline:  # outside the except: no chained traceback
                    pytest.fail(_not_started(proc, folder / "stderr.txt"), pytrace=False)
                time.sleep(0.05)
            yield ProxyProcess(url=url, log_file=log_file, proc=proc, admin_url=admin_url)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def proxy_process(
    llama_server: LlamaServer,  # noqa: F811 - the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ProxyProcess]:
    """``python -m proxy serve`` in front of the real llama-server."""
    with proxy_in_front_of(llama_server.url, tmp_path_factory.mktemp("proxy")) as proxy:
        yield proxy


REAL_TESTS = Path(__file__).parent / "real"
"""The folder of the modules whose every test is marked ``real`` (their ``pytestmark``)."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave ``tests/real/`` out when ``-m`` deselects every test marked ``real`` (the fast
    loop's ``not real and ...``): importing its modules loads the third-party clients they
    drive, about 4 s of every pytest process, for tests that would all be deselected."""
    if collection_path == REAL_TESTS and deselects(config.option.markexpr, "real"):
        return True
    return None


_MARK_EXPRESSION = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Name, ast.Load)
"""What a ``-m`` expression is made of that :func:`deselects` reads."""


def deselects(markexpr: str, marker: str) -> bool:
    """Whether ``-m markexpr`` deselects every test marked ``marker``, whatever other markers
    the test has. False for an expression made of more than ``and``, ``or``, ``not``,
    parentheses and marker names (pytest reads it; nothing is left out here)."""
    try:
        tree = ast.parse(markexpr, mode="eval").body
    except SyntaxError:  # the empty expression too: nothing deselected
        return False
    if not all(isinstance(node, _MARK_EXPRESSION) for node in ast.walk(tree)):
        return False
    others = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - {marker})
    for values in itertools.product((False, True), repeat=len(others)):
        if _holds(tree, {**dict(zip(others, values, strict=True)), marker: True}):
            return False
    return True


def _holds(node: ast.expr, marks: dict[str, bool]) -> bool:
    """The value of a mark expression's tree for a test with exactly the ``marks`` true."""
    if isinstance(node, ast.Name):
        return marks[node.id]
    if isinstance(node, ast.UnaryOp):
        return not _holds(node.operand, marks)
    assert isinstance(node, ast.BoolOp)
    values = (_holds(value, marks) for value in node.values)
    return all(values) if isinstance(node.op, ast.And) else any(values)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once every test module is imported, move what is alive (the modules, the SDKs' types,
    the collected tests) out of the collector's generations, as ``python -m proxy serve``
    does at start: each full collection during the run then walks only what the tests
    made, not millions of long-lived objects (each walk of them took about 0.4 s).

    The proxy's ``run``, which some tests start in-process, freezes what is alive then too;
    nothing gives it back: ``gc.unfreeze`` would give back everything frozen here as well,
    and every later full collection (``run``'s own, at each start) would walk it again."""
    gc.collect()
    gc.freeze()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Name the random test order's seed even under ``-q`` (pytest-randomly prints it only
    in the header, which ``-q`` hides), so a failing order can be run again."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(
            f"test order: pytest-randomly seed {seed} (again: -p randomly --randomly-seed={seed})"
        )
