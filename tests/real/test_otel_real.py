"""Spans of real llama-server requests, as a real OTLP receiver stored them.

Arize Phoenix (``tests/otel_receiver.py``: its own virtualenv, ``phoenix serve`` on free
loopback ports, its database in the test's folder) takes the proxy's OTLP/HTTP export. The
proxy runs as a user starts it, with ``[otel] endpoint`` pointing at Phoenix, in front of the
real llama-server. One streamed chat and one streamed tool request go through it; then the
spans are read back through Phoenix's REST API and held against the proxy's own records
(the ``request_completed`` lines of its log): the span's name, its ``gen_ai.*`` attributes,
every ``timing_proxy.*`` field, its start (the record's ``ts``, inside the test's own wall
clock around the request) and duration (``e2e_ms``), the prefill and decode child spans where
the dashboard draws them, and the first-token and tool-call events; and that this proxy, with
the server view off, stores no SERVER span. A second proxy, with ``[otel] server_spans = true``,
takes one streamed and one non-streamed chat: its SERVER span under the request's span, and
the queue, prefill and decode under that, held against the record the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.commands.provision import LlamaServer
from proxy.core.headers import REQUEST_ID_HEADER
from proxy.core.record import Record
from proxy.core.spans import present
from proxy.serve.otel import PROVIDER, phases
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama_variants import GET_WEATHER
from tests.otel_receiver import Phoenix, phoenix_running

pytestmark = pytest.mark.real

MODEL = "gemma"
FLEET = "robot=arm-3,site=lab"
EXPORT_WITHIN = 60.0
"""The batch processor sends every 5 s (the SDK's default); Phoenix then writes the spans."""
TIME_TOLERANCE_MS = 0.01
"""Phoenix stores times in microseconds; the span's are the record's to the nanosecond."""

CHAT_BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Say hello to the robot."}],
    "max_tokens": 16,
    "temperature": 0,
    "chat_template_kwargs": {"enable_thinking": False},
}
TOOL_BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
    "tools": [GET_WEATHER],
    "max_tokens": 48,
    "temperature": 0,
    "stop": ["</tool_call>"],
    "parallel_tool_calls": False,
    "chat_template_kwargs": {"enable_thinking": False},
}


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """A running Phoenix for this module."""
    with phoenix_running(tmp_path_factory.mktemp("phoenix")) as server:
        yield server


def _proxy_exporting_to(
    llama_server: LlamaServer, folder: Path, otel: str
) -> contextlib.AbstractContextManager[ProxyProcess]:
    """The proxy in front of the real llama-server, its config's ``[otel]`` section ``otel``."""
    config = folder / "config.toml"
    config.write_text(otel, encoding="utf-8")
    return proxy_in_front_of(llama_server.url, folder, config=config)


@pytest.fixture(scope="module")
def traced_proxy(
    llama_server: LlamaServer, phoenix: Phoenix, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """The proxy in front of the real llama-server, exporting its spans to Phoenix."""
    otel = f'[otel]\nendpoint = "{phoenix.otlp_endpoint}"\n\n[fleet]\nlabels = "{FLEET}"\n'
    with _proxy_exporting_to(llama_server, tmp_path_factory.mktemp("traced-proxy"), otel) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def server_view_proxy(
    llama_server: LlamaServer, phoenix: Phoenix, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """The same, with ``[otel] server_spans = true``: llama-server's side as a SERVER span."""
    otel = f'[otel]\nendpoint = "{phoenix.otlp_endpoint}"\nserver_spans = true\n'
    folder = tmp_path_factory.mktemp("server-view-proxy")
    with _proxy_exporting_to(llama_server, folder, otel) as proxy:
        yield proxy


def _stream(
    proxy: ProxyProcess, body: dict[str, Any], *, stream: bool = True
) -> tuple[dict[str, Any], float, float]:
    """POST a Chat Completions request (streamed unless told), read to the end: its record,
    and the wall clock (epoch ms) just before the request and just after the response."""
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps({"model": MODEL, "stream": stream, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    before = time.time() * 1000
    with urllib.request.urlopen(request, timeout=120) as resp:
        resp.read()
        request_id = resp.headers[REQUEST_ID_HEADER]
    after = time.time() * 1000
    return proxy.record(request_id, within=30), before, after


def _stored(phoenix: Phoenix, request_id: str) -> dict[str, dict[str, Any]]:
    """The spans of one request as Phoenix stored them, by name (the request's under
    ``root``), once the request's span and its children have all arrived."""
    deadline = time.monotonic() + EXPORT_WITHIN
    while True:
        spans = phoenix.spans()
        roots = [s for s in spans if s["attributes"].get("timing_proxy.id") == request_id]
        if roots:
            root = roots[0]
            children = [s for s in spans if s["parent_id"] == root["context"]["span_id"]]
            if len(children) >= _expected_children(root):
                return {"root": root, **{s["name"]: s for s in children}}
        assert time.monotonic() < deadline, f"no span for {request_id} in Phoenix"
        time.sleep(0.5)


def _trace(phoenix: Phoenix, request_id: str, size: int) -> list[dict[str, Any]]:
    """Every span of the trace holding the request's span, once ``size`` of them arrived."""
    deadline = time.monotonic() + EXPORT_WITHIN
    while True:
        spans = phoenix.spans()
        traces = {
            s["context"]["trace_id"]
            for s in spans
            if s["attributes"].get("timing_proxy.id") == request_id
        }
        trace = [s for s in spans if s["context"]["trace_id"] in traces]
        if len(trace) >= size:
            return trace
        assert time.monotonic() < deadline, f"{len(trace)} spans of {request_id} in Phoenix"
        time.sleep(0.5)


def _expected_children(root: dict[str, Any]) -> int:
    record = _record_of(root)
    return sum(phase is not None for phase in phases(record))


def _record_of(span: dict[str, Any]) -> Record:
    """The record the span's ``timing_proxy.*`` attributes spell (lists as Phoenix keeps
    them)."""
    prefix = "timing_proxy."
    fields = {k[len(prefix) :]: v for k, v in span["attributes"].items() if k.startswith(prefix)}
    return Record.from_dict(fields)


def _epoch_ms(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp() * 1000


def _offset_ms(span_time: str, root: dict[str, Any]) -> float:
    """Milliseconds from the request's span start to ``span_time`` (exact: from the
    microsecond integers, not float epochs)."""
    delta = datetime.fromisoformat(span_time) - datetime.fromisoformat(root["start_time"])
    return delta / (datetime.min.resolution * 1000)


def _check_span(
    stored: dict[str, dict[str, Any]], record: dict[str, Any], before: float, after: float
) -> None:
    root = stored["root"]
    attrs = root["attributes"]
    assert root["name"] == f"chat {MODEL}"
    assert root["parent_id"] is None
    assert root["status_code"] != "ERROR"
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": MODEL,
        "gen_ai.usage.input_tokens": record["prompt_tokens"],
        "gen_ai.usage.output_tokens": record["predicted_n"],
        "gen_ai.response.finish_reasons": [record["finish_reason"]],
        "http.response.status_code": record["status"],
    }
    assert {k: attrs.get(k) for k in expected} == expected
    # the newer GenAI names: a stream's first chunk in seconds; counts only where recorded
    assert attrs["gen_ai.request.stream"] is record["stream"]
    if record["stream"]:
        first_chunk = attrs["gen_ai.response.time_to_first_chunk"]
        assert first_chunk == pytest.approx(record["ttft_ms"] / 1000)
    else:
        assert "gen_ai.response.time_to_first_chunk" not in attrs
    for name, field in (("cache_read.input", "cache_n"), ("reasoning.output", "reasoning_tokens")):
        assert attrs.get(f"gen_ai.usage.{name}_tokens") == record.get(field), name
    assert attrs.get("gen_ai.usage.image.input_tokens") == record.get("image_tokens")
    fields = {f.name for f in dataclasses.fields(Record)}
    for name, value in record.items():
        if name in fields and value is not None and not isinstance(value, dict):
            assert attrs[f"timing_proxy.{name}"] == value, name
    # the wall clock: the span starts at the record's ts, inside the test's own window
    start = _epoch_ms(root["start_time"])
    assert start == _epoch_ms(record["ts"])
    assert before - 1 <= start <= after
    assert _offset_ms(root["end_time"], root) == pytest.approx(
        record["e2e_ms"], abs=TIME_TOLERANCE_MS
    )


def _check_phases(stored: dict[str, dict[str, Any]], record: dict[str, Any]) -> None:
    """The prefill ends at the first token and lasts ``prefill_ms``; the decode follows for
    ``decode_ms``; both children of the request's span."""
    root = stored["root"]
    prefill, decode = phases(Record.from_dict(record))
    assert prefill is not None and decode is not None
    for name, (start, end) in (("prefill", prefill), ("decode", decode)):
        span = stored[name]
        assert span["parent_id"] == root["context"]["span_id"]
        assert _offset_ms(span["start_time"], root) == pytest.approx(start, abs=TIME_TOLERANCE_MS)
        assert _offset_ms(span["end_time"], root) == pytest.approx(end, abs=TIME_TOLERANCE_MS)
    assert _offset_ms(stored["decode"]["end_time"], stored["decode"]) == pytest.approx(
        record["decode_ms"], abs=2 * TIME_TOLERANCE_MS
    )


def _check_events(stored: dict[str, dict[str, Any]], record: dict[str, Any]) -> None:
    root = stored["root"]
    events = {e["name"]: e for e in root["events"]}
    if record["ttft_ms"] is None:  # a non-streamed response: no first token to see
        assert "first token" not in events
    else:
        assert _offset_ms(events["first token"]["timestamp"], root) == pytest.approx(
            record["ttft_ms"], abs=TIME_TOLERANCE_MS
        )
    if record["tool_calls"]:
        call = events["tool call complete"]
        assert _offset_ms(call["timestamp"], root) == pytest.approx(
            record["tool_call_ms"], abs=TIME_TOLERANCE_MS
        )
    else:
        assert "tool call complete" not in events


def _check_no_server_view(phoenix: Phoenix, stored: dict[str, dict[str, Any]]) -> None:
    """Without ``server_spans`` the trace is the request's span and its prefill and decode:
    no second span of the call's name (the SERVER span), no queue, nothing under a phase."""
    root = stored["root"]
    trace = _trace(phoenix, root["attributes"]["timing_proxy.id"], 3)
    assert sorted(s["name"] for s in trace) == sorted([root["name"], "decode", "prefill"])
    children = [s for s in trace if s is not root and s["parent_id"] is not None]
    assert all(s["parent_id"] == root["context"]["span_id"] for s in children)
    assert [s["span_kind"] for s in children] == ["UNKNOWN", "UNKNOWN"]


def _dump(stored: dict[str, dict[str, Any]], folder: Path) -> None:
    """Keep what Phoenix stored beside the test's files (docs/otel.md shows one)."""
    (folder / "phoenix-spans.json").write_text(json.dumps(stored, indent=2), encoding="utf-8")


def test_chat_span_as_phoenix_stored_it(
    traced_proxy: ProxyProcess, phoenix: Phoenix, tmp_path: Path
) -> None:
    """A streamed chat request's span, its children and events, as Phoenix stored them,
    agree with the proxy's record of the request, and no SERVER span is among them."""
    record, before, after = _stream(traced_proxy, CHAT_BODY)
    assert record["kind"] == "chat"
    stored = _stored(phoenix, record["id"])
    _dump(stored, tmp_path)
    _check_span(stored, record, before, after)
    _check_phases(stored, record)
    _check_events(stored, record)
    _check_no_server_view(phoenix, stored)


def test_tool_span_as_phoenix_stored_it(
    traced_proxy: ProxyProcess, phoenix: Phoenix, tmp_path: Path
) -> None:
    """A streamed tool request: the same agreement, and the tool call's event at
    ``tool_call_ms`` when the model called the tool (none when it answered in text), and no
    SERVER span."""
    record, before, after = _stream(traced_proxy, TOOL_BODY)
    assert record["kind"] == "tool"
    stored = _stored(phoenix, record["id"])
    _dump(stored, tmp_path)
    _check_span(stored, record, before, after)
    _check_phases(stored, record)
    _check_events(stored, record)
    _check_no_server_view(phoenix, stored)


def _server_tree(
    trace: list[dict[str, Any]], record: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """The request's span, its one child (the SERVER span), and that one's children by name;
    nothing else in the trace."""
    (root,) = [s for s in trace if s["attributes"].get("timing_proxy.id") == record["id"]]
    under_root = [s for s in trace if s["parent_id"] == root["context"]["span_id"]]
    assert [s["name"] for s in under_root] == [root["name"]]
    server = under_root[0]
    phases_ = {s["name"]: s for s in trace if s["parent_id"] == server["context"]["span_id"]}
    assert len(trace) == 2 + len(phases_)
    return root, server, phases_


def _check_server_span(
    root: dict[str, Any], server: dict[str, Any], record: dict[str, Any]
) -> None:
    """The SERVER span: named as the request's, in its trace, from its start to the decode's
    end; llama-server's ``gen_ai.*``, ``server.*`` and ``http.*`` attributes and the phases
    as ``gen_ai.latency.*`` seconds, no token usage and no record fields."""
    prefill, decode = phases(Record.from_dict(record))
    assert prefill is not None and decode is not None
    assert server["name"] == f"chat {MODEL}"
    assert server["context"]["trace_id"] == root["context"]["trace_id"]
    # Phoenix keeps no OTLP span kind: both are its LLM kind, read from gen_ai.operation.name
    assert (root["span_kind"], server["span_kind"]) == ("LLM", "LLM")
    assert server["status_code"] != "ERROR"
    assert server["start_time"] == root["start_time"]
    assert _offset_ms(server["end_time"], root) == pytest.approx(decode[1], abs=TIME_TOLERANCE_MS)
    attrs = root["attributes"]
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": MODEL,
        "gen_ai.response.model": attrs["gen_ai.response.model"],
        "server.address": attrs["server.address"],
        "server.port": attrs["server.port"],
        "http.request.method": record["method"],
        "url.path": record["path"],
        "http.response.status_code": record["status"],
    }
    latency = {
        "gen_ai.latency.time_in_queue": prefill[0] / 1000,
        "gen_ai.latency.time_in_model_prefill": record["prefill_ms"] / 1000,
        "gen_ai.latency.time_in_model_decode": record["decode_ms"] / 1000,
        "gen_ai.latency.time_in_model_inference": (record["prefill_ms"] + record["decode_ms"])
        / 1000,
        "gen_ai.latency.e2e": record["e2e_ms"] / 1000,
    }
    if record["ttft_ms"] is not None:  # a stream's; a non-streamed response has none
        latency["gen_ai.latency.time_to_first_token"] = record["ttft_ms"] / 1000
    got = server["attributes"]
    named = {k: v for k, v in got.items() if k.startswith(("gen_ai.", "server.", "http.", "url."))}
    assert {k: v for k, v in named.items() if k not in latency} == expected
    assert {k: v for k, v in named.items() if k in latency} == pytest.approx(latency)
    # the usage stays on the request's span, so Phoenix's token counts are not doubled
    assert not [k for k in got if k.startswith(("llm.token_count.", "timing_proxy."))]
    assert attrs["llm.token_count.prompt"] == record["prompt_tokens"]


def _check_server_phases(
    root: dict[str, Any], phases_: dict[str, dict[str, Any]], record: dict[str, Any]
) -> None:
    """queue from the arrival to the prefill's start (with ``overhead_ms``), then the prefill
    for ``prefill_ms`` and the decode for ``decode_ms``, where the dashboard draws them."""
    prefill, decode = phases(Record.from_dict(record))
    assert prefill is not None and decode is not None
    queue = {"queue": (0.0, prefill[0])} if prefill[0] > 0 else {}  # absent at 0: the code's rule
    places = {**queue, "prefill": prefill, "decode": decode}
    lengths = {"prefill": record["prefill_ms"], "decode": record["decode_ms"]}
    assert sorted(phases_) == sorted(places)
    for name, (start, end) in places.items():
        span = phases_[name]
        assert span["span_kind"] == "UNKNOWN"
        assert _offset_ms(span["start_time"], root) == pytest.approx(start, abs=TIME_TOLERANCE_MS)
        assert _offset_ms(span["end_time"], root) == pytest.approx(end, abs=TIME_TOLERANCE_MS)
        if name in lengths:
            assert _offset_ms(span["end_time"], span) == pytest.approx(
                lengths[name], abs=2 * TIME_TOLERANCE_MS
            )
    if queue:  # overhead_ms (ttft_ms - prefill_ms) is a stream's only
        overhead = {"timing_proxy.overhead_ms": record["overhead_ms"]}
        assert phases_["queue"]["attributes"] == present(overhead)
    assert phases_["prefill"]["attributes"]["timing_proxy.prefill_ms"] == record["prefill_ms"]
    assert phases_["decode"]["attributes"]["timing_proxy.decode_ms"] == record["decode_ms"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non-streamed"])
def test_server_view_as_phoenix_stored_it(
    server_view_proxy: ProxyProcess, phoenix: Phoenix, tmp_path: Path, stream: bool
) -> None:
    """With ``server_spans`` on, a chat request's span holds one SERVER span with queue,
    prefill and decode under it, as Phoenix stored them, agreeing with the record."""
    record, before, after = _stream(server_view_proxy, CHAT_BODY, stream=stream)
    assert record["stream"] is stream
    prefill, _ = phases(Record.from_dict(record))
    trace = _trace(phoenix, record["id"], 4 + (prefill is not None and prefill[0] > 0))
    _dump({s["context"]["span_id"]: s for s in trace}, tmp_path)
    root, server, phases_ = _server_tree(trace, record)
    _check_span({"root": root}, record, before, after)
    _check_events({"root": root}, record)
    _check_server_span(root, server, record)
    _check_server_phases(root, phases_, record)
