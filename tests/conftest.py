"""Shared fixtures: a fake upstream, the proxy in front of it, and the real llama-server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import SINKS, build_app
from proxy.config import Config, load_config
from proxy.record import Record
from proxy.request import RequestFacts
from proxy.tracker import Observation
from tests.fakes import FakeUpstream
from tests.llama import llama_artifacts, llama_server  # noqa: F401


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
    """A running proxy in front of ``upstream_url``, its test client and captured records."""

    client: TestClient[web.Request, web.Application]
    app: web.Application
    captured: Captured
    config: Config

    @property
    def url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")


ProxyFactory = Callable[..., Awaitable[ProxyUnderTest]]


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeUpstream, TestServer]:
    """A started fake llama-server."""
    upstream = FakeUpstream()
    server = await aiohttp_server(upstream.app)
    return upstream, server


@pytest.fixture
def make_proxy(aiohttp_client: Any) -> ProxyFactory:
    """Start the proxy against an upstream URL, with config overrides per section.

    Accounting is off unless a test passes ``accounting={"enabled": True}``.
    """

    async def start(upstream_url: str, **sections: dict[str, object]) -> ProxyUnderTest:
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
        client = await aiohttp_client(app)
        return ProxyUnderTest(client=client, app=app, captured=captured, config=config)

    return start


@pytest.fixture
async def proxied(fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory
                  ) -> tuple[FakeUpstream, ProxyUnderTest]:
    """The fake upstream and a proxy in front of it."""
    upstream, server = fake
    proxy = await make_proxy(str(server.make_url("")).rstrip("/"))
    return upstream, proxy
