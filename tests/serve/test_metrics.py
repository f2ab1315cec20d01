"""``/metrics``: Prometheus text with the proxy's histograms, llama-server's metrics merged in,
and the bearer token on the reserved paths."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import ConfigError, parse_labels
from proxy.core.findings import Cause
from proxy.core.record import Kind, Outcome, Record
from proxy.serve.metrics import BOARD_GAUGES, Metrics
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import FakeUpstream, SeenRequest, load_recording, replay
from tests.serve.test_accounting import ToyLlama, toy
from tests.serve.test_attribution import clocked, send
from tests.serve.test_attribution import start as start_attributing

__all__ = ["toy"]  # the fixture, imported for the test below

LLAMA_METRICS = (
    b"# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
    b"# TYPE llamacpp:prompt_tokens_total counter\n"
    b"llamacpp:prompt_tokens_total 40\n"
)


def _routed(metrics: bytes | None) -> Any:
    """A fake llama-server: /metrics answers ``metrics`` (501 when None), the rest replays."""
    chat = replay(load_recording("chat_stream"))

    async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        if request.path == "/metrics":
            if metrics is None:
                return web.json_response({"error": {"code": 501}}, status=501)
            return web.Response(body=metrics, content_type="text/plain")
        return await chat(request, seen)

    return script


async def _start(
    fake: Any, make_proxy: ProxyFactory, metrics: bytes | None, **sections: dict[str, object]
) -> ProxyUnderTest:
    upstream, server = fake
    upstream.script = _routed(metrics)
    return await make_proxy(str(server.make_url("")).rstrip("/"), **sections)


async def _chat(proxy: ProxyUnderTest, n: int) -> None:
    body = load_recording("chat_stream").request_body
    for _ in range(n):
        resp = await proxy.client.post("/v1/chat/completions", data=body)
        await resp.read()
    deadline = time.monotonic() + 5
    while len(proxy.captured.records) < n:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


class TestMetricsPage:
    """What a Prometheus scrape of the proxy reads."""

    async def test_ttft_histogram_counts_each_request(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """After three streamed chats the TTFT histogram has count 3 under model and kind."""
        proxy = await _start(fake, make_proxy, LLAMA_METRICS)
        await _chat(proxy, 3)
        resp = await proxy.admin.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        fams = _families(await resp.text())
        ttft = fams["gen_ai_server_time_to_first_token_seconds"]
        counts = [s for s in ttft.samples if s.name.endswith("_count")]
        assert len(counts) == 1
        assert counts[0].value == 3
        labels = {"model": proxy.captured.last.model, "kind": "chat", "api": "chat_completions"}
        assert counts[0].labels == labels
        infinity = [
            s for s in ttft.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"
        ]
        assert infinity[0].value == 3
        assert (
            max(
                float(s.labels["le"])
                for s in ttft.samples
                if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
            )
            >= 300
        )

    async def test_request_counter_and_token_counters(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """Requests are counted by kind, API, outcome and status; prompt tokens by cache
        state."""
        proxy = await _start(fake, make_proxy, LLAMA_METRICS)
        await _chat(proxy, 2)
        fams = _families(await (await proxy.admin.get("/metrics")).text())
        reqs = {
            tuple(sorted(s.labels.items())): s.value for s in fams["timing_proxy_requests"].samples
        }
        key = tuple(
            sorted(
                {
                    "model": proxy.captured.last.model,
                    "kind": "chat",
                    "api": "chat_completions",
                    "outcome": "completed",
                    "status": "200",
                }.items()
            )
        )
        assert reqs[key] == 2
        tokens = {
            s.labels["cached"]: s.value for s in fams["timing_proxy_prompt_tokens_by_cache"].samples
        }
        r = proxy.captured.last
        assert r.prompt_tokens is not None and r.cache_n is not None
        assert tokens["false"] == 2 * (r.prompt_tokens - r.cache_n)
        assert tokens["true"] == 2 * r.cache_n

    async def test_llama_server_metrics_are_merged(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """llama-server's own families follow the proxy's, and the up gauge says so."""
        proxy = await _start(fake, make_proxy, LLAMA_METRICS)
        fams = _families(await (await proxy.admin.get("/metrics")).text())
        assert fams["llamacpp:prompt_tokens"].samples[0].value == 40
        assert fams["timing_proxy_upstream_metrics_up"].samples[0].value == 1

    async def test_upstream_without_metrics(self, fake: Any, make_proxy: ProxyFactory) -> None:
        """Without llama-server --metrics the page still answers, with the up gauge at 0."""
        proxy = await _start(fake, make_proxy, None)
        text = await (await proxy.admin.get("/metrics")).text()
        fams = _families(text)
        assert fams["timing_proxy_upstream_metrics_up"].samples[0].value == 0
        assert "llamacpp:" not in text


class TestAccess:
    """The bearer token guards every page of the admin listener, and nothing the agent sends."""

    async def test_reserved_paths_need_the_token(self, fake: Any, make_proxy: ProxyFactory) -> None:
        """With auth_token set, the admin pages answer 401 without it and 200 with it."""
        proxy = await _start(fake, make_proxy, LLAMA_METRICS, admin={"auth_token": "s3cret"})
        for path in ("/stats", "/metrics", "/dashboard", "/stats/records/none"):
            denied = await proxy.admin.get(path)
            assert denied.status == 401, path
            assert (await denied.json())["error"]["code"] == "unauthorized"
            wrong = await proxy.admin.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status == 401, path
            ok = await proxy.admin.get(path, headers={"Authorization": "Bearer s3cret"})
            assert ok.status == (404 if path.endswith("none") else 200), path
        page = await proxy.admin.get("/dashboard?token=s3cret")
        assert page.status == 200

    async def test_relayed_paths_are_not_guarded(self, fake: Any, make_proxy: ProxyFactory) -> None:
        """The agent's requests pass without the proxy's token: llama-server checks its own."""
        proxy = await _start(fake, make_proxy, LLAMA_METRICS, admin={"auth_token": "s3cret"})
        upstream: FakeUpstream = fake[0]
        await _chat(proxy, 1)
        assert proxy.captured.last.status == 200
        # the record's roofline may have asked GET /v1/models since (the model's metadata)
        relayed = [s.path_qs for s in upstream.seen if s.path_qs != "/v1/models"]
        assert relayed[-1] == "/v1/chat/completions"


class TestTransparentAgentPort:
    """Every path of the agent's listener is llama-server's: the proxy's pages live on the
    admin listener only."""

    async def test_metrics_on_the_agents_port_is_llama_servers_byte_for_byte(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """GET /metrics through the agent's port is llama-server's answer: the same status,
        body and headers (Process-Start-Time-Unix included), not the proxy's page."""
        upstream, server = fake

        async def script(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
            return web.Response(
                body=LLAMA_METRICS,
                headers={
                    "Content-Type": "text/plain; version=0.0.4",
                    "Process-Start-Time-Unix": "1796085800",
                },
            )

        upstream.script = script
        proxy = await make_proxy(str(server.make_url("")).rstrip("/"))
        resp = await proxy.client.get("/metrics")
        assert resp.status == 200
        assert await resp.read() == LLAMA_METRICS
        assert resp.headers["Process-Start-Time-Unix"] == "1796085800"
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4"
        assert upstream.seen[-1].path_qs == "/metrics"

    async def test_a_server_without_metrics_answers_501_through_the_proxy(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """llama-server started without --metrics answers 501: so does the agent's port,
        with llama-server's own body; the admin page still has the proxy's metrics."""
        proxy = await _start(fake, make_proxy, None)
        relayed = await proxy.client.get("/metrics")
        assert relayed.status == 501
        assert (await relayed.json()) == {"error": {"code": 501}}
        own = await proxy.admin.get("/metrics")
        assert own.status == 200
        assert "timing_proxy_upstream_metrics_up" in await own.text()

    async def test_stats_and_dashboard_paths_are_relayed_too(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """/stats, /stats/records/x and /dashboard on the agent's port go to llama-server."""
        upstream, server = fake
        upstream.script = replay(load_recording("health"))
        proxy = await make_proxy(str(server.make_url("")).rstrip("/"))
        for path in ("/stats", "/stats/records/x", "/dashboard"):
            resp = await proxy.client.get(path)
            await resp.read()
            assert upstream.seen[-1].path_qs == path

    async def test_admin_listener_answers_only_its_pages_in_openais_shape(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """Any other path on the admin listener is a 404, and a POST to a page a 405, each
        with an OpenAI-shaped error body; nothing reaches llama-server."""
        upstream, server = fake
        proxy = await make_proxy(str(server.make_url("")).rstrip("/"))
        missing = await proxy.admin.post("/v1/chat/completions", data=b"{}")
        assert missing.status == 404
        assert (await missing.json())["error"]["code"] == "not_found"
        wrong = await proxy.admin.post("/stats", data=b"{}")
        assert wrong.status == 405
        assert (await wrong.json())["error"]["code"] == "method_not_allowed"
        assert upstream.seen == []


class TestUpstreamKey:
    """llama-server started with --api-key: the proxy's own requests need the key too."""

    async def test_api_key_is_sent_on_the_proxys_own_requests(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """With upstream.api_key set, the /metrics merge of an authenticated page (admin
        auth_token set) authenticates and succeeds; the agent's own requests are untouched."""
        upstream, server = fake
        chat = _routed(LLAMA_METRICS)

        async def guarded(request: web.Request, seen: SeenRequest) -> web.StreamResponse:
            if request.path == "/metrics" and request.headers.get("Authorization") != "Bearer k":
                return web.json_response({"error": {"code": 401}}, status=401)
            response: web.StreamResponse = await chat(request, seen)
            return response

        upstream.script = guarded
        url = str(server.make_url("")).rstrip("/")
        without = await make_proxy(url)
        text = await (await without.admin.get("/metrics")).text()
        assert "llamacpp:" not in text
        keyed = await make_proxy(url, upstream={"api_key": "k"}, admin={"auth_token": "t"})
        page = await keyed.admin.get("/metrics", headers={"Authorization": "Bearer t"})
        text = await page.text()
        assert _families(text)["llamacpp:prompt_tokens"].samples[0].value == 40
        await _chat(keyed, 1)
        agent = [s for s in upstream.seen if s.path_qs == "/v1/chat/completions"][-1]
        assert "Authorization" not in agent.headers


def test_an_error_is_counted_but_not_timed() -> None:
    """A 500 answered in 3 ms counts in the request counter under its outcome and status,
    and adds nothing to the latency histograms."""
    metrics = Metrics()
    base: dict[str, Any] = {"id": "r", "ts": "t", "method": "POST", "path": "/v1/chat/completions"}
    metrics.observe(Record(**base, kind=Kind.TOOL, status=200, e2e_ms=15_000.0))
    metrics.observe(
        Record(**base, kind=Kind.TOOL, status=500, outcome=Outcome.UPSTREAM_ERROR, e2e_ms=3.0)
    )
    fams = _families(metrics.render(None).decode())
    e2e = fams["gen_ai_server_request_duration_seconds"]
    (count,) = [s.value for s in e2e.samples if s.name.endswith("_count")]
    requests = {
        (s.labels["outcome"], s.labels["status"]): s.value
        for s in fams["timing_proxy_requests"].samples
        if s.name.endswith("_total")
    }
    assert count == 1
    assert requests == {("completed", "200"): 1.0, ("upstream_error", "500"): 1.0}


def _lost_seconds(metrics: Metrics) -> dict[tuple[str, str], float]:
    """``timing_proxy_prefill_lost_seconds_total`` by (model, cause)."""
    fams = _families(metrics.render(None).decode())
    return {
        (s.labels["model"], s.labels["cause"]): s.value
        for s in fams["timing_proxy_prefill_lost_seconds"].samples
        if s.name.endswith("_total")
    }


def _lost_tokens(metrics: Metrics) -> dict[str, float]:
    """``timing_proxy_cache_lost_tokens_total`` by model."""
    fams = _families(metrics.render(None).decode())
    return {
        s.labels["model"]: s.value
        for s in fams["timing_proxy_cache_lost_tokens"].samples
        if s.name.endswith("_total")
    }


class TestPrefixCounters:
    """The prefix attribution on /metrics: prefill lost by cause, tokens the cache lost."""

    @staticmethod
    def attributed(i: int, model: str = "gemma", **fields: Any) -> Record:
        """A completed chat record with prefix fields."""
        base: dict[str, Any] = {"ts": "t", "method": "POST", "path": "/v1/chat/completions"}
        return Record(id=f"r{i}", model=model, kind=Kind.CHAT, status=200, **base, **fields)

    def test_lost_seconds_sum_per_model_and_cause(self) -> None:
        """Each record with a cause adds its prefill_lost_ms / 1000 under (model, cause);
        records without a cause add nothing, a cause without an estimate adds 0."""
        records = [
            self.attributed(0, prefill_cause="system_prompt_changed", prefill_lost_ms=640.5),
            self.attributed(1, prefill_cause="system_prompt_changed", prefill_lost_ms=120.25),
            self.attributed(2, prefill_cause="tools_changed", prefill_lost_ms=88.0),
            self.attributed(3, "qwen", prefill_cause="tools_changed", prefill_lost_ms=9.5),
            self.attributed(4, prefill_cause="slot_evicted", prefill_lost_ms=None),
            self.attributed(5, prefix_kind="extends", prefill_lost_ms=None),
        ]
        metrics = Metrics()
        for r in records:
            metrics.observe(r)
        expected: dict[tuple[str, str], float] = {}
        for r in records:
            if r.prefill_cause is not None:
                key = (r.model or "", r.prefill_cause)
                expected[key] = expected.get(key, 0.0) + (r.prefill_lost_ms or 0.0) / 1000.0
        got = _lost_seconds(metrics)
        assert set(got) == set(expected)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value), key
        assert ("gemma", "slot_evicted") in got

    def test_cause_label_is_the_closed_set(self) -> None:
        """A cause outside findings.Cause (another harness's record) is not a label value:
        every cause label on the page is one of the Cause members."""
        metrics = Metrics()
        metrics.observe(self.attributed(0, prefill_cause="made_up", prefill_lost_ms=5000.0))
        metrics.observe(self.attributed(1, prefill_cause="compaction", prefill_lost_ms=50.0))
        causes = {cause for _, cause in _lost_seconds(metrics)}
        assert causes == {"compaction"}
        assert causes <= {str(c) for c in Cause}

    def test_cache_lost_tokens_sum_per_model(self) -> None:
        """cache_lost_tokens are summed per model; unknown or 0 add nothing."""
        records = [
            self.attributed(0, cache_lost_tokens=300),
            self.attributed(1, cache_lost_tokens=42),
            self.attributed(2, cache_lost_tokens=None),
            self.attributed(3, "qwen", cache_lost_tokens=7),
            self.attributed(4, "qwen", cache_lost_tokens=0),
        ]
        metrics = Metrics()
        for r in records:
            metrics.observe(r)
        expected: dict[str, float] = {}
        for r in records:
            expected[r.model or ""] = expected.get(r.model or "", 0.0) + (r.cache_lost_tokens or 0)
        assert _lost_tokens(metrics) == expected


async def test_a_changed_system_prompt_is_on_the_page(
    toy: ToyLlama, make_proxy: ProxyFactory
) -> None:
    """Through the proxy with attribution on, a clock in the system prompt: the second
    request's prefill_lost_ms is on /metrics under system_prompt_changed, and its
    cache_lost_tokens in the tokens counter."""
    proxy = await start_attributing(make_proxy, toy)
    await send(proxy, toy, clocked(1), 0, 1)
    second = await send(proxy, toy, clocked(2), 0, 2)
    assert second.prefill_cause == "system_prompt_changed"
    assert second.prefill_lost_ms is not None and second.cache_lost_tokens
    fams = _families(await (await proxy.admin.get("/metrics")).text())
    lost = {
        (s.labels["model"], s.labels["cause"]): s.value
        for s in fams["timing_proxy_prefill_lost_seconds"].samples
        if s.name.endswith("_total")
    }
    assert lost == {
        (second.model, "system_prompt_changed"): pytest.approx(second.prefill_lost_ms / 1000.0)
    }
    tokens = [
        s for s in fams["timing_proxy_cache_lost_tokens"].samples if s.name.endswith("_total")
    ]
    lost_tokens = sum(r.cache_lost_tokens or 0 for r in proxy.captured.records)
    assert [(s.labels["model"], s.value) for s in tokens] == [(second.model, lost_tokens)]


def _record(i: int, **fields: Any) -> Record:
    """A completed tool record of model gemma on Chat Completions with ``fields``."""
    base: dict[str, Any] = {"ts": "t", "method": "POST", "path": "/v1/chat/completions"}
    return Record(
        id=f"x{i}",
        model="gemma",
        kind=Kind.TOOL,
        api="chat_completions",
        status=200,
        **base,
        **fields,
    )


def _page(metrics: Metrics, board: dict[str, float] | None = None) -> dict[str, Any]:
    return _families(metrics.render(None, board).decode())


class TestSpeculationImagesBoard:
    """The families of drafts, images and the board: draft acceptance, image tokens and
    prefill, energy, board gauges."""

    def test_acceptance_histogram_counts_only_drafting_requests(self) -> None:
        """timing_proxy_draft_acceptance_ratio observes draft_acceptance of the requests that
        drafted (55/60 lands in the 0.95 bucket, not 0.9); the others add no observation."""
        metrics = Metrics()
        metrics.observe(_record(0, draft_acceptance=55 / 60))
        metrics.observe(_record(1, draft_acceptance=0.5))
        metrics.observe(_record(2))
        samples = _page(metrics)["timing_proxy_draft_acceptance_ratio"].samples
        by = {(s.name, s.labels.get("le")): s.value for s in samples}
        assert by[("timing_proxy_draft_acceptance_ratio_count", None)] == 2
        assert by[("timing_proxy_draft_acceptance_ratio_bucket", "0.9")] == 1
        assert by[("timing_proxy_draft_acceptance_ratio_bucket", "0.95")] == 2
        assert by[("timing_proxy_draft_acceptance_ratio_sum", None)] == pytest.approx(55 / 60 + 0.5)

    def test_image_tokens_and_prefill_seconds(self) -> None:
        """Image tokens are a histogram per (model, kind, api); the image prefill sums per
        model in seconds, a cached image adding 0."""
        metrics = Metrics()
        metrics.observe(_record(0, image_tokens=259, image_prefill_ms=1200.0))
        metrics.observe(_record(1, image_tokens=259, image_prefill_ms=0.0))
        fams = _page(metrics)
        tokens = {s.name: s.value for s in fams["timing_proxy_image_tokens"].samples}
        assert tokens["timing_proxy_image_tokens_count"] == 2
        assert tokens["timing_proxy_image_tokens_sum"] == 518
        paid = [s for s in fams["timing_proxy_image_prefill_seconds"].samples]
        assert [(s.labels["model"], s.value) for s in paid if s.name.endswith("_total")] == [
            ("gemma", pytest.approx(1.2))
        ]

    def test_energy_and_upstream_cpu_sum_in_base_units(self) -> None:
        """energy_mj sums as joules and upstream_cpu_ms as seconds; unknown adds nothing."""
        metrics = Metrics()
        metrics.observe(_record(0, energy_mj=2500.0, upstream_cpu_ms=300.0))
        metrics.observe(_record(1, energy_mj=500.0, upstream_cpu_ms=100.0))
        metrics.observe(_record(2))
        fams = _page(metrics)
        joules = [s.value for s in fams["timing_proxy_energy_joules"].samples]
        assert joules == [pytest.approx(3.0)]
        cpu = [s.value for s in fams["timing_proxy_request_upstream_cpu_seconds"].samples]
        assert cpu == [pytest.approx(0.4)]
        count = {s.name: s.value for s in fams["timing_proxy_request_energy_joules"].samples}
        assert count["timing_proxy_request_energy_joules_count"] == 2

    def test_board_gauges_take_the_latest_sample(self) -> None:
        """The board gauges show what the telemetry last reported; keys it does not know
        are ignored, and a gauge it no longer reports (or none, without a sampler) is not on
        the page: no 0 W that reads as a measurement."""
        metrics = Metrics()
        assert "timing_proxy_board_power_watts" not in _page(metrics)
        fams = _page(metrics, {"power_w": 7.5, "gpu_busy_pct": 99.0, "bogus": 1.0})
        assert fams["timing_proxy_board_power_watts"].samples[0].value == 7.5
        assert fams["timing_proxy_board_gpu_busy_percent"].samples[0].value == 99.0
        assert not [name for name in fams if "bogus" in name]
        fams = _page(metrics, {"power_w": 5.25})
        assert fams["timing_proxy_board_power_watts"].samples[0].value == 5.25
        assert "timing_proxy_board_gpu_busy_percent" not in fams


FLEET = {"robot": "arm-3", "site": "lab"}


def every_family_record(i: int) -> Record:
    """A completed tool record with a value for every field a family of the page reads
    (with :data:`BOARD_SAMPLE` rendered, every family of the page has samples)."""
    return _record(
        i,
        ttft_ms=180.0,
        e2e_ms=900.0,
        prefill_ms=150.0,
        decode_ms=700.0,
        tool_call_ms=850.0,
        overhead_ms=30.0,
        predicted_n=12,
        prompt_tokens=400,
        cache_n=100,
        schema_tokens=220,
        schema_prefill_ms=80.0,
        schema_saved_ms=20.0,
        schema_prefilled_again=True,
        prefill_cause="tools_changed",
        prefill_lost_ms=60.0,
        cache_lost_tokens=50,
        draft_acceptance=0.75,
        image_tokens=259,
        image_prefill_ms=300.0,
        energy_mj=1500.0,
        upstream_cpu_ms=250.0,
    )


def _fed(labels: dict[str, str]) -> Metrics:
    """Metrics with ``labels``, fed one record that touches every family."""
    metrics = Metrics(labels)
    metrics.observe(every_family_record(0))
    return metrics


BOARD_SAMPLE: dict[str, float] = {key: 10.0 + i for i, key in enumerate(BOARD_GAUGES)}
"""A telemetry sample reporting every board gauge."""


class TestFleetLabels:
    """``[fleet] labels``: constant labels on every sample of the proxy's own families."""

    def test_every_sample_of_every_family_carries_the_labels(self) -> None:
        """With fleet labels, every sample of every family the proxy exports (histograms,
        counters, the up gauge, the board gauges) carries each label with its value, and
        the families are the same as without labels."""
        labelled = _families(_fed(FLEET).render(None, BOARD_SAMPLE).decode())
        plain = _families(_fed({}).render(None, BOARD_SAMPLE).decode())
        assert set(labelled) == set(plain)
        assert all(family.samples for family in labelled.values())
        assert "timing_proxy_board_power_watts" in labelled
        samples = [s for family in labelled.values() for s in family.samples]
        assert samples
        missing = [s for s in samples if {k: s.labels.get(k) for k in FLEET} != FLEET]
        assert missing == []

    def test_labels_add_nothing_else(self) -> None:
        """The labelled page, fleet labels taken off, holds exactly the samples and values
        of the page without them."""

        def samples(metrics: Metrics) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
            return sorted(
                (
                    s.name,
                    tuple(sorted((k, v) for k, v in s.labels.items() if k not in FLEET)),
                    s.value,
                )
                for family in _families(metrics.render(None, BOARD_SAMPLE).decode()).values()
                for s in family.samples
            )

        assert samples(_fed(FLEET)) == samples(_fed({}))

    def test_without_labels_the_page_is_as_before(self) -> None:
        """No fleet labels (the default, or an empty set) renders the same bytes as a
        Metrics built without the argument, and no sample carries a fleet label name."""
        default = Metrics()
        default.observe(every_family_record(0))
        page = default.render(None, BOARD_SAMPLE)
        assert _fed({}).render(None, BOARD_SAMPLE) == page
        names = {k for f in _families(page.decode()).values() for s in f.samples for k in s.labels}
        assert not names & set(FLEET)

    def test_no_fleet_label_can_shadow_a_label_of_the_page(self) -> None:
        """Every label name the page uses (and Prometheus's own target labels) is refused by
        parse_labels, so a fleet label never overwrites or is overwritten by one."""
        page = _families(_fed({}).render(None, BOARD_SAMPLE).decode())
        used = {k for f in page.values() for s in f.samples for k in s.labels}
        assert {"model", "kind", "api", "le"} <= used
        for name in used | {"job", "instance"}:
            with pytest.raises(ConfigError):
                parse_labels(f"{name}=x")

    async def test_the_served_page_carries_the_configured_labels(
        self, fake: Any, make_proxy: ProxyFactory
    ) -> None:
        """Through the proxy with ``[fleet] labels``: the proxy's families on /metrics carry
        the labels; llama-server's merged ``llamacpp:*`` families are relayed without them."""
        labels = ",".join(f"{k}={v}" for k, v in FLEET.items())
        proxy = await _start(fake, make_proxy, LLAMA_METRICS, fleet={"labels": labels})
        await _chat(proxy, 2)
        fams = _families(await (await proxy.admin.get("/metrics")).text())
        ours = [
            s for name, f in fams.items() if not name.startswith("llamacpp:") for s in f.samples
        ]
        assert ours and all(s.labels.items() >= FLEET.items() for s in ours)
        count = [
            s.value
            for s in fams["gen_ai_server_time_to_first_token_seconds"].samples
            if s.name.endswith("_count")
        ]
        assert count == [2]
        (theirs,) = fams["llamacpp:prompt_tokens"].samples
        assert theirs.labels == {}
