"""Start and stop of ``proxy.serve.app.run``: ``proxy_started`` only once the socket listens,
then the upstream check; a port in use raises ``OSError`` out of ``run`` with nothing logged
before it."""

from __future__ import annotations

import asyncio
import errno
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

import proxy.serve.app
from proxy.commands.cli import error_line
from proxy.commands.ports import free_port
from proxy.config import Config, load_config
from proxy.serve.app import PortInUse
from proxy.serve.keys import BACKGROUND
from proxy.serve.tasks import spawn
from tests.conftest import proxy_in_front_of
from tests.run_app import run_app_arguments


def _config(upstream_url: str, port: int = 0, admin: str = "127.0.0.1:0") -> Config:
    return load_config(
        None,
        {
            "server": {"host": "127.0.0.1", "port": port, "shutdown_drain_s": 0.5},
            "admin": {"listen": admin},
            "upstream": {"url": upstream_url},
            "accounting": {"enabled": False},
        },
    )


class TestStartedAndStopped:
    """The start and stop lines, and what comes between them."""

    async def test_started_is_logged_once_listening_then_the_upstream_is_checked(
        self, monkeypatch: pytest.MonkeyPatch, refusing_url: str
    ) -> None:
        """Start-up hooks log nothing; ``run_app`` calls ``print`` once every site listens,
        which logs ``proxy_started`` and then checks the upstream in the background (here:
        one ``upstream_unreachable`` warning); cleanup logs ``proxy_stopped``."""
        app, kwargs = run_app_arguments(_config(refusing_url), monkeypatch)
        runner = web.AppRunner(app, handler_cancellation=True)
        with capture_logs() as logs:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            assert logs == []
            kwargs["print"]("======== Running on http://127.0.0.1 ========")
            await asyncio.gather(*app[BACKGROUND])
            await runner.cleanup()
        assert [(e["event"], e["log_level"]) for e in logs] == [
            ("proxy_started", "info"),
            ("upstream_unreachable", "warning"),
            ("proxy_stopped", "info"),
        ]
        assert logs[0]["upstream"] == refusing_url
        assert logs[1]["url"] == refusing_url + "/health"
        assert logs[1]["cause"] == "connection refused (ClientConnectorError)"

    async def test_no_stopped_line_without_a_started_one(
        self, monkeypatch: pytest.MonkeyPatch, refusing_url: str
    ) -> None:
        """An app cleaned up without ever listening logs no ``proxy_stopped``."""
        app, _ = run_app_arguments(_config(refusing_url), monkeypatch)
        runner = web.AppRunner(app)
        with capture_logs() as logs:
            await runner.setup()
            await runner.cleanup()
        assert logs == []


AGENT_HINT = "choose another with --listen HOST:PORT or [server] port in the config"
ADMIN_HINT = "choose another with --admin-listen HOST:PORT or [admin] listen in the config"


def test_port_in_use_raises_out_of_run_and_logs_nothing(refusing_url: str) -> None:
    """``run`` on a port another socket listens on raises the bind's ``OSError`` (the CLI
    turns it into one line), after cleaning up, with no ``proxy_started`` before it; the
    error names the agent's listener, and its line the agent's flag and config key only."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            with capture_logs() as logs, pytest.raises(OSError) as raised:
                proxy.serve.app.run(_config(refusing_url, port))
        finally:
            asyncio.set_event_loop(None)  # run_app left its closed loop as the current one
    assert raised.value.errno == errno.EADDRINUSE
    assert logs == []
    assert isinstance(raised.value, PortInUse) and raised.value.listener == "server"
    line = error_line(raised.value)
    assert f"127.0.0.1', {port}" in line and "address already in use" in line
    assert line.endswith(f"(another process holds that port: {AGENT_HINT})")
    assert "--admin-listen" not in line and "[admin]" not in line


def test_admin_port_in_use_raises_out_of_run_and_logs_nothing(refusing_url: str) -> None:
    """The admin listener's port held by another socket stops the start the same way:
    the bind's ``OSError`` out of ``run``, nothing logged; the error names the admin
    listener, and its line ``--admin-listen`` and ``[admin] listen``, not the agent's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            with capture_logs() as logs, pytest.raises(OSError) as raised:
                proxy.serve.app.run(_config(refusing_url, admin=f"127.0.0.1:{port}"))
        finally:
            asyncio.set_event_loop(None)
    assert raised.value.errno == errno.EADDRINUSE
    assert logs == []
    assert isinstance(raised.value, PortInUse) and raised.value.listener == "admin"
    line = error_line(raised.value)
    assert f"127.0.0.1', {port}" in line and "address already in use" in line
    assert line.endswith(f"(another process holds that port: {ADMIN_HINT})")
    assert "with --listen" not in line and "[server]" not in line


def test_serve_with_its_admin_port_in_use_names_the_admin_flag() -> None:
    """``timing-proxy serve`` whose admin port another process holds exits 2 with one
    line that tells the user to change ``--admin-listen`` / ``[admin] listen``."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [
                *(sys.executable, "-m", "proxy", "serve", "--listen", "127.0.0.1:0"),
                *("--admin-listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:9"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("timing-proxy: error: ")
    assert done.stderr.strip().endswith(f"(another process holds that port: {ADMIN_HINT})")
    assert "proxy_started" not in done.stdout + done.stderr


OTHER_COMMANDS = ("report", "bench", "demo", "explain", "provision", "plot")
"""The modules of the commands that are not ``serve`` (``proxy.commands.<name>[.*]``)."""


def test_serve_imports_no_other_command(
    refusing_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m proxy serve``, started, relaying a request and stopped, imports none of
    the other commands' modules (report, bench, demo, explain, provisioning, plot)."""
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # each import, on the process's stderr
    with proxy_in_front_of(refusing_url, tmp_path) as proxy:
        body = b'{"messages": [{"role": "user", "content": "hi"}]}'
        request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=body)
        with pytest.raises(urllib.error.HTTPError) as answered:
            urllib.request.urlopen(request, timeout=10)
        assert answered.value.code == 502  # relayed: the upstream refuses
        answered.value.close()  # the error holds the response and its socket
    lines = (tmp_path / "stderr.txt").read_text().splitlines()
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")
    }
    assert {"proxy.commands.cli", "proxy.serve.app", "proxy.serve.relay"} <= imported
    others = [f"proxy.commands.{name}" for name in OTHER_COMMANDS]
    loaded = sorted(
        m for m in imported if m in others or m.startswith(tuple(o + "." for o in others))
    )
    assert loaded == []


def test_other_errors_keep_their_own_line() -> None:
    """An ``OSError`` that is no port in use is its own message, with no listener hint;
    a bare ``EADDRINUSE`` (not from a listener ``run`` names) keeps the agent's hint."""
    missing = OSError(errno.ENOENT, "No such file or directory", "/nowhere/config.toml")
    assert error_line(missing) == "/nowhere/config.toml: No such file or directory"
    refused = OSError(errno.EADDRNOTAVAIL, "cannot assign requested address")
    assert error_line(refused) == "cannot assign requested address"
    bare = OSError(errno.EADDRINUSE, "address already in use")
    assert error_line(bare).endswith(f"(another process holds that port: {AGENT_HINT})")


@dataclass
class _AsRun:
    """The app as ``run`` builds it, set up (its admin listener up), its site not started."""

    runner: web.AppRunner
    admin_port: int
    announce: Callable[..., None]
    """``run_app``'s ``print``: called once every site listens."""

    async def listen(self) -> str:
        """Start the agent's site as ``run_app`` does, then announce; the agent's URL."""
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.announce("======== Running ========")
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture
async def as_run(monkeypatch: pytest.MonkeyPatch, refusing_url: str) -> AsyncIterator[_AsRun]:
    """``run``'s app in front of an upstream that refuses, admin on a free port."""
    admin_port = free_port()
    app, kwargs = run_app_arguments(
        _config(refusing_url, admin=f"127.0.0.1:{admin_port}"), monkeypatch
    )
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        yield _AsRun(runner, admin_port, kwargs["print"])
    finally:
        await runner.cleanup()


async def test_run_serves_the_pages_on_the_admin_listener_and_relays_the_rest(
    as_run: _AsRun,
) -> None:
    """As ``run`` starts it, the admin listener answers /stats while the app runs and stops
    with it; the agent's listener relays /stats like any path (here to an upstream that
    refuses: the proxy's own 502 in OpenAI's shape)."""
    agent = await as_run.listen()
    async with aiohttp.ClientSession() as client:
        status, doc = await _get_stats(client, as_run.admin_port)
        assert status == 200 and "kinds" in doc
        async with client.get(agent + "/stats") as relayed:
            assert relayed.status == 502
            assert "upstream unreachable" in (await relayed.json())["error"]["message"]
    await as_run.runner.cleanup()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", as_run.admin_port)) != 0, "admin still listening"


async def test_the_admin_pages_wait_until_the_agent_listener_listens(as_run: _AsRun) -> None:
    """The admin listener is up before the agent's (it starts first), but a /stats read
    sent then is answered only once every site listens: a readiness check that polls
    /stats (the demo, the docker healthcheck) never sees a proxy that cannot relay yet."""
    async with aiohttp.ClientSession() as client:
        early = spawn(_get_stats(client, as_run.admin_port), set())
        done, _ = await asyncio.wait({early}, timeout=0.5)
        assert not done, "the admin page answered before the agent's listener listened"
        await as_run.listen()
        status, doc = await asyncio.wait_for(early, 10)
        assert status == 200 and "kinds" in doc


async def _get_stats(client: aiohttp.ClientSession, port: int) -> tuple[int, Any]:
    async with client.get(f"http://127.0.0.1:{port}/stats") as resp:
        return resp.status, await resp.json()
