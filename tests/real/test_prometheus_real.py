"""A real Prometheus scrapes the proxy in front of the real llama-server.

Debian's ``prometheus`` binary (apt package ``prometheus``; ``.ci/run`` installs it) is
started by the test itself with a temporary config (1 s scrape interval, one job: the proxy's
metrics URL), its own TSDB folder and a free port: no service of the package is used. The
proxy runs as a user starts it, with ``[fleet] labels``. After a few streamed chat and tool
requests the test waits for a scrape that began after the last record, and reads through
Prometheus's HTTP API (``/api/v1/query``):

- the TTFT median per kind, ``histogram_quantile(0.5, sum by (le) (…_bucket))``, against
  ``/stats``' ``ttft_ms.p50``: within one bucket of :data:`proxy.serve.metrics.SECONDS`.
  The query reads the cumulative buckets, not ``rate``/``increase`` over a window: ``/stats``
  summarises every request since the proxy started, which is what the cumulative buckets
  count; a windowed ``increase`` starts from a series' first scrape, so the requests before
  it (here: all of them, the series appear with the first request) are not in it;
- the request counters per kind against the requests made;
- the fleet labels on every series of the proxy's own families, and not on llama-server's
  merged ``llamacpp:*`` ones.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.commands.ports import free_port
from proxy.commands.provision import LlamaServer
from proxy.core.headers import REQUEST_ID_HEADER
from proxy.serve.metrics import SECONDS
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama import debian_tool
from tests.llama_variants import GET_WEATHER
from tests.serve.test_docker import DASHBOARD, dashboard_queries, grafana_query

pytestmark = pytest.mark.real

PROMETHEUS = os.environ.get("TIMING_PROXY_PROMETHEUS", "/usr/bin/prometheus")
JOB = "timing-proxy"
FLEET = {"robot": "arm-3", "site": "lab"}
CHATS = 4
TOOLS = 3
START_TIMEOUT = 60.0
SCRAPE_TIMEOUT = 30.0

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@dataclass
class Prometheus:
    """A running Prometheus and its HTTP API."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def _get(self, promql: str) -> dict[str, Any]:
        qs = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{qs}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        data: dict[str, Any] = body["data"]
        return data

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result vector of an instant query at the current time."""
        data = self._get(promql)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def samples(self, selector: str, seconds: int) -> list[tuple[float, float]]:
        """(timestamp, value) of the stored samples of one series over the last ``seconds``
        (a range selector: the samples as scraped, with their own timestamps)."""
        data = self._get(f"{selector}[{seconds}s]")
        assert data["resultType"] == "matrix", data
        assert len(data["result"]) <= 1, data
        return [(float(t), float(v)) for row in data["result"] for t, v in row["values"]]

    def scalar(self, promql: str) -> float | None:
        """The value of a query with at most one series (None for none)."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None


@contextmanager
def prometheus_scraping(metrics_url: str, folder: Path) -> Iterator[Prometheus]:
    """``prometheus`` scraping ``metrics_url`` every second, its data in ``folder``."""
    binary = debian_tool(PROMETHEUS, "prometheus")
    target = urllib.parse.urlsplit(metrics_url)
    config = folder / "prometheus.yml"
    # JSON is YAML: no YAML writer needed
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {
                        "job_name": JOB,
                        "scheme": target.scheme,
                        "metrics_path": target.path,
                        "static_configs": [{"targets": [target.netloc]}],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    port = free_port()
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
        )
    server = Prometheus(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    try:
        _wait_ready(server)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_ready(server: Prometheus) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(server.url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert server.proc.poll() is None, server.log.read_text()
        assert time.monotonic() < deadline, "prometheus did not start: " + server.log.read_text()
        time.sleep(0.2)


@contextmanager
def labelled_proxy(upstream: str, folder: Path) -> Iterator[ProxyProcess]:
    """``python -m proxy serve --config`` with ``[fleet] labels`` in front of ``upstream``,
    as a user starts it (agent and admin listeners on free ports); stopped on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    labels = ",".join(f"{k}={v}" for k, v in FLEET.items())
    config = folder / "config.toml"
    config.write_text(f'[fleet]\nlabels = "{labels}"\n', encoding="utf-8")
    with proxy_in_front_of(upstream, folder, config=config) as proxy:
        yield proxy


def _stream(proxy: ProxyProcess, body: dict[str, Any]) -> dict[str, Any]:
    """POST a streamed Chat Completions request, read it to the end, return its record."""
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps({"model": "gemma", "stream": True, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()
        request_id = resp.headers[REQUEST_ID_HEADER]
    return proxy.record(request_id, within=15)


def _drive(proxy: ProxyProcess) -> list[dict[str, Any]]:
    """CHATS chat and TOOLS tool requests, varied so the TTFTs are not all one value."""
    records = []
    for i in range(CHATS):
        words = " ".join(["robot"] * (8 * i))
        body = {
            "messages": [{"role": "user", "content": f"Say hello {i}. {words}"}],
            "max_tokens": 16,
            "temperature": 0,
            **NO_THINKING,
        }
        records.append(_stream(proxy, body))
    for i in range(TOOLS):
        body = {
            "messages": [{"role": "user", "content": f"Weather in city number {i}?"}],
            "tools": [GET_WEATHER],
            "max_tokens": 48,
            "temperature": 0,
            "stop": ["</tool_call>"],
            "parallel_tool_calls": False,
            **NO_THINKING,
        }
        records.append(_stream(proxy, body))
    return records


def _wait_for_a_scrape_after(prom: Prometheus, moment: float) -> None:
    """Wait until Prometheus holds a successful scrape (``up`` 1) that began after
    ``moment`` (Unix s); a scrape that timed out on a busy machine is waited past."""
    deadline = time.monotonic() + SCRAPE_TIMEOUT
    while not any(t > moment and v == 1 for t, v in prom.samples(f'up{{job="{JOB}"}}', 10)):
        assert time.monotonic() < deadline, f"no scrape after {moment}: " + prom.log.read_text()
        time.sleep(0.25)


def _stats(proxy: ProxyProcess) -> dict[str, Any]:
    with urllib.request.urlopen(proxy.admin_url + "/stats", timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def _bucket(seconds: float) -> int:
    """The index of the histogram bucket ``seconds`` falls in (``le`` bounds: SECONDS)."""
    return bisect_left(SECONDS, seconds)


@dataclass
class Scraped:
    """What the test made and what the two readers of it report."""

    records: list[dict[str, Any]]
    stats: dict[str, Any]
    prom: Prometheus
    proxy: ProxyProcess


@pytest.fixture(scope="module")
def scraped(
    llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scraped]:
    """A labelled proxy in front of the real llama-server, a real Prometheus scraping it, the
    requests made and a scrape taken after the last of them."""
    folder = tmp_path_factory.mktemp("prometheus")
    with (
        labelled_proxy(llama_server.url, folder / "proxy") as proxy,
        prometheus_scraping(proxy.metrics_url, folder) as prom,
    ):
        records = _drive(proxy)
        _wait_for_a_scrape_after(prom, time.time())
        yield Scraped(records=records, stats=_stats(proxy), prom=prom, proxy=proxy)


@pytest.mark.parametrize("kind", ["chat", "tool"])
def test_ttft_median_agrees_with_stats(scraped: Scraped, kind: str) -> None:
    """Prometheus's histogram_quantile(0.5) of the TTFT buckets of one kind lies within one
    bucket of /stats' ttft_ms p50 of that kind (within 1 % of the exact median of the same
    requests)."""
    stats_p50_ms = scraped.stats["kinds"][kind]["ttft_ms"]["p50"]
    assert stats_p50_ms is not None and stats_p50_ms > 0
    estimate = scraped.prom.scalar(
        "histogram_quantile(0.5, sum by (le) ("
        f'gen_ai_server_time_to_first_token_seconds_bucket{{job="{JOB}",kind="{kind}"}}))'
    )
    assert estimate is not None
    print(f"{kind}: prometheus p50 {estimate * 1000:.1f} ms, /stats p50 {stats_p50_ms:.1f} ms")
    assert abs(_bucket(estimate) - _bucket(stats_p50_ms / 1000)) <= 1


def test_request_counters_match_the_requests_made(scraped: Scraped) -> None:
    """sum by (kind) of timing_proxy_requests_total equals the requests made of each kind
    (and the records the proxy wrote, and /stats' count); the TTFT histogram counted each."""
    made = Counter(r["kind"] for r in scraped.records)
    assert made == {"chat": CHATS, "tool": TOOLS}
    assert Counter(r["kind"] for r in scraped.proxy.records().values()) == made
    counted = {
        row["metric"]["kind"]: float(row["value"][1])
        for row in scraped.prom.query(f'sum by (kind) (timing_proxy_requests_total{{job="{JOB}"}})')
    }
    assert counted == {kind: float(n) for kind, n in made.items()}
    assert scraped.stats["requests"] == sum(made.values())
    timed = scraped.prom.scalar(
        f'sum(gen_ai_server_time_to_first_token_seconds_count{{job="{JOB}"}})'
    )
    assert timed == sum(made.values())


def test_fleet_labels_are_on_the_proxys_series_only(scraped: Scraped) -> None:
    """Every stored series of the proxy's own families carries the fleet labels; none lacks
    them; llama-server's merged llamacpp:* series are stored without them."""
    ours = f'{{job="{JOB}",__name__=~"timing_proxy_.+|gen_ai_.+"'
    labelled = scraped.prom.query(
        "count by (__name__) ("
        + ours
        + ","
        + ",".join(f'{k}="{v}"' for k, v in FLEET.items())
        + "})"
    )
    names = {row["metric"]["__name__"] for row in labelled}
    assert {
        "timing_proxy_requests_total",
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "timing_proxy_upstream_metrics_up",
    } <= names
    for label, value in FLEET.items():
        assert scraped.prom.query(f'{ours},{label}!="{value}"}}') == []
    llama = scraped.prom.query(f'{{job="{JOB}",__name__=~"llamacpp:.+"}}')
    assert llama, "llama-server runs with --metrics: its families are merged"
    assert all(not set(FLEET) & set(row["metric"]) for row in llama)


GRAFANA_VARIABLES = {"__rate_interval": "1m", "__range": "10m", "robot": ".*", "model": ".*"}
"""Values for the dashboard's Grafana variables (``kind`` and any other: ``.*``)."""


def _grafana_substituted(expr: str) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: GRAFANA_VARIABLES.get(m.group(1), ".*"), expr)


def test_every_dashboard_query_runs_on_prometheus(scraped: Scraped) -> None:
    """Every PromQL of the Grafana dashboard (its variables filled in as Grafana would) is
    accepted by the real Prometheus, and the robot variable's query lists the fleet label's
    value of the scraped proxy."""
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for expr in dashboard_queries(doc):
        scraped.prom.query(_grafana_substituted(expr))  # asserts status "success"
    (robot,) = [v for v in doc["templating"]["list"] if v["name"] == "robot"]
    series = scraped.prom.query(_grafana_substituted(grafana_query(robot)))
    assert {row["metric"].get("robot") for row in series} == {FLEET["robot"]}
