"""Prometheus metrics: a record sink that fills histograms and counters, and the text page.

Uses ``prometheus_client`` (the Prometheus project's own library: exposition format, bucket
bookkeeping and label handling are its job, not ours) with a private registry. The families
are :mod:`proxy.serve.metric_families`. Labels are ``model``, ``kind`` and ``api`` (plus
``outcome``/``status`` on the request counter, ``cause`` on the prefill lost to cache misses:
the closed set :class:`proxy.core.findings.Cause`): all bounded; models beyond
:data:`MAX_MODELS` distinct names are reported as ``other``.

Fleet labels (``[fleet] labels``, e.g. ``robot=arm-3,site=lab``) are constant labels added to
every sample of every family the proxy exports, when the page is rendered: ``observe()`` costs
the same with or without them, and a family added later carries them without a line of its
own. llama-server's ``llamacpp:*`` text appended to the page is llama-server's and is left as
it is, without them: Prometheus's target labels (``job``, ``instance``, or labels set on the
target in the scrape config) tell one robot's llama-server from another's. A router's pages
are merged by :func:`proxy.core.exposition.per_model_page`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.core.exposition import per_model_page
from proxy.core.findings import Cause
from proxy.core.record import Outcome, Record
from proxy.serve.logs import dropped_lines
from proxy.serve.metric_families import SECONDS, Series, create_families

__all__ = ["CONTENT_TYPE", "MAX_MODELS", "SECONDS", "Metrics", "per_model_page"]

# no *_created series: they would double the page for no use here
disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_MODELS = 16
NO_LABELS: Mapping[str, str] = MappingProxyType({})
CAUSES = frozenset(str(c) for c in Cause)
"""The ``cause`` label's values; a record naming any other (another harness's log) is not
counted under it."""


BOARD_GAUGES: dict[str, tuple[str, str]] = {
    "power_w": ("timing_proxy_board_power_watts", "Board input power (tegrastats), watts."),
    "gpu_busy_pct": ("timing_proxy_board_gpu_busy_percent", "GPU load (tegrastats GR3D_FREQ)."),
    "ram_used_mb": ("timing_proxy_board_ram_used_megabytes", "RAM in use (tegrastats RAM)."),
    "temp_max_c": ("timing_proxy_board_temperature_max_celsius", "Hottest sensor (tegrastats)."),
    "upstream_cpu_s": (
        "timing_proxy_upstream_cpu_seconds",
        "CPU time of the llama-server process (/proc/PID/stat utime+stime), seconds.",
    ),
}
"""The board gauges a telemetry sampler reports (its ``gauges()`` keys), as Prometheus
families: set from the latest sample when the page is rendered."""


class Metrics:
    """The proxy's own metrics, fed one record at a time."""

    def __init__(
        self,
        labels: Mapping[str, str] = NO_LABELS,
        dropped: Callable[[], Mapping[str, int]] = dropped_lines,
    ) -> None:
        """``labels``: the fleet's constant labels (``parse_labels`` of ``[fleet] labels``),
        on every sample of the page; none by default. ``dropped``: the log lines each output
        dropped so far (the logging set-up's, by default)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.labels: dict[str, str] = dict(labels)
        self._page: Collector = _ConstantLabels(r, self.labels) if self.labels else r
        self.families = create_families(r)
        self.board = _BoardGauges()
        r.register(self.board)
        r.register(_DroppedLines(dropped))
        self.upstream_up = Gauge(
            "timing_proxy_upstream_metrics_up",
            "1 when llama-server's own /metrics were merged into this "
            "page, 0 when it did not answer (start it with --metrics).",
            registry=r,
        )
        self._models: set[str] = set()
        self._series: dict[tuple[str, str, str], Series] = {}
        self._lost: dict[tuple[str, str], Counter] = {}
        self._counted: dict[tuple[str, str, str, Outcome, int | None], Counter] = {}

    def _model(self, name: str | None) -> str:
        model = name or "unknown"
        if model not in self._models:
            if len(self._models) >= MAX_MODELS:
                return "other"
            self._models.add(model)
        return model

    def _children(self, model: str, kind: str, api: str) -> Series:
        """The series of one (model, kind, api), looked up once."""
        key = (model, kind, api)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self.families.series(model, kind, api)
        return series

    def observe(self, record: Record, *_: object) -> None:
        """Record sink: count one finished request (its latencies only when it completed)."""
        model = self._model(record.model)
        kind = str(record.kind)
        api = record.api or "other"
        c = self._children(model, kind, api)
        key = (model, kind, api, record.outcome, record.status)
        counted = self._counted.get(key)
        if counted is None:  # labels() looked up once per series, as in _children
            counted = self._counted[key] = self.families.requests.labels(
                model, kind, api, str(record.outcome), str(record.status or 0)
            )
        counted.inc()
        if record.outcome is Outcome.COMPLETED:  # an error's few ms are no latency
            _observe_latency(c, record)
        if record.prompt_tokens is not None and record.cache_n is not None:
            c.prompt_tokens.observe(record.prompt_tokens)
            c.cached.inc(record.cache_n)
            c.prefilled.inc(record.prompt_tokens - record.cache_n)
        if record.schema_tokens is not None:
            c.schema_tokens.observe(record.schema_tokens)
        if record.schema_prefill_ms is not None:
            c.paid.inc(record.schema_prefill_ms / 1000.0)
        if record.schema_saved_ms is not None:
            c.saved.inc(record.schema_saved_ms / 1000.0)
        if record.schema_prefilled_again:
            c.again.inc()
        self._observe_prefix(record, model, c)
        _observe_extras(c, record)

    def _observe_prefix(self, record: Record, model: str, c: Series) -> None:
        """The prefix attribution's counters: tokens the cache lost, and the prefill lost
        to each cause (a request with a cause but no estimate adds 0: the series exists)."""
        if record.cache_lost_tokens is not None and record.cache_lost_tokens > 0:
            c.lost_tokens.inc(record.cache_lost_tokens)
        for cause, lost_ms in (
            (record.prefill_cause, record.prefill_lost_ms),
            (record.cache_lost_cause, record.cache_lost_ms),
        ):
            if cause not in CAUSES:
                continue
            key = (model, str(cause))
            child = self._lost.get(key)
            if child is None:
                child = self._lost[key] = self.families.prefill_lost.labels(*key)
            child.inc(max(0.0, lost_ms or 0.0) / 1000.0)

    def render(self, upstream: bytes | None, board: dict[str, float] | None = None) -> bytes:
        """The exposition text: ours, then llama-server's own metrics when it answered.
        ``board`` is the telemetry's latest gauges: a gauge it lacks (no sampler, a sampler
        that is down, a figure the board does not report) is not on the page at all, rather
        than a 0 that reads as a measurement."""
        self.upstream_up.set(1 if upstream is not None else 0)
        self.board.latest = {k: v for k, v in (board or {}).items() if k in BOARD_GAUGES}
        page = generate_latest(self._page)
        if upstream:
            page += b"# llama-server's own metrics (from its /metrics):\n" + upstream
            if not upstream.endswith(b"\n"):
                page += b"\n"
        return page


def _observe_latency(c: Series, record: Record) -> None:
    """The latency histograms of one completed request."""
    for hist, value_ms in (
        (c.ttft, record.ttft_ms),
        (c.e2e, record.e2e_ms),
        (c.prefill, record.prefill_ms),
        (c.decode, record.decode_ms),
        (c.tool_call, record.tool_call_ms),
    ):
        if value_ms is not None:
            hist.observe(value_ms / 1000.0)
    if record.overhead_ms is not None:
        c.overhead.observe(max(0.0, record.overhead_ms) / 1000.0)
    if record.decode_ms is not None and record.predicted_n and record.predicted_n > 1:
        c.tpot.observe(record.decode_ms / (record.predicted_n - 1) / 1000.0)


def _observe_extras(c: Series, record: Record) -> None:
    """Speculation, images and the board: each only where the record knows it."""
    if record.draft_acceptance is not None:
        c.acceptance.observe(record.draft_acceptance)
    if record.image_tokens is not None:
        c.image_tokens.observe(record.image_tokens)
    if record.image_prefill_ms is not None:
        c.image_paid.inc(max(0.0, record.image_prefill_ms) / 1000.0)
    if record.energy_mj is not None and record.energy_mj >= 0:
        c.energy.observe(record.energy_mj / 1000.0)
        c.energy_total.inc(record.energy_mj / 1000.0)
    if record.upstream_cpu_ms is not None and record.upstream_cpu_ms >= 0:
        c.upstream_cpu.inc(record.upstream_cpu_ms / 1000.0)


class _BoardGauges(Collector):
    """The board gauges of :data:`BOARD_GAUGES` whose value the telemetry last reported."""

    def __init__(self) -> None:
        self.latest: dict[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        for key, value in self.latest.items():
            name, doc = BOARD_GAUGES[key]
            yield GaugeMetricFamily(name, doc, value=value)

    def describe(self) -> list[Metric]:
        return []


class _DroppedLines(Collector):
    """``timing_proxy_records_dropped_total{sink}``: log lines an output could not write."""

    def __init__(self, dropped: Callable[[], Mapping[str, int]]) -> None:
        self._dropped = dropped

    def collect(self) -> Iterator[Metric]:
        dropped = self._dropped()
        if not dropped:  # the logging was not set up here (an embedding, a test): no outputs
            return
        family = CounterMetricFamily(
            "timing_proxy_records_dropped",
            "JSON log lines (request records and the proxy's events) an output could not "
            "write, after one retry: sink=file (--log-file: a full disk) or stdout (closed "
            "or broken). Said on stderr too, at most once a minute per sink.",
            labels=["sink"],
        )
        for sink, count in dropped.items():
            family.add_metric([sink], count)
        yield family

    def describe(self) -> list[Metric]:
        return []


class _ConstantLabels(Collector):
    """A registry's families with constant labels added to every sample, at collect time.

    prometheus_client has no global constant labels; adding them here rather than to every
    family's label names keeps ``observe()`` as it is and covers every family, the custom
    collectors' included. The names never collide with the page's own (``parse_labels``
    refuses those)."""

    def __init__(self, registry: CollectorRegistry, labels: Mapping[str, str]) -> None:
        self.registry = registry
        self.labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            labelled = copy.copy(family)
            labelled.samples = [
                s._replace(labels={**self.labels, **s.labels}) for s in family.samples
            ]
            yield labelled
