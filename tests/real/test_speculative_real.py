"""Speculative decoding against the real llama-server: the draft counts in the record.

One llama-server of this module's own drafts with the same Gemma 3 270M as its draft model
(``-md``, ``--spec-type draft-simple``: ``-md`` alone leaves speculation off), a proxy in
front. The expected numbers are llama-server's own: the test reads ``timings.draft_n`` and
``timings.draft_n_accepted`` from the body the agent received (non-streamed) or from the
last event carrying ``timings`` (streamed), and the record must hold exactly those.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.commands.provision import LlamaServer
from proxy.core.headers import REQUEST_ID_HEADER
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama import LlamaArtifacts, started_llama_server
from tests.llama_variants import post_json
from tests.terminal import terminal_log

pytestmark = pytest.mark.real

RECORD_WAIT_S = 60.0
CHAT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Count from 1 to 30, separated by commas."}],
    "temperature": 0,
    "max_tokens": 24,
    "chat_template_kwargs": {"enable_thinking": False},
}
"""A prompt whose answer the draft (the same model) predicts: drafts happen and are
accepted."""


@pytest.fixture(scope="module")
def drafting(
    llama_artifacts: LlamaArtifacts,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[tuple[LlamaServer, ProxyProcess]]:
    """A llama-server drafting with its own model (8 tokens a draft), and a proxy in front."""
    model = str(llama_artifacts.model)
    args = ("-md", model, "--spec-type", "draft-simple", "--spec-draft-n-max", "8")
    folder = tmp_path_factory.mktemp("speculative")
    (folder / "llama").mkdir()
    with (
        started_llama_server(
            llama_artifacts,
            folder / "llama",
            extra_args=args,
            log=terminal_log(request.config, "llama-server"),
        ) as server,
        proxy_in_front_of(server.url, folder / "proxy") as proxy,
    ):
        yield server, proxy


def _streamed(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """POST a streamed request; the last ``timings`` object of the stream and the request id."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    timings: dict[str, Any] = {}
    with urllib.request.urlopen(request, timeout=300) as response:
        request_id = response.headers[REQUEST_ID_HEADER]
        for line in response.read().decode().splitlines():
            if line.startswith("data: {"):
                event = json.loads(line[len("data: ") :])
                timings = event.get("timings", timings)
    return timings, request_id


def test_non_streamed_record_has_the_servers_draft_counts(
    drafting: tuple[LlamaServer, ProxyProcess],
) -> None:
    """A non-streamed answer's timings.draft_n / draft_n_accepted are the record's, and
    draft_acceptance is their ratio."""
    _, proxy = drafting
    answer, request_id = post_json(proxy.url + "/v1/chat/completions", CHAT)
    assert request_id is not None
    timings = answer["timings"]
    assert timings["draft_n"] > 0, "the server did not draft: speculation is off"
    record = proxy.record(request_id, within=RECORD_WAIT_S)
    assert record["draft_n"] == timings["draft_n"]
    assert record["draft_n_accepted"] == timings["draft_n_accepted"]
    assert record["draft_acceptance"] == pytest.approx(
        timings["draft_n_accepted"] / timings["draft_n"], abs=1e-6
    )


def test_streamed_record_and_stats_show_speculation(
    drafting: tuple[LlamaServer, ProxyProcess],
) -> None:
    """A streamed answer's last timings carry the draft counts: the record holds them,
    /stats counts the request as drafted with its acceptance, and /metrics has the
    acceptance histogram observed."""
    _, proxy = drafting
    timings, request_id = _streamed(proxy.url + "/v1/chat/completions", {**CHAT, "stream": True})
    assert timings.get("draft_n", 0) > 0
    record = proxy.record(request_id, within=RECORD_WAIT_S)
    assert (record["draft_n"], record["draft_n_accepted"]) == (
        timings["draft_n"],
        timings["draft_n_accepted"],
    )
    with urllib.request.urlopen(proxy.admin_url + "/stats", timeout=10) as response:
        chat = json.loads(response.read())["kinds"]["chat"]
    drafted = [r for r in proxy.records().values() if r.get("draft_n") is not None]
    assert chat["speculation"]["drafted"] == len(drafted)
    assert chat["draft_acceptance"]["p50"] is not None
    assert chat["speculation"]["decode_tok_s_p50_with"] is not None
    with urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10) as response:
        page = response.read().decode()
    counts = [
        line
        for line in page.splitlines()
        if line.startswith("timing_proxy_draft_acceptance_ratio_count{")
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in counts) == len(drafted)


def test_a_server_without_a_draft_model_gives_no_draft_fields(
    proxy_process: ProxyProcess,
) -> None:
    """The session's server has no draft model: its timings carry no draft_n, and the
    record's draft fields are null, not 0."""
    answer, request_id = post_json(proxy_process.url + "/v1/chat/completions", CHAT)
    assert "draft_n" not in answer["timings"]
    assert request_id is not None
    record = proxy_process.record(request_id, within=RECORD_WAIT_S)
    assert (record["draft_n"], record["draft_n_accepted"], record["draft_acceptance"]) == (
        None,
        None,
        None,
    )
