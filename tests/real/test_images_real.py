"""Image-token accounting against the real llama-server with a projector file of its own.

The projector (``--mmproj``) is generated here (:mod:`tests.images_fixture`: random weights,
Gemma 3's projector type, 256 tokens per image), so the model sees real image chunks in its
prompt and the prompt cache treats them as it treats any image; what the model then writes
is noise, and only the prompt matters. Every expected count is computed here, independently
of the proxy, from the API's own counting endpoint on the test's own bodies (with the image,
and without it). A nonce at the start of each question keeps the tests' prompts apart (one
slot: a prompt that starts differently shares only BOS with the one before).
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.commands.provision import LlamaServer
from tests.conftest import ProxyProcess, proxy_in_front_of
from tests.images_fixture import data_url, solid_png, write_gemma3_projector
from tests.llama import LlamaArtifacts, started_llama_server
from tests.llama_variants import post_json
from tests.terminal import terminal_log

pytestmark = pytest.mark.real

RED = solid_png((220, 30, 30))
BLUE = solid_png((30, 30, 220))
ASK: dict[str, Any] = {
    "temperature": 0,
    "chat_template_kwargs": {"enable_thinking": False},
}
RECORD_WAIT_S = 90.0
"""The record is written after the image look-ups (several counts with the image decoded)."""
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def vision_server(
    llama_artifacts: LlamaArtifacts,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[LlamaServer]:
    """llama-server with Gemma 3 270M and the generated projector."""
    folder = tmp_path_factory.mktemp("vision")
    projector = write_gemma3_projector(folder / "mmproj-test.gguf")
    with started_llama_server(
        llama_artifacts,
        folder,
        extra_args=["--mmproj", str(projector)],
        log=terminal_log(request.config, "llama-server"),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def vision_proxy(
    vision_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """The proxy in front of the vision server."""
    with proxy_in_front_of(vision_server.url, tmp_path_factory.mktemp("vision-proxy")) as proxy:
        yield proxy


def _question() -> str:
    return f"[{uuid.uuid4().hex[:8]}] What is in this picture?"


def _chat(question: str, *images: bytes, **extra: Any) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": question}]
    content += [{"type": "image_url", "image_url": {"url": data_url(png)}} for png in images]
    return {**ASK, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}


def _count(upstream: str, path: str, body: dict[str, Any]) -> int:
    answer, _ = post_json(upstream + path, {k: v for k, v in body.items() if k != "stream"})
    return int(answer["input_tokens"])


def _ask(proxy: ProxyProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Send ``body`` through the proxy (reading a stream to its end); the request's record."""
    request = urllib.request.Request(
        proxy.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        request_id = response.headers["X-Timing-Proxy-Request-Id"]
        response.read()
    return proxy.record(request_id, within=RECORD_WAIT_S)


def test_image_tokens_equal_the_counting_endpoints_difference(
    vision_server: LlamaServer, vision_proxy: ProxyProcess
) -> None:
    """A Chat Completions request with one image: ``image_tokens`` is the chat counting
    endpoint's count of the body less that of the same body without the image, as the test
    computes it; ``images`` is 1, ``image_tokens_each`` that one count; a cold image is
    prefilled (none cached, a positive cost) and no reason is given."""
    question = _question()
    body = _chat(question, RED)
    path = "/v1/chat/completions/input_tokens"
    expected = _count(vision_server.url, path, body) - _count(
        vision_server.url, path, _chat(question)
    )
    record = _ask(vision_proxy, "/v1/chat/completions", body)
    assert record["accounting_error"] is None
    assert (record["images"], record["image_tokens"]) == (1, expected)
    assert record["image_tokens_each"] == [expected]
    assert record["images_cached"] == 0
    assert record["image_prefill_ms"] > 0


def test_a_repeated_image_is_cached_and_costs_nothing(vision_proxy: ProxyProcess) -> None:
    """The same request twice: the second one's prompt cache reaches past the image
    (``cache_n`` beyond its tokens), so ``images_cached`` is 1 and ``image_prefill_ms`` 0."""
    body = _chat(_question(), RED)
    first = _ask(vision_proxy, "/v1/chat/completions", body)
    again = _ask(vision_proxy, "/v1/chat/completions", body)
    assert first["images_cached"] == 0 and first["image_prefill_ms"] > 0
    assert again["cache_n"] > again["image_tokens"]
    assert (again["images_cached"], again["image_prefill_ms"]) == (1, 0.0)
    assert again["accounting_error"] is None


def test_a_different_image_is_charged(vision_proxy: ProxyProcess) -> None:
    """The same question with another picture after the first: the new image is prefilled
    (none cached, a positive cost), though everything before it is the same."""
    question = _question()
    _ask(vision_proxy, "/v1/chat/completions", _chat(question, RED))
    other = _ask(vision_proxy, "/v1/chat/completions", _chat(question, BLUE))
    assert other["images"] == 1
    assert (other["images_cached"], other["accounting_error"]) == (0, None)
    assert other["image_prefill_ms"] > 0


def test_two_images_each_counted(vision_server: LlamaServer, vision_proxy: ProxyProcess) -> None:
    """Two images in one turn: each one's count is the body's less the body without that
    image, the total the body's less the body without either; repeated, both are cached."""
    question = _question()
    body = _chat(question, RED, BLUE)
    path = "/v1/chat/completions/input_tokens"
    full = _count(vision_server.url, path, body)
    each = [
        full - _count(vision_server.url, path, _chat(question, BLUE)),
        full - _count(vision_server.url, path, _chat(question, RED)),
    ]
    record = _ask(vision_proxy, "/v1/chat/completions", body)
    assert record["images"] == 2
    assert record["image_tokens"] == full - _count(vision_server.url, path, _chat(question))
    assert record["image_tokens_each"] == each
    again = _ask(vision_proxy, "/v1/chat/completions", body)
    assert (again["images_cached"], again["image_prefill_ms"]) == (2, 0.0)


def test_tools_and_an_image(vision_server: LlamaServer, vision_proxy: ProxyProcess) -> None:
    """A tool request with an image: ``schema_tokens`` is the tools' own count (with the
    image or without it, the same), and ``image_tokens`` the image's, each left out of the
    other."""
    question = _question()
    tool_extra = {"tools": [WEATHER_TOOL], "stop": ["</tool_call>"], "parallel_tool_calls": False}
    body = _chat(question, RED, **tool_extra)
    path = "/v1/chat/completions/input_tokens"
    bare = {k: v for k, v in body.items() if k not in tool_extra}
    schema = _count(vision_server.url, path, body) - _count(vision_server.url, path, bare)
    image = _count(vision_server.url, path, body) - _count(
        vision_server.url, path, _chat(question, **tool_extra)
    )
    record = _ask(vision_proxy, "/v1/chat/completions", body)
    assert (record["kind"], record["accounting_error"]) == ("tool", None)
    assert (record["schema_tokens"], record["image_tokens"]) == (schema, image)


def test_responses_image_streamed(vision_server: LlamaServer, vision_proxy: ProxyProcess) -> None:
    """A streamed Responses request with an ``input_image``: its count is the Responses
    counting endpoint's difference; a repeat is cached and costs 0 ms (the stream carries
    ``timings``, so the cold one's cost is known too)."""

    def body(*images: bytes) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "input_text", "text": question}]
        content += [{"type": "input_image", "image_url": data_url(png)} for png in images]
        return {
            **ASK,
            "stream": True,
            "max_output_tokens": 4,
            "input": [{"role": "user", "content": content}],
        }

    question = _question()
    path = "/v1/responses/input_tokens"
    expected = _count(vision_server.url, path, body(RED)) - _count(vision_server.url, path, body())
    first = _ask(vision_proxy, "/v1/responses", body(RED))
    again = _ask(vision_proxy, "/v1/responses", body(RED))
    assert (first["api"], first["image_tokens"], first["images_cached"]) == (
        "responses",
        expected,
        0,
    )
    assert first["image_prefill_ms"] > 0
    assert (again["images_cached"], again["image_prefill_ms"]) == (1, 0.0)


def test_messages_image(vision_server: LlamaServer, vision_proxy: ProxyProcess) -> None:
    """An Anthropic Messages request with a base64 ``image`` block: its count is the Messages
    counting endpoint's difference; repeated, it is cached (0 ms: known without ``timings``,
    which this API does not send)."""

    def body(*images: bytes) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": question}]
        content += [
            {
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": "image/png",
                    "data": base64.b64encode(png).decode(),
                },
            }
            for png in images
        ]
        return {**ASK, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}

    question = _question()
    path = "/v1/messages/count_tokens"
    expected = _count(vision_server.url, path, body(BLUE)) - _count(vision_server.url, path, body())
    _ask(vision_proxy, "/v1/messages", body(BLUE))
    again = _ask(vision_proxy, "/v1/messages", body(BLUE))
    assert (again["api"], again["images"], again["image_tokens"]) == ("messages", 1, expected)
    assert (again["images_cached"], again["image_prefill_ms"]) == (1, 0.0)
