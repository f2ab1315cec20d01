"""Prometheus metrics: a record sink that fills histograms and counters, and the text page.

Uses ``prometheus_client`` (the Prometheus project's own library: exposition format, bucket
bookkeeping and label handling are its job, not ours) with a private registry. Names follow
the OpenTelemetry GenAI semantic conventions where one fits
(``gen_ai_server_time_to_first_token_seconds``, ``gen_ai_server_request_duration_seconds``,
``gen_ai_server_time_per_output_token_seconds``); the rest are ``timing_proxy_*``. Labels are
``model``, ``kind`` and ``api`` (plus ``outcome``/``status`` on the request counter, ``cause``
on the prefill lost to cache misses: the closed set :class:`proxy.core.findings.Cause`): all
bounded; models beyond :data:`MAX_MODELS` distinct names are reported as ``other``.
Buckets reach 600 s: a cold prompt on a Jetson takes minutes, OpenTelemetry's 10 s ceiling
is too low for edge boards.

Fleet labels (``[fleet] labels``, e.g. ``robot=arm-3,site=lab``) are constant labels added to
every sample of every family the proxy exports, when the page is rendered: ``observe()`` costs
the same with or without them, and a family added later carries them without a line of its
own. llama-server's ``llamacpp:*`` text appended to the page is llama-server's and is left as
it is, without them: Prometheus's target labels (``job``, ``instance``, or labels set on the
target in the scrape config) tell one robot's llama-server from another's. A llama-server in
router mode has one page per loaded model (``/metrics?model=NAME``): :func:`per_model_page`
merges them into one, each sample labelled with its ``model``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.core.findings import Cause
from proxy.core.record import Outcome, Record
from proxy.serve.logs import dropped_lines

__all__ = ["CONTENT_TYPE", "MAX_MODELS", "Metrics", "per_model_page"]

# no *_created series: they would double the page for no use here
disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_MODELS = 16

SECONDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
RATIO = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
JOULES = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)
TOKENS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
LABELS = ("model", "kind", "api")
NO_LABELS: Mapping[str, str] = MappingProxyType({})
CAUSES = frozenset(str(c) for c in Cause)
"""The ``cause`` label's values; a record naming any other (another harness's log) is not
counted under it."""


@dataclass(frozen=True, slots=True)
class _Children:
    ttft: Any
    e2e: Any
    prefill: Any
    decode: Any
    tool_call: Any
    overhead: Any
    tpot: Any
    prompt_tokens: Any
    schema_tokens: Any
    cached: Any
    prefilled: Any
    paid: Any
    saved: Any
    again: Any
    lost_tokens: Any
    acceptance: Any
    image_tokens: Any
    image_paid: Any
    energy: Any
    energy_total: Any
    upstream_cpu: Any


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

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        self.ttft = hist(
            "gen_ai_server_time_to_first_token_seconds",
            "Wall clock from the request reaching the proxy to the first event "
            "carrying content, reasoning or tool-call text (ttft_ms).",
            SECONDS,
        )
        self.e2e = hist(
            "gen_ai_server_request_duration_seconds",
            "Wall clock from the request reaching the proxy to the last byte forwarded (e2e_ms).",
            SECONDS,
        )
        self.tpot = hist(
            "gen_ai_server_time_per_output_token_seconds",
            "llama-server's decode time per token after the first (decode_ms / (predicted_n - 1)).",
            PER_TOKEN,
        )
        self.prefill = hist(
            "timing_proxy_prefill_seconds",
            "llama-server's prompt processing time (timings.prompt_ms).",
            SECONDS,
        )
        self.decode = hist(
            "timing_proxy_decode_seconds",
            "llama-server's generation time (timings.predicted_ms).",
            SECONDS,
        )
        self.overhead = hist(
            "timing_proxy_overhead_seconds",
            "ttft_ms - prefill_ms: queueing, templating, tokenisation and "
            "network, the gap between the two clocks (negative gaps count "
            "as 0).",
            SECONDS,
        )
        self.tool_call = hist(
            "timing_proxy_tool_call_seconds",
            "Wall clock from the request to the last tool call's arguments "
            "being complete (tool_call_ms).",
            SECONDS,
        )
        self.schema_tokens = hist(
            "timing_proxy_schema_tokens",
            "Prompt tokens the tool schemas add (schema_tokens).",
            TOKENS,
        )
        self.prompt_tokens = hist(
            "timing_proxy_prompt_tokens",
            "Prompt tokens per request, cached ones included (prompt_tokens).",
            TOKENS,
        )
        self.requests = Counter(
            "timing_proxy_requests",
            "Requests by kind, outcome and HTTP status.",
            (*LABELS, "outcome", "status"),
            registry=r,
        )
        self.prompt_tokens_total = Counter(
            "timing_proxy_prompt_tokens_by_cache",
            "Prompt tokens, by whether the prompt cache "
            "served them (cached=true) or they were prefilled.",
            (*LABELS, "cached"),
            registry=r,
        )
        self.schema_seconds = Counter(
            "timing_proxy_schema_prefill_seconds",
            "Prefill time of the tool schemas: paid this request, or "
            "saved by the prompt cache (estimate).",
            ("model", "state"),
            registry=r,
        )
        self.prefilled_again = Counter(
            "timing_proxy_schema_prefilled_again",
            "Requests that prefilled a schema seen before (a busted prompt cache).",
            ("model",),
            registry=r,
        )
        self.prefill_lost = Counter(
            "timing_proxy_prefill_lost_seconds",
            "Prefill paid again for prompt tokens an earlier prompt had already computed, by "
            "cause (prefill_lost_ms of the requests with a prefill_cause; estimate at the "
            "reference prefill rate).",
            ("model", "cause"),
            registry=r,
        )
        self.cache_lost_tokens = Counter(
            "timing_proxy_cache_lost_tokens",
            "Prompt tokens shared with an earlier prompt that the server did not reuse "
            "from its cache (cache_lost_tokens).",
            ("model",),
            registry=r,
        )
        self.acceptance = hist(
            "timing_proxy_draft_acceptance_ratio",
            "Speculative decoding: draft tokens accepted / drafted per request "
            "(draft_acceptance; only requests that drafted).",
            RATIO,
        )
        self.image_tokens = hist(
            "timing_proxy_image_tokens",
            "Prompt tokens the images of a request add (image_tokens).",
            TOKENS,
        )
        self.image_seconds = Counter(
            "timing_proxy_image_prefill_seconds",
            "Prefill time of the image tokens prefilled (image_prefill_ms; cached images add 0).",
            ("model",),
            registry=r,
        )
        self.energy = hist(
            "timing_proxy_request_energy_joules",
            "Board input energy over the request's wall interval (energy_mj, tegrastats).",
            JOULES,
        )
        self.energy_total = Counter(
            "timing_proxy_energy_joules",
            "Board input energy over the requests' wall intervals (overlapping requests "
            "each count the shared interval).",
            LABELS,
            registry=r,
        )
        self.upstream_cpu = Counter(
            "timing_proxy_request_upstream_cpu_seconds",
            "llama-server's CPU time during the requests (upstream_cpu_ms, /proc).",
            LABELS,
            registry=r,
        )
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
        self._cache: dict[tuple[str, str, str], _Children] = {}
        self._lost: dict[tuple[str, str], Any] = {}
        self._counted: dict[tuple[str, str, str, Outcome, int | None], Any] = {}

    def _model(self, name: str | None) -> str:
        model = name or "unknown"
        if model not in self._models:
            if len(self._models) >= MAX_MODELS:
                return "other"
            self._models.add(model)
        return model

    def _children(self, model: str, kind: str, api: str) -> _Children:
        """The label children of one (model, kind, api), looked up once: ``labels()`` costs
        microseconds per call, and a record touches a dozen series."""
        key = (model, kind, api)
        children = self._cache.get(key)
        if children is None:
            children = self._cache[key] = _Children(
                ttft=self.ttft.labels(model, kind, api),
                e2e=self.e2e.labels(model, kind, api),
                prefill=self.prefill.labels(model, kind, api),
                decode=self.decode.labels(model, kind, api),
                tool_call=self.tool_call.labels(model, kind, api),
                overhead=self.overhead.labels(model, kind, api),
                tpot=self.tpot.labels(model, kind, api),
                prompt_tokens=self.prompt_tokens.labels(model, kind, api),
                schema_tokens=self.schema_tokens.labels(model, kind, api),
                cached=self.prompt_tokens_total.labels(model, kind, api, "true"),
                prefilled=self.prompt_tokens_total.labels(model, kind, api, "false"),
                paid=self.schema_seconds.labels(model, "paid"),
                saved=self.schema_seconds.labels(model, "saved"),
                again=self.prefilled_again.labels(model),
                lost_tokens=self.cache_lost_tokens.labels(model),
                acceptance=self.acceptance.labels(model, kind, api),
                image_tokens=self.image_tokens.labels(model, kind, api),
                image_paid=self.image_seconds.labels(model),
                energy=self.energy.labels(model, kind, api),
                energy_total=self.energy_total.labels(model, kind, api),
                upstream_cpu=self.upstream_cpu.labels(model, kind, api),
            )
        return children

    def observe(self, record: Record, *_: object) -> None:
        """Record sink: count one finished request (its latencies only when it completed)."""
        model = self._model(record.model)
        kind = str(record.kind)
        api = record.api or "other"
        c = self._children(model, kind, api)
        key = (model, kind, api, record.outcome, record.status)
        counted = self._counted.get(key)
        if counted is None:  # labels() looked up once per series, as in _children
            counted = self._counted[key] = self.requests.labels(
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

    def _observe_prefix(self, record: Record, model: str, c: _Children) -> None:
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
                child = self._lost[key] = self.prefill_lost.labels(*key)
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


def _observe_latency(c: _Children, record: Record) -> None:
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


def _observe_extras(c: _Children, record: Record) -> None:
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


def per_model_page(pages: Sequence[tuple[str, bytes]]) -> bytes:
    """The exposition pages of several models (a router's ``/metrics?model=NAME``) as one
    page: each family once, its ``# HELP`` and ``# TYPE`` from the first page that has them,
    then every model's samples with a ``model`` label added."""
    families: dict[bytes, tuple[list[bytes], list[bytes]]] = {}
    for model, page in pages:
        label = b'model="' + _label_value(model) + b'"'
        current = b""
        for line in page.splitlines():
            parts = line.split(None, 3)
            if not parts:
                continue
            if parts[0] == b"#":
                if len(parts) >= 3 and parts[1] in (b"HELP", b"TYPE"):
                    current = parts[2]
                    header = families.setdefault(current, ([], []))[0]
                    if not any(h.split(None, 2)[1] == parts[1] for h in header):
                        header.append(line)
                continue  # other comments are the page's own, not the samples'
            families.setdefault(current, ([], []))[1].append(_labelled(line, label))
    out = [line for header, samples in families.values() for line in (*header, *samples)]
    return b"\n".join(out) + b"\n" if out else b""


def _label_value(value: str) -> bytes:
    """``value`` escaped as the exposition format's label values are."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return escaped.encode()


def _labelled(sample: bytes, label: bytes) -> bytes:
    """One sample line with ``label`` (``name="value"``) first among its labels."""
    end = len(sample)
    for mark in (b"{", b" ", b"\t"):
        at = sample.find(mark)
        if at != -1:
            end = min(end, at)
    name, rest = sample[:end], sample[end:]
    if rest.startswith(b"{}"):
        return name + b"{" + label + b"}" + rest[2:]
    if rest.startswith(b"{"):
        return name + b"{" + label + b"," + rest[1:]
    return name + b"{" + label + b"}" + rest
