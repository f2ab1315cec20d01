"""The proxy's Prometheus families: names, help, labels and buckets, and each record's series.

Names follow the OpenTelemetry GenAI semantic conventions where one fits
(``gen_ai_server_time_to_first_token_seconds``, ``gen_ai_server_request_duration_seconds``,
``gen_ai_server_time_per_output_token_seconds``); the rest are ``timing_proxy_*``. Buckets
reach 600 s: a cold prompt on a Jetson takes minutes, OpenTelemetry's 10 s ceiling is too
low for edge boards.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["LABELS", "SECONDS", "Families", "Series", "create_families"]

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


@dataclass(frozen=True, slots=True)
class Series:
    """The label children one (model, kind, api) touches, looked up once: ``labels()``
    costs microseconds per call, and a record touches a dozen series."""

    ttft: Histogram
    e2e: Histogram
    prefill: Histogram
    decode: Histogram
    tool_call: Histogram
    overhead: Histogram
    tpot: Histogram
    prompt_tokens: Histogram
    schema_tokens: Histogram
    cached: Counter
    prefilled: Counter
    paid: Counter
    saved: Counter
    again: Counter
    lost_tokens: Counter
    acceptance: Histogram
    image_tokens: Histogram
    image_paid: Counter
    energy: Histogram
    energy_total: Counter
    upstream_cpu: Counter


@dataclass(frozen=True, slots=True)
class Families:
    """The families the proxy fills from its records."""

    ttft: Histogram
    e2e: Histogram
    tpot: Histogram
    prefill: Histogram
    decode: Histogram
    overhead: Histogram
    tool_call: Histogram
    schema_tokens: Histogram
    prompt_tokens: Histogram
    requests: Counter
    prompt_tokens_total: Counter
    schema_seconds: Counter
    prefilled_again: Counter
    prefill_lost: Counter
    cache_lost_tokens: Counter
    acceptance: Histogram
    image_tokens: Histogram
    image_seconds: Counter
    energy: Histogram
    energy_total: Counter
    upstream_cpu: Counter

    def series(self, model: str, kind: str, api: str) -> Series:
        """The label children of one (model, kind, api)."""
        return Series(
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


def create_families(registry: CollectorRegistry) -> Families:
    """Every family of :class:`Families`, registered in ``registry`` in this order (the
    page's)."""

    def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, LABELS, buckets=buckets, registry=registry)

    return Families(
        ttft=hist(
            "gen_ai_server_time_to_first_token_seconds",
            "Wall clock from the request reaching the proxy to the first event "
            "carrying content, reasoning or tool-call text (ttft_ms).",
            SECONDS,
        ),
        e2e=hist(
            "gen_ai_server_request_duration_seconds",
            "Wall clock from the request reaching the proxy to the last byte forwarded (e2e_ms).",
            SECONDS,
        ),
        tpot=hist(
            "gen_ai_server_time_per_output_token_seconds",
            "llama-server's decode time per token after the first (decode_ms / (predicted_n - 1)).",
            PER_TOKEN,
        ),
        prefill=hist(
            "timing_proxy_prefill_seconds",
            "llama-server's prompt processing time (timings.prompt_ms).",
            SECONDS,
        ),
        decode=hist(
            "timing_proxy_decode_seconds",
            "llama-server's generation time (timings.predicted_ms).",
            SECONDS,
        ),
        overhead=hist(
            "timing_proxy_overhead_seconds",
            "ttft_ms - prefill_ms: queueing, templating, tokenisation and "
            "network, the gap between the two clocks (negative gaps count "
            "as 0).",
            SECONDS,
        ),
        tool_call=hist(
            "timing_proxy_tool_call_seconds",
            "Wall clock from the request to the last tool call's arguments "
            "being complete (tool_call_ms).",
            SECONDS,
        ),
        schema_tokens=hist(
            "timing_proxy_schema_tokens",
            "Prompt tokens the tool schemas add (schema_tokens).",
            TOKENS,
        ),
        prompt_tokens=hist(
            "timing_proxy_prompt_tokens",
            "Prompt tokens per request, cached ones included (prompt_tokens).",
            TOKENS,
        ),
        requests=Counter(
            "timing_proxy_requests",
            "Requests by kind, outcome and HTTP status.",
            (*LABELS, "outcome", "status"),
            registry=registry,
        ),
        prompt_tokens_total=Counter(
            "timing_proxy_prompt_tokens_by_cache",
            "Prompt tokens, by whether the prompt cache "
            "served them (cached=true) or they were prefilled.",
            (*LABELS, "cached"),
            registry=registry,
        ),
        schema_seconds=Counter(
            "timing_proxy_schema_prefill_seconds",
            "Prefill time of the tool schemas: paid this request, or "
            "saved by the prompt cache (estimate).",
            ("model", "state"),
            registry=registry,
        ),
        prefilled_again=Counter(
            "timing_proxy_schema_prefilled_again",
            "Requests that prefilled a schema seen before (a busted prompt cache).",
            ("model",),
            registry=registry,
        ),
        prefill_lost=Counter(
            "timing_proxy_prefill_lost_seconds",
            "Prefill paid again for prompt tokens an earlier prompt had already computed, by "
            "cause (prefill_lost_ms of the requests with a prefill_cause; estimate at the "
            "reference prefill rate).",
            ("model", "cause"),
            registry=registry,
        ),
        cache_lost_tokens=Counter(
            "timing_proxy_cache_lost_tokens",
            "Prompt tokens shared with an earlier prompt that the server did not reuse "
            "from its cache (cache_lost_tokens).",
            ("model",),
            registry=registry,
        ),
        acceptance=hist(
            "timing_proxy_draft_acceptance_ratio",
            "Speculative decoding: draft tokens accepted / drafted per request "
            "(draft_acceptance; only requests that drafted).",
            RATIO,
        ),
        image_tokens=hist(
            "timing_proxy_image_tokens",
            "Prompt tokens the images of a request add (image_tokens).",
            TOKENS,
        ),
        image_seconds=Counter(
            "timing_proxy_image_prefill_seconds",
            "Prefill time of the image tokens prefilled (image_prefill_ms; cached images add 0).",
            ("model",),
            registry=registry,
        ),
        energy=hist(
            "timing_proxy_request_energy_joules",
            "Board input energy over the request's wall interval (energy_mj, tegrastats).",
            JOULES,
        ),
        energy_total=Counter(
            "timing_proxy_energy_joules",
            "Board input energy over the requests' wall intervals (overlapping requests "
            "each count the shared interval).",
            LABELS,
            registry=registry,
        ),
        upstream_cpu=Counter(
            "timing_proxy_request_upstream_cpu_seconds",
            "llama-server's CPU time during the requests (upstream_cpu_ms, /proc).",
            LABELS,
            registry=registry,
        ),
    )
