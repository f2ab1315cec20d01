"""The proxy in front of a real llama-server in router mode (``--models-dir``).

One GGUF (the provisioned Gemma 3 270M) under two names, ``a.gguf`` and ``b.gguf``
(symlinks), ``--models-max 1``: the router loads one at a time and routes by the body's
``model``. ``a`` serves the Qwen3 template, ``b`` the same template with one more sentence in
its tools header (a preset per model), so the two count the same tools differently and a
look-up answered by the wrong model shows. Through the proxy: a tool request to ``a``, then
one to ``b`` (the router unloads ``a`` for it), then the same request to ``b`` again, and
last the first one to ``a`` again (the router reloads it). The look-ups must each name their
model: every count is the model's own (against the counting endpoint asked directly with
``model``), ``b``'s first request is not "prefilled again" for a schema only ``a`` had seen,
no look-up fails, and ``a``'s reload is the cause of its repeat's prefill.

A router of its own (``a`` alone, two slots) takes AIPerf's benchmark traffic: a cause is
named exactly where llama-server's ``cache_n`` shows a loss, and nowhere else.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.commands.provision import LlamaServer, LlamaServerError
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama import START_TIMEOUT, LlamaArtifacts
from tests.llama_variants import GET_WEATHER, post_json
from tests.real.cache_truth import (
    SHARED_PROMPT_BURST,
    aiperf_records,
    causes_where_cache_n_lost,
    shown,
)

pytestmark = pytest.mark.real

RECORD_WAIT_S = 180.0
"""A record waits for its look-ups, which wait for the router to load the model."""
QWEN3_TOOLS_LINE = "You may call one or more functions to assist with the user query."
B_TOOLS_LINE = QWEN3_TOOLS_LINE + " Call them only when the answer needs them."
MODEL_SIZE_BYTES = 246_587_904
"""The provisioned GGUF's size as llama-server's ``/v1/models`` ``meta.size`` gives it."""

TOOL_REQUEST: dict[str, Any] = {
    "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
    "tools": [GET_WEATHER],
    "temperature": 0,
    "max_tokens": 48,
    "stop": ["</tool_call>"],
    "parallel_tool_calls": False,
    "chat_template_kwargs": {"enable_thinking": False},
}


class Router(LlamaServer):
    """llama-server in router mode over ``models_dir``, one model loaded at a time, the
    per-model options from ``presets``."""

    def __init__(
        self, binary: Path, models_dir: Path, presets: Path, log_dir: Path, slots: int = 1
    ) -> None:
        super().__init__(binary, models_dir, alias="", log_dir=log_dir)
        self.presets = presets
        self.slots = slots

    def command(self) -> list[str]:
        """The router's argv: no ``-m``; ``-t 1``, the context and the slots reach every
        model."""
        return [
            str(self.binary),
            *("--models-dir", str(self.model), "--models-preset", str(self.presets)),
            *("--models-max", "1", "-t", "1", "-c", str(self.ctx), "-np", str(self.slots)),
            *("--metrics", "--host", self.host, "--port", str(self.port)),
        ]


@dataclass
class Run:
    """What the scenario saw: the records of its three requests, what the router itself
    counts, and the proxy's pages afterwards."""

    a: dict[str, Any]
    b: dict[str, Any]
    b_again: dict[str, Any]
    a_again: dict[str, Any]
    """The same request to ``a`` once more, after the pages were read: the router unloads
    ``b`` and loads ``a`` again."""
    answers: dict[str, Any]
    """Each record's id → the answer the client received."""
    schema_tokens: dict[str, int]
    """Per model: its counting endpoint with the tools minus without, asked directly."""
    args_tokens: dict[str, int]
    """Per record id: ``/tokenize`` (with the model) of the arguments the client received."""
    stats: dict[str, Any]
    metrics: str


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:
        body: bytes = resp.read()
    return body


def _count(url: str, body: dict[str, Any]) -> int:
    answer, _ = post_json(url + "/v1/chat/completions/input_tokens", body)
    return int(answer["input_tokens"])


def _calls(answer: dict[str, Any]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = answer["choices"][0]["message"].get("tool_calls") or []
    return calls


def _ask(proxy: ProxyProcess, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tool request to ``model`` through the proxy: its record (once written) and the
    answer."""
    answer, request_id = post_json(
        proxy.url + "/v1/chat/completions", {"model": model, **TOOL_REQUEST}
    )
    assert request_id is not None
    return proxy.record(request_id, within=RECORD_WAIT_S), answer


@pytest.fixture(scope="module")
def router(
    llama_artifacts: LlamaArtifacts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    """The router over ``a`` and ``b``: the same GGUF, ``b`` with its own template."""
    folder = tmp_path_factory.mktemp("router")
    qwen3 = llama_artifacts.template.read_text()
    assert QWEN3_TOOLS_LINE in qwen3
    b_template = folder / "b.jinja"
    b_template.write_text(qwen3.replace(QWEN3_TOOLS_LINE, B_TOOLS_LINE))
    templates = {"a": llama_artifacts.template, "b": b_template}
    yield from _serving(_router(llama_artifacts, folder, templates))


def _router(
    artifacts: LlamaArtifacts, folder: Path, templates: dict[str, Path], slots: int = 1
) -> Router:
    """A router in ``folder`` over the provisioned GGUF under each name of ``templates``,
    each name served with its template."""
    models = folder / "models"
    models.mkdir()
    presets = ["version = 1"]
    for name, template in templates.items():
        (models / f"{name}.gguf").symlink_to(artifacts.model)
        presets += [f"[{name}]", f"chat-template-file = {template}"]
    (folder / "presets.ini").write_text("\n".join(presets) + "\n")
    return Router(artifacts.binary, models, folder / "presets.ini", folder, slots=slots)


def _serving(server: Router) -> Iterator[Router]:
    """``server`` started (a failure to start fails the test in one line), then stopped."""
    try:
        server.start(timeout=START_TIMEOUT)
    except LlamaServerError as exc:
        failure = str(exc)
    else:
        failure = ""
    if failure:  # outside the except: no chained traceback in the report
        pytest.fail(failure, pytrace=False)
    try:
        yield server
    finally:
        server.stop(timeout=30)


@pytest.fixture(scope="module")
def benchmarked(
    llama_artifacts: LlamaArtifacts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    """A router of its own over ``a`` alone (the Qwen3 template), with two slots: the server
    AIPerf runs against."""
    folder = tmp_path_factory.mktemp("router-aiperf")
    yield from _serving(_router(llama_artifacts, folder, {"a": llama_artifacts.template}, 2))


@pytest.fixture(scope="module")
def run(router: Router, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The three requests through a fresh proxy, each record awaited before the next
    request; the proxy's pages while ``b`` is loaded; then the router's own counts."""
    folder = tmp_path_factory.mktemp("router-proxy")
    config = folder / "config.toml"
    config.write_text("[accounting]\nlookup_timeout_s = 60\n")
    with proxy_in_front_of(router.url, folder, config) as proxy:
        a, a_answer = _ask(proxy, "a")
        b, b_answer = _ask(proxy, "b")
        b_again, b_again_answer = _ask(proxy, "b")
        stats = json.loads(_get(proxy.admin_url + "/stats"))
        metrics = _get(proxy.metrics_url).decode()
        a_again, _ = _ask(proxy, "a")
    answers = {a["id"]: a_answer, b["id"]: b_answer, b_again["id"]: b_again_answer}
    schema_tokens = {}
    for model in ("a", "b"):
        body = {"model": model, **TOOL_REQUEST}
        bare = {k: v for k, v in body.items() if k not in ("tools", "parallel_tool_calls")}
        schema_tokens[model] = _count(router.url, body) - _count(router.url, bare)
    args_tokens = {}
    for record in (a, b, b_again):
        args = [c["function"]["arguments"] for c in _calls(answers[record["id"]])]
        args_tokens[record["id"]] = sum(
            len(
                post_json(
                    router.url + "/tokenize",
                    {"content": text, "add_special": False, "model": record["model"]},
                )[0]["tokens"]
            )
            for text in args
        )
    yield Run(a, b, b_again, a_again, answers, schema_tokens, args_tokens, stats, metrics)


def test_schema_counts_are_each_models_own(run: Run) -> None:
    """Each record's schema_tokens is its own model's count (the counting endpoint asked
    with ``model``, tools minus none), and the two models count the same tools differently."""
    assert run.schema_tokens["a"] != run.schema_tokens["b"]
    for record in (run.a, run.b, run.b_again):
        assert record["schema_tokens"] == run.schema_tokens[record["model"]], record["model"]
        assert record["schema_tokens_source"] == "server"
    assert [r["model"] for r in (run.a, run.b, run.b_again)] == ["a", "b", "b"]


def test_the_second_models_first_request_is_not_prefilled_again(run: Run) -> None:
    """``b`` never saw the schema before its first request: paid, not "prefilled again";
    its repeat finds the schema in ``b``'s cache."""
    assert run.a["schema_prefilled_again"] is False
    assert (run.b["schema_cached"], run.b["schema_prefilled_again"]) == (False, False)
    assert run.b["schema_prefill_ms"] is not None and run.b["schema_prefill_ms"] > 0
    assert (run.b_again["schema_cached"], run.b_again["schema_prefill_ms"]) == (True, 0.0)
    assert run.b_again["schema_prefilled_again"] is False


def test_a_model_the_router_reloaded_is_named_as_such(run: Run) -> None:
    """``a``'s request once more, after ``b``'s: the router unloaded ``a`` to load ``b``
    and loads it again with an empty cache, so nothing of the same prompt is reused. The
    cause is the reload (``model_reloaded``), not a sliding window nor an eviction, and the
    schema ``a`` held is prefilled again."""
    again = run.a_again
    assert (again["model"], again["prefix_kind"], again["cache_n"]) == ("a", "retry", 0)
    assert again["prefill_cause"] == "model_reloaded"
    assert again["prefill_lost_ms"] is not None and again["prefill_lost_ms"] > 0
    assert again["schema_prefilled_again"] is True


def test_every_lookup_is_answered(run: Run) -> None:
    """No look-up failed: tool_args_tokens is ``/tokenize`` (with the model) of the
    arguments the client received, and the prefix fields are set."""
    for record in (run.a, run.b, run.b_again):
        assert record["accounting_error"] is None, record["accounting_error"]
        assert record["attribution_error"] is None, record["attribution_error"]
        assert _calls(run.answers[record["id"]]), "temperature 0: the model calls the tool"
        assert record["tool_args_tokens"] == run.args_tokens[record["id"]] > 0
        assert record["tool_args_tokens_source"] == "server"
        assert record["prefix_kind"] is not None
        assert record["reusable_tokens"] is not None
        assert record["schema_cached"] is not None


def test_stats_keep_each_models_schema(run: Run) -> None:
    """``/stats`` ``schemas`` holds one entry per model (``model/hash``), each with its own
    model's tokens, calls and per-tool count; the template of each model is read."""
    h = run.a["schema_hash"]
    assert run.b["schema_hash"] == h
    entries = run.stats["schemas"]["by_hash"]
    assert set(entries) == {f"a/{h}", f"b/{h}"}
    for model, calls in (("a", 1), ("b", 2)):
        entry = entries[f"{model}/{h}"]
        assert (entry["model"], entry["hash"], entry["calls"]) == (model, h, calls)
        assert entry["tokens"] == run.schema_tokens[model]
        assert entry["prefilled_again"] == 0
        assert entry["per_tool_tokens"] == {"get_weather": run.schema_tokens[model]}
    assert run.stats["schemas"]["prefilled_again"] == 0
    by_model = run.stats["template"]["by_model"]
    assert by_model == {m: {"supports_tools": True, "supports_tool_calls": True} for m in "ab"}


def test_metrics_and_roofline_per_model(run: Run) -> None:
    """The admin ``/metrics`` carries the loaded model's llama-server metrics labelled with
    it, and ``b``'s repeat gets the roofline of ``b``'s own ``/v1/models`` entry."""
    families = {f.name: f for f in text_string_to_metric_families(run.metrics)}
    up = families["timing_proxy_upstream_metrics_up"].samples
    assert [s.value for s in up] == [1.0]
    prompt = families["llamacpp:prompt_tokens"].samples
    assert [s.labels for s in prompt] == [{"model": "b"}]
    rate = run.b_again["decode_tok_s"]
    assert rate is not None
    assert run.b_again["decode_gbs"] == pytest.approx(MODEL_SIZE_BYTES * rate / 1e9, abs=1e-3)


def test_aiperf_through_a_router_names_a_cause_exactly_where_cache_n_shows_a_loss(
    benchmarked: Router, llama_artifacts: LlamaArtifacts, tmp_path: Path
) -> None:
    """AIPerf's prompts behind a shared system prompt, four at a time, naming model ``a`` of a
    router with two slots (its look-ups must name the model too): a record names a cause
    exactly where ``cache_n`` kept at least ``LOST_MIN_TOKENS`` less than the reusable
    prompt, with that loss, and says nothing elsewhere; the sliding window Gemma 3 keeps
    here costs each prompt a few tokens, under that bound. The first burst finds the prefix
    on one slot only: ``slot_busy`` once at least."""
    records = aiperf_records(
        benchmarked.url, "a", llama_artifacts.model, tmp_path, SHARED_PROMPT_BURST
    )
    causes = frozenset({"slot_busy", "slot_evicted", "sliding_window"})
    lost = causes_where_cache_n_lost(records, causes)
    assert "slot_busy" in {r["prefill_cause"] for r in lost}, shown(records)
    assert not any(r.get("accounting_error") or r.get("attribution_error") for r in records)
