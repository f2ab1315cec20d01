"""An upstream that cannot be reached: the check at start warns once naming the URL and the
cause, and each refused request's 502 body, record and log line say the same in words."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import aiohttp
from structlog.testing import capture_logs

from proxy.config import load_config
from proxy.core.record import Outcome
from proxy.serve.logs import get_logger
from proxy.serve.upstream import check_upstream, failure_cause
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import FakeUpstream, json_response

CHAT_BODY = b'{"messages":[{"role":"user","content":"hi"}]}'


async def _failure(url: str) -> BaseException:
    """What aiohttp raises for a GET of ``url``."""
    async with aiohttp.ClientSession() as session:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)):
                pass
        except (aiohttp.ClientError, TimeoutError) as exc:
            return exc
    raise AssertionError(f"{url} answered")


class TestFailureCause:
    """The cause of a failed upstream request, in words, then the exception's class."""

    async def test_connection_refused(self, refusing_url: str) -> None:
        """Nothing listening: ``connection refused (ClientConnectorError)``."""
        exc = await _failure(refusing_url + "/health")
        assert failure_cause(exc) == "connection refused (ClientConnectorError)"

    async def test_unknown_host(self) -> None:
        """A name that does not resolve says so (``.invalid`` never resolves)."""
        exc = await _failure("http://upstream.invalid/health")
        cause = failure_cause(exc)
        assert cause.startswith("host name not resolved: ")
        assert cause.endswith("(ClientConnectorDNSError)")

    def test_server_disconnected(self) -> None:
        """A connection closed before any response says so."""
        assert failure_cause(aiohttp.ServerDisconnectedError()) == (
            "the connection closed before a response (ServerDisconnectedError)"
        )

    def test_timeout(self) -> None:
        """A timeout says no answer came in time."""
        assert failure_cause(TimeoutError()) == "no answer in time (TimeoutError)"

    def test_no_words(self) -> None:
        """An error with no message gives its class alone."""
        assert failure_cause(aiohttp.ClientPayloadError()) == "ClientPayloadError"


class TestCheckAtStart:
    """``check_upstream``: GET /health once and log what came of it."""

    async def test_unreachable_upstream_is_one_warning_with_url_and_cause(
        self, refusing_url: str
    ) -> None:
        """Connection refused: one ``upstream_unreachable`` warning naming URL and cause."""
        config = load_config(None, {"upstream": {"url": refusing_url}})
        async with aiohttp.ClientSession() as session:
            with capture_logs() as logs:
                assert await check_upstream(session, config, _logger()) is False
        assert logs == [
            {
                "event": "upstream_unreachable",
                "log_level": "warning",
                "url": refusing_url + "/health",
                "cause": "connection refused (ClientConnectorError)",
            }
        ]

    async def test_answering_upstream_is_an_info_line(self, aiohttp_server: Any) -> None:
        """Any HTTP answer (here llama-server's 503 while it loads) means it is there:
        ``upstream_ok`` at info level with the status; /health is asked once."""
        upstream = FakeUpstream()
        upstream.script = json_response(503, b'{"error":{"message":"Loading model"}}')
        server = await aiohttp_server(upstream.app)
        url = str(server.make_url("")).rstrip("/")
        config = load_config(None, {"upstream": {"url": url}})
        async with aiohttp.ClientSession() as session:
            with capture_logs() as logs:
                assert await check_upstream(session, config, _logger()) is True
        assert logs == [
            {"event": "upstream_ok", "log_level": "info", "url": url + "/health", "status": 503}
        ]
        assert [s.path_qs for s in upstream.seen] == ["/health"]

    async def test_credentials_in_the_url_are_not_logged(self, refusing_url: str) -> None:
        """A user:password in the upstream URL stays out of the warning (the config refuses
        such a URL, tests/serve/test_faults_secrets.py; a Config built without the loader may
        still hold one)."""
        with_user = refusing_url.replace("http://", "http://me:sekrit@")
        config = load_config(None)
        config = dataclasses.replace(
            config, upstream=dataclasses.replace(config.upstream, url=with_user)
        )
        async with aiohttp.ClientSession() as session:
            with capture_logs() as logs:
                await check_upstream(session, config, _logger())
        assert logs[0]["url"] == refusing_url + "/health"
        assert "sekrit" not in str(logs)


class TestRefusedRequest:
    """A request the upstream cannot take: what the agent, the record and the log get."""

    async def test_502_names_the_url_and_the_cause(
        self, make_proxy: ProxyFactory, refusing_url: str
    ) -> None:
        """The OpenAI-shaped 502 body and the record's error read ``upstream unreachable:
        <upstream URL without the query>: connection refused (ClientConnectorError)``; the
        record's log line is a warning."""
        proxy = await make_proxy(refusing_url)
        with capture_logs() as logs:
            resp = await proxy.client.post("/v1/chat/completions?debug=1", data=CHAT_BODY)
            body = await resp.json()
        expected = (
            f"upstream unreachable: {refusing_url}/v1/chat/completions: "
            "connection refused (ClientConnectorError)"
        )
        assert resp.status == 502
        assert body == {
            "error": {"message": expected, "type": "server_error", "code": "upstream_unreachable"}
        }
        record = proxy.captured.last
        assert record.outcome is Outcome.UPSTREAM_UNREACHABLE and record.error == expected
        (line,) = [e for e in logs if e["event"] == "request_completed"]
        assert line["log_level"] == "warning" and line["error"] == expected

    async def test_completed_requests_stay_info(
        self, proxied: tuple[FakeUpstream, ProxyUnderTest]
    ) -> None:
        """Only the unreachable outcome is raised to a warning: a completed request is info."""
        upstream, proxy = proxied
        upstream.script = json_response(200, b'{"ok":true}')
        with capture_logs() as logs:
            resp = await proxy.client.post("/v1/chat/completions", data=CHAT_BODY)
            await resp.read()
            await _records(proxy)
        (line,) = [e for e in logs if e["event"] == "request_completed"]
        assert line["log_level"] == "info" and line["outcome"] == "completed"


def _logger() -> Any:
    return get_logger()


async def _records(proxy: ProxyUnderTest, count: int = 1) -> None:
    """Wait until ``count`` records were captured (they come after the response ends)."""
    for _ in range(500):
        if len(proxy.captured.records) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no record")
