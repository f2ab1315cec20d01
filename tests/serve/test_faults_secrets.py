"""Secrets and exposure: what the proxy refuses, warns about and keeps out of its records.

- Credentials in ``[upstream] url`` are refused at start, in one line that points at
  ``[upstream] api_key`` and never quotes the password.
- A listener bound beyond loopback without a credential check, llama-server's key unused by
  ``/metrics``, and prompt text in the records are each one warning line at start; the
  defaults say nothing.
- An admin page nobody authenticated never has the proxy's ``[upstream] api_key`` sent
  upstream for it.
- The body's ``user`` / ``metadata.user_id`` reach the records as ``u:`` and a keyed hash;
  the ``X-Conversation-Id`` header, the agent's own name for its conversation, as sent.

The Docker files' side (the admin listener's token from the environment) is in
tests/serve/test_docker.py. Modules added with these fixes are imported inside the tests, so that
each test fails on its own against code without them.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from proxy.commands.ports import free_port
from proxy.config import Config, ConfigError, load_config
from proxy.serve.keys import BACKGROUND
from tests.conftest import ProxyFactory, ProxyUnderTest, proxy_in_front_of
from tests.fakes import FakeUpstream, SeenRequest, load_recording, replay
from tests.run_app import run_app_arguments
from tests.serve.test_accounting import READ_FILE, ToyLlama, body_of, toy, wait_record
from tests.serve.test_attribution import clocked, evaluated, send, start

__all__ = ["toy"]  # the fixture, imported for the tests below

PASSWORD = "hunter2-secret"
LLAMA_METRICS = b"# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 40\n"


def _startup_warnings(config: Config) -> list[tuple[str, dict[str, str]]]:
    """The start-up warnings of ``config``, as (event, fields)."""
    exposure = importlib.import_module("proxy.serve.exposure")
    return [(w.event, dict(w.fields)) for w in exposure.startup_warnings(config)]


def _config(**sections: dict[str, object]) -> Config:
    return load_config(None, sections)


# -- credentials in [upstream] url -------------------------------------------------------------


class TestUpstreamCredentials:
    """``user:password@`` in the upstream URL: refused, pointing at ``[upstream] api_key``."""

    @pytest.mark.parametrize(
        "url",
        [
            f"http://robot:{PASSWORD}@127.0.0.1:8080",
            f"https://robot:{PASSWORD}@llama.local:8443/base",
            "http://robot@127.0.0.1:8080",
            f"http://:{PASSWORD}@127.0.0.1:8080",
        ],
    )
    def test_credentials_in_the_url_are_refused(self, tmp_path: Path, url: str) -> None:
        """A config whose upstream URL carries a user (and password) is refused with one line
        that names the key, points at ``[upstream] api_key`` and does not quote the password."""
        path = tmp_path / "config.toml"
        path.write_text(f'[upstream]\nurl = "{url}"\n', encoding="utf-8")
        with pytest.raises(ConfigError) as refused:
            load_config(path)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"{path}: [upstream] url: must not carry credentials")
        assert "[upstream] api_key" in message
        assert PASSWORD not in message and "robot" not in message

    def test_other_url_errors_do_not_quote_the_password(self) -> None:
        """A URL refused for another reason (its scheme, its port) is quoted with its
        credentials masked."""
        for url in (f"ftp://robot:{PASSWORD}@h", f"http://robot:{PASSWORD}@h:99999"):
            with pytest.raises(ConfigError) as refused:
                _config(upstream={"url": url})
            assert PASSWORD not in str(refused.value) and "***@h" in str(refused.value)

    def test_serve_with_credentials_exits_with_one_line(self) -> None:
        """``timing-proxy serve --upstream`` with credentials exits 2 before listening, with
        one ``timing-proxy: error:`` line on stderr, no traceback, nothing on stdout."""
        url = f"http://robot:{PASSWORD}@127.0.0.1:{free_port()}"
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "proxy", "serve", "--upstream", url),
                *("--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail(f"still serving after 20 s, its log: {out[:300]!r}")
        lines = err.decode().splitlines()
        assert proc.returncode == 2 and out == b""
        assert len(lines) == 1 and lines[0].startswith("timing-proxy: error: overrides: [upstream]")
        assert "[upstream] api_key" in lines[0] and PASSWORD not in lines[0]

    @pytest.mark.parametrize(
        "url",
        ["http://127.0.0.1:8080", "https://llama.local:8443/base", "http://h:1/p@th"],
    )
    def test_a_url_without_credentials_is_accepted(self, url: str) -> None:
        """An upstream URL without a user is taken as it is (an ``@`` in its path is not
        one)."""
        assert _config(upstream={"url": url}).upstream.url == url

    async def test_the_agents_authorization_reaches_the_upstream(
        self, fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory
    ) -> None:
        """Through a credential-free upstream URL, an agent's request with its own
        ``Authorization`` (the OpenAI SDK always sends one) is relayed with it and answered."""
        upstream, server = fake
        upstream.script = replay(load_recording("chat_stream"))
        proxy = await make_proxy(str(server.make_url("")).rstrip("/"))
        resp = await proxy.client.post(
            "/v1/chat/completions",
            data=load_recording("chat_stream").request_body,
            headers={"Authorization": "Bearer sk-agent", "Content-Type": "application/json"},
        )
        await resp.read()
        assert resp.status == 200
        assert upstream.seen[-1].headers["Authorization"] == "Bearer sk-agent"


# -- start-up warnings -------------------------------------------------------------------------


class TestStartupWarnings:
    """One warning per exposure at start; none for the defaults or loopback binds."""

    @pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
    def test_loopback_binds_say_nothing(self, host: str) -> None:
        """Both listeners on a loopback address (v4, v6 or ``localhost``), no token needed,
        no key, no prompt text: no warning."""
        admin = f"[{host}]:8082" if ":" in host else f"{host}:8082"
        config = _config(server={"host": host}, admin={"listen": admin})
        assert _startup_warnings(config) == []

    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "robot.local"])
    def test_the_agents_listener_beyond_loopback_is_said(self, host: str) -> None:
        """The agent's listener on any other address, a name included, is one warning naming
        the address: the proxy checks no credential on that port."""
        ((event, fields),) = _startup_warnings(_config(server={"host": host, "port": 9001}))
        assert event == "agent_listener_exposed"
        assert fields["listen"] == (f"[{host}]:9001" if ":" in host else f"{host}:9001")
        assert "no credential" in fields["why"]

    def test_the_admin_listener_beyond_loopback_without_a_token_is_said(self) -> None:
        """The admin listener beyond loopback without ``auth_token``: one warning naming the
        address and the key to set; with a token: none."""
        open_admin = _config(admin={"listen": "0.0.0.0:8082"})
        ((event, fields),) = _startup_warnings(open_admin)
        assert event == "admin_listener_exposed"
        assert fields["listen"] == "0.0.0.0:8082" and "[admin] auth_token" in fields["fix"]
        guarded = _config(admin={"listen": "0.0.0.0:8082", "auth_token": "t"})
        assert _startup_warnings(guarded) == []

    def test_a_key_without_an_admin_token_is_said(self) -> None:
        """``[upstream] api_key`` without ``[admin] auth_token``: llama-server's metrics are
        not merged (the key is never sent for an unauthenticated page), said once; with a
        token, nothing."""
        ((event, fields),) = _startup_warnings(_config(upstream={"api_key": "k"}))
        assert event == "upstream_metrics_not_merged"
        assert "[admin] auth_token" in fields["fix"]
        both = _config(upstream={"api_key": "k"}, admin={"auth_token": "t"})
        assert _startup_warnings(both) == []

    def test_prompt_text_in_the_records_is_said(self) -> None:
        """``[privacy] show_diff_text`` on: one warning that prompt text reaches the log and
        ``/stats``; off (the default): none."""
        ((event, fields),) = _startup_warnings(_config(privacy={"show_diff_text": True}))
        assert event == "diff_text_shown"
        assert "prompt text" in fields["why"] and "/stats" in fields["why"]
        assert _startup_warnings(_config(privacy={"show_diff_text": False})) == []

    def test_every_warning_at_once_in_order(self) -> None:
        """Everything exposed: the four warnings, agent's first."""
        config = _config(
            server={"host": "0.0.0.0"},
            admin={"listen": "0.0.0.0:8082"},
            upstream={"api_key": "k"},
            privacy={"show_diff_text": True},
        )
        assert [event for event, _ in _startup_warnings(config)] == [
            "agent_listener_exposed",
            "admin_listener_exposed",
            "upstream_metrics_not_merged",
            "diff_text_shown",
        ]

    async def test_run_logs_them_after_proxy_started(
        self, monkeypatch: pytest.MonkeyPatch, refusing_url: str
    ) -> None:
        """The production start (``run``) logs each warning as a warning-level event once
        the listeners listen, right after ``proxy_started``; loopback binds log none."""
        for exposed in (True, False):
            config = _config(
                server={"host": "0.0.0.0" if exposed else "127.0.0.1", "port": 0},
                admin={"listen": "127.0.0.1:0"},
                upstream={"url": refusing_url},
                accounting={"enabled": False},
                privacy={"show_diff_text": exposed},
            )
            app, kwargs = run_app_arguments(config, monkeypatch)
            runner = web.AppRunner(app, handler_cancellation=True)
            with capture_logs() as logs:
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", 0).start()  # the bind is not the test's
                kwargs["print"]("======== Running ========")
                await asyncio.gather(*app[BACKGROUND])
                await runner.cleanup()
            said = [
                (e["event"], e["log_level"]) for e in logs if e["event"] != "upstream_unreachable"
            ]
            warnings = [("agent_listener_exposed", "warning"), ("diff_text_shown", "warning")]
            started, stopped = ("proxy_started", "info"), ("proxy_stopped", "info")
            assert said == ([started, *warnings, stopped] if exposed else [started, stopped])

    def test_a_real_start_writes_each_warning_as_one_json_line(
        self, refusing_url: str, tmp_path: Path
    ) -> None:
        """``python -m proxy serve`` with a key and prompt text on writes each warning as
        one JSON line of the log, between ``proxy_started`` and the upstream check (the
        proxy's other start-up events' form), no traceback."""
        config = tmp_path / "config.toml"
        config.write_text(
            '[upstream]\napi_key = "k"\n[privacy]\nshow_diff_text = true\n', encoding="utf-8"
        )
        with proxy_in_front_of(refusing_url, tmp_path / "run", config) as proxy:
            deadline = time.monotonic() + 10
            while "upstream_unreachable" not in (names := [e["event"] for e in proxy.events()]):
                assert time.monotonic() < deadline, names
                time.sleep(0.02)
            events = proxy.events()
        stderr = (tmp_path / "run" / "stderr.txt").read_text()
        assert [e["event"] for e in events][:4] == [
            "proxy_started",
            "upstream_metrics_not_merged",
            "diff_text_shown",
            "upstream_unreachable",
        ]
        warned = [
            e for e in events if e["event"] in ("upstream_metrics_not_merged", "diff_text_shown")
        ]
        assert all(e["level"] == "warning" for e in warned)
        assert all(set(e) == {"event", "level", "timestamp", "why", "fix"} for e in warned)
        assert "Traceback" not in stderr


# -- /metrics and the proxy's api_key ----------------------------------------------------------


def _keyed_upstream(router: bool = False) -> Any:
    """A fake llama-server with ``--metrics`` (a router's ``/metrics`` wants ``?model=``)."""
    models = {"data": [{"id": "m", "status": {"value": "loaded"}}]}

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response(models)
        if router and "model" not in request.query:
            return web.json_response({"error": {"code": 400}}, status=400)
        return web.Response(body=LLAMA_METRICS, content_type="text/plain")

    return script


async def _metrics_proxy(
    fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory, **sections: Any
) -> tuple[FakeUpstream, ProxyUnderTest]:
    upstream, server = fake
    return upstream, await make_proxy(str(server.make_url("")).rstrip("/"), **sections)


def _page_requests(upstream: FakeUpstream) -> list[SeenRequest]:
    """What the admin page asked the upstream (the model look-ups of the records aside)."""
    return [s for s in upstream.seen if s.path_qs.startswith(("/metrics", "/v1/models"))]


class TestMetricsKey:
    """``/metrics`` fetches llama-server's page with the proxy's key only for a caller the
    admin token authenticated."""

    @pytest.mark.parametrize("router", [False, True])
    async def test_an_open_page_never_sends_the_key(
        self, fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory, router: bool
    ) -> None:
        """Without ``[admin] auth_token``, ``/metrics`` asks llama-server (a router's model
        list and per-model pages too) without ``[upstream] api_key``: no request it makes
        carries ``Authorization``."""
        fake[0].script = _keyed_upstream(router)
        upstream, proxy = await _metrics_proxy(fake, make_proxy, upstream={"api_key": "k"})
        page = await proxy.admin.get("/metrics")
        assert page.status == 200
        asked = _page_requests(upstream)
        assert [s.path_qs.partition("?")[0] for s in asked] == (
            ["/metrics", "/v1/models", "/metrics"] if router else ["/metrics"]
        )
        assert [s.headers.get("Authorization") for s in asked] == [None] * len(asked)

    async def test_an_authenticated_page_sends_the_key(
        self, fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory
    ) -> None:
        """With ``[admin] auth_token``: a caller without it gets a 401 and nothing is asked
        upstream; a caller with it gets llama-server's metrics, fetched with the key."""
        fake[0].script = _keyed_upstream()
        upstream, proxy = await _metrics_proxy(
            fake, make_proxy, upstream={"api_key": "k"}, admin={"auth_token": "t"}
        )
        denied = await proxy.admin.get("/metrics")
        assert denied.status == 401 and _page_requests(upstream) == []
        page = await proxy.admin.get("/metrics", headers={"Authorization": "Bearer t"})
        assert "llamacpp:prompt_tokens_total 40" in await page.text()
        (asked,) = _page_requests(upstream)
        assert asked.headers["Authorization"] == "Bearer k"


# -- conversation ids --------------------------------------------------------------------------

HASHED = re.compile(r"u:[0-9a-f]{10}")
EMAIL = "ada.lovelace@example.org"


class TestConversationIds:
    """The body's user ids are pseudonyms in the records; the header is the agent's name."""

    async def test_a_user_in_the_body_is_logged_as_a_hash(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """An e-mail address in ``user`` groups the conversation as before, under ``u:`` and
        10 hex digits: the address is in no record and not in ``/stats``."""
        proxy = await start(make_proxy, toy)
        first = await send(proxy, toy, {**clocked(1), "user": EMAIL}, 0, 1)
        second = await send(proxy, toy, {**body_of([READ_FILE]), "user": EMAIL}, 0, 2)
        assert first.conversation is not None and HASHED.fullmatch(first.conversation)
        assert [(r.conversation, r.turn) for r in (first, second)] == [
            (first.conversation, 1),
            (first.conversation, 2),
        ]
        stats = await (await proxy.admin.get("/stats")).read()
        assert first.conversation in orjson.loads(stats)["conversations"]
        for text in (stats, orjson.dumps(first.to_dict()), orjson.dumps(second.to_dict())):
            assert EMAIL.encode() not in text

    async def test_metadata_user_ids_are_hashed_and_told_apart(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """``metadata.user_id`` is hashed the same way; two users get two ids."""
        proxy = await start(make_proxy, toy)
        ids = []
        for n, user in enumerate(("user-7@example.org", "user-8@example.org"), start=1):
            body = {**clocked(n), "metadata": {"user_id": user}}
            record = await send(proxy, toy, body, 0, n)
            assert record.conversation is not None and HASHED.fullmatch(record.conversation)
            ids.append(record.conversation)
        assert ids[0] != ids[1]

    async def test_raw_ids_when_configured(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """``[privacy] raw_conversation_ids = true`` keeps the body's id as sent."""
        proxy = await start(make_proxy, toy, raw_conversation_ids=True)
        record = await send(proxy, toy, {**clocked(1), "user": EMAIL}, 0, 1)
        assert record.conversation == EMAIL

    async def test_the_header_is_kept_as_sent(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """The ``X-Conversation-Id`` header, which an agent sends to name its conversation
        for this proxy, is the record's ``conversation`` as sent, before the body's user."""
        proxy = await start(make_proxy, toy)
        body = {**clocked(1), "user": EMAIL}
        evaluated(toy, body, 0)
        resp = await proxy.client.post(
            "/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", "X-Conversation-Id": "arm-7/task-3"},
        )
        await resp.read()
        record = await wait_record(proxy)
        assert (record.conversation, record.turn) == ("arm-7/task-3", 1)

    def test_raw_conversation_ids_is_off_by_default(self) -> None:
        """The default config, and the repository's config.toml, hash the body's ids."""
        root = Path(__file__).resolve().parents[2]
        for config in (_config(), load_config(root / "config.toml")):
            assert config.privacy.raw_conversation_ids is False
