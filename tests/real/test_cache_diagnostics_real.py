"""Prompt-cache diagnostics with the official ``anthropic`` and ``openai`` SDKs, through the
proxy (started as a user starts it), against the real llama-server (Gemma 3 270M with the
Qwen3 template, ``-t 1``).

Turn 1, then turn 2 whose system prompt's clock moved (10:00 → 10:01) naming turn 1's id:
the SDK's own object says the system prompt changed, with the missed tokens the record's
``prefill_lost_tokens``; streamed and not. A turn 2 that only appends says nothing was
missed. Chat Completions, which has no standard, takes the Responses option through the
``openai`` SDK's ``extra_body`` and finds the answer among the completion's (or the usage
chunk's) extra fields; a turn that does not ask gets none. Run with ``-s`` to see each
answer as the SDK parsed it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import Anthropic
from openai import OpenAI

from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.llama import LlamaArtifacts, started_llama_server

pytestmark = pytest.mark.real

SYSTEM = (
    "Arm {arm}. The time is 10:00. You are the controller of a six-joint robot arm on a workbench. "
    "Answer in one short sentence. Never move a joint faster than ten degrees a second, "
    "keep the gripper closed unless told otherwise, and report the wrist angle in degrees "
    "whenever you are asked about the position of the arm or of any of its joints."
)
"""The system prompt; each test names its own arm, so that its turn 2's best match in the
proxy's history is its own turn 1 (the record compares with that one)."""
QUESTION = "Where is the gripper now?"
REQUEST_ID = "X-Timing-Proxy-Request-Id"
LLAMA_ARGS = ("-t", "1", "--swa-full", "--cache-ram", "0")
"""A full-size sliding-window cache (Gemma 3 is a sliding-window model: by default a changed
prompt is resumed only from a checkpoint near its end) and no RAM prompt cache: a changed
prompt is reused up to the change, as the diagnostics expect of a cache."""
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def proxy(
    llama_artifacts: LlamaArtifacts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """``python -m proxy serve`` in front of a llama-server of its own (:data:`LLAMA_ARGS`)."""
    folder = tmp_path_factory.mktemp("cache-diagnostics")
    with (
        started_llama_server(llama_artifacts, folder / "llama", LLAMA_ARGS) as server,
        proxy_in_front_of(server.url, folder / "proxy") as proxy,
    ):
        yield proxy


def _show(label: str, request: dict[str, Any], answer: Any, record: dict[str, Any]) -> None:
    """One line for ``-s``: what was asked, what the SDK parsed, what the record says."""
    print(
        json.dumps(
            {
                "call": label,
                "asked": request,
                "sdk": answer.model_dump() if answer is not None else None,
                "record": {
                    k: record.get(k)
                    for k in ("prefix_kind", "prefill_cause", "prefill_lost_tokens", "cache_n")
                },
            }
        )
    )


# -- anthropic ---------------------------------------------------------------------------


def _messages(system: str, more: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "model": "gemma",
        "max_tokens": 8,
        "system": system,
        "messages": [{"role": "user", "content": QUESTION}, *(more or [])],
        "extra_body": {"temperature": 0, **NO_THINKING},
    }


def _message(client: Anthropic, args: dict[str, Any], stream: bool) -> tuple[str, Any, str]:
    """(the message id, its ``diagnostics`` as the SDK parsed them, the proxy's request id)."""
    if not stream:
        raw = client.messages.with_raw_response.create(**args)
        message = raw.parse()
        return message.id, message.diagnostics, raw.headers[REQUEST_ID]
    with client.messages.with_streaming_response.create(**args, stream=True) as response:
        request_id = response.headers[REQUEST_ID]
        starts = [event.message for event in response.parse() if event.type == "message_start"]
    assert len(starts) == 1
    return starts[0].id, starts[0].diagnostics, request_id


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_anthropic_sdk_reads_system_changed(proxy: ProxyProcess, stream: bool) -> None:
    """The anthropic SDK's ``Message.diagnostics`` (``message_start``'s message when
    streamed) on a turn naming the previous one after the clock moved: ``system_changed``,
    its ``cache_missed_input_tokens`` the record's ``prefill_lost_tokens``."""
    client = Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    system = SYSTEM.format(arm=f"anthropic {stream}")
    first, _, _ = _message(client, _messages(system), stream)
    second = _messages(system.replace("10:00", "10:01"))
    second["diagnostics"] = {"previous_message_id": first}
    _, diagnostics, request_id = _message(client, second, stream)
    record = proxy.record(request_id, within=30)
    _show(
        f"anthropic {'stream' if stream else 'create'}", second["diagnostics"], diagnostics, record
    )
    assert diagnostics is not None and diagnostics.cache_miss_reason is not None
    reason = diagnostics.cache_miss_reason
    assert reason.type == "system_changed"
    assert record["prefill_cause"] == "system_prompt_changed"
    assert record["prefill_lost_tokens"] > 0
    assert reason.cache_missed_input_tokens == record["prefill_lost_tokens"]
    assert diagnostics.model_extra is not None
    assert diagnostics.model_extra["timing_proxy"]["section"] == "messages[0].content"


def test_anthropic_sdk_reads_nothing_missed(proxy: ProxyProcess) -> None:
    """A turn that appends to the one it names: ``Message.diagnostics`` is None."""
    client = Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    system = SYSTEM.format(arm="anthropic appended")
    first, _, _ = _message(client, _messages(system), False)
    more = [
        {"role": "assistant", "content": "It is closed, above the bench."},
        {"role": "user", "content": "And the wrist?"},
    ]
    second = _messages(system, more)
    second["diagnostics"] = {"previous_message_id": first}
    _, diagnostics, request_id = _message(client, second, False)
    record = proxy.record(request_id, within=30)
    _show("anthropic create, appended", second["diagnostics"], diagnostics, record)
    assert record["prefix_kind"] == "extends" and record["prefill_cause"] is None
    assert diagnostics is None


# -- openai ------------------------------------------------------------------------------


def _responses(instructions: str, more: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "model": "gemma",
        "max_output_tokens": 8,
        "temperature": 0,
        "instructions": instructions,
        "input": [{"role": "user", "content": QUESTION}, *(more or [])],
        "extra_body": NO_THINKING,
    }


def _response(client: OpenAI, args: dict[str, Any], stream: bool) -> tuple[str, Any, str]:
    """(the response id, its ``prompt_cache_diagnostics`` as the SDK parsed them, the
    proxy's request id)."""
    if not stream:
        raw = client.responses.with_raw_response.create(**args)
        response = raw.parse()
        return response.id, response.prompt_cache_diagnostics, raw.headers[REQUEST_ID]
    with client.responses.with_streaming_response.create(**args, stream=True) as streamed:
        request_id = streamed.headers[REQUEST_ID]
        done = [e.response for e in streamed.parse() if e.type == "response.completed"]
    assert len(done) == 1
    return done[0].id, done[0].prompt_cache_diagnostics, request_id


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_openai_sdk_reads_input_changed(proxy: ProxyProcess, stream: bool) -> None:
    """The openai SDK's ``Response.prompt_cache_diagnostics`` (``response.completed``'s
    response when streamed) on a turn naming the previous one after the clock moved:
    ``cache_miss`` ``input_changed``, its ``cache_missed_tokens`` the record's
    ``prefill_lost_tokens``."""
    client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    system = SYSTEM.format(arm=f"openai {stream}")
    first, _, _ = _response(client, _responses(system), stream)
    second = _responses(system.replace("10:00", "10:01"))
    second["prompt_cache_options"] = {"comparison_response_id": first}
    _, diagnostics, request_id = _response(client, second, stream)
    record = proxy.record(request_id, within=30)
    _show(
        f"openai {'stream' if stream else 'create'}",
        second["prompt_cache_options"],
        diagnostics,
        record,
    )
    assert diagnostics is not None and diagnostics.type == "cache_miss"
    assert diagnostics.reason == "input_changed"
    assert record["prefill_cause"] == "system_prompt_changed"
    assert record["prefill_lost_tokens"] > 0
    assert diagnostics.cache_missed_tokens == record["prefill_lost_tokens"]


def test_openai_sdk_reads_cache_hit(proxy: ProxyProcess) -> None:
    """A turn that appends to the one it names: ``cache_hit``."""
    client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    system = SYSTEM.format(arm="openai appended")
    first, _, _ = _response(client, _responses(system), False)
    more = [
        {"type": "message", "role": "assistant", "content": "It is closed, above the bench."},
        {"role": "user", "content": "And the wrist?"},
    ]
    second = _responses(system, more)
    second["prompt_cache_options"] = {"comparison_response_id": first}
    _, diagnostics, request_id = _response(client, second, False)
    record = proxy.record(request_id, within=30)
    _show("openai create, appended", second["prompt_cache_options"], diagnostics, record)
    assert record["prefix_kind"] == "extends" and record["prefill_cause"] is None
    assert diagnostics is not None and diagnostics.type == "cache_hit"


# -- openai, Chat Completions ------------------------------------------------------------


def _chat(system: str, more: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "model": "gemma",
        "max_tokens": 8,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": QUESTION},
            *(more or []),
        ],
        "extra_body": dict(NO_THINKING),
    }


def _completion(client: OpenAI, args: dict[str, Any], stream: bool) -> tuple[str, Any, str]:
    """(the completion's id, the ``prompt_cache_diagnostics`` the SDK kept among its extra
    fields, the proxy's request id); streamed with the usage chunk asked for."""
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**args)
        completion = raw.parse()
        extra = completion.model_extra or {}
        return completion.id, extra.get("prompt_cache_diagnostics"), raw.headers[REQUEST_ID]
    args = {**args, "stream_options": {"include_usage": True}}
    with client.chat.completions.with_streaming_response.create(**args, stream=True) as streamed:
        request_id = streamed.headers[REQUEST_ID]
        chunks = list(streamed.parse())
    found = [
        c.model_extra["prompt_cache_diagnostics"]
        for c in chunks
        if c.model_extra and "prompt_cache_diagnostics" in c.model_extra
    ]
    assert len(found) <= 1
    return chunks[0].id, found[0] if found else None, request_id


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_openai_chat_completions_reads_input_changed(proxy: ProxyProcess, stream: bool) -> None:
    """The same option in ``extra_body`` on Chat Completions: the completion (the usage
    chunk when streamed) carries ``prompt_cache_diagnostics`` in the Responses shape,
    ``input_changed`` with the record's ``prefill_lost_tokens`` as ``cache_missed_tokens``."""
    client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    system = SYSTEM.format(arm=f"chat {stream}")
    first, _, _ = _completion(client, _chat(system), stream)
    second = _chat(system.replace("10:00", "10:01"))
    option = {"comparison_response_id": first}
    second["extra_body"]["prompt_cache_options"] = option
    _, diagnostics, request_id = _completion(client, second, stream)
    record = proxy.record(request_id, within=30)
    print(
        json.dumps(
            {
                "call": f"chat {'stream' if stream else 'create'}",
                "asked": option,
                "sdk_extra": diagnostics,
                "record": {
                    k: record.get(k)
                    for k in ("prefix_kind", "prefill_cause", "prefill_lost_tokens", "cache_n")
                },
            }
        )
    )
    assert record["prefill_cause"] == "system_prompt_changed"
    assert record["prefill_lost_tokens"] > 0
    assert diagnostics is not None
    assert (diagnostics["type"], diagnostics["reason"]) == ("cache_miss", "input_changed")
    assert diagnostics["cache_missed_tokens"] == record["prefill_lost_tokens"]


def test_openai_chat_completions_without_the_option_says_nothing(proxy: ProxyProcess) -> None:
    """A Chat Completions turn after the clock moved that does not ask: no
    ``prompt_cache_diagnostics`` anywhere, streamed, though the record names the cause."""
    client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    system = SYSTEM.format(arm="chat unasked")
    _completion(client, _chat(system), True)
    _, diagnostics, request_id = _completion(client, _chat(system.replace("10:00", "10:01")), True)
    record = proxy.record(request_id, within=30)
    assert record["prefill_cause"] == "system_prompt_changed"
    assert diagnostics is None
