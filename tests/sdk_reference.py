"""The official SDKs' own reading of response bytes: the reference the dialect tests compare
the tracker with.

Each reader serves the given bytes to the SDK's real client through an in-memory transport
(``httpx2.MockTransport``, the HTTP library the installed ``openai`` and ``anthropic`` use), so
the SDK decodes the SSE itself and accumulates the events with its own stream helper:
``client.chat.completions.stream`` (``ChatCompletionStreamState``), ``client.responses.stream``
(``ResponseStreamState``) and ``client.messages.stream`` (``accumulate_event``). No code of
the proxy is involved.

Bodies: ``ChatCompletion`` and the Anthropic ``Message`` are validated strictly
(``model_validate_json``). llama-server's Responses body lacks fields the ``Response`` model
requires (``tools``, ``tool_choice``, ``parallel_tool_calls``...), so it is read as the
``openai`` client reads every body: by its lenient ``responses.create`` parse.

The prompt-cache diagnostics the proxy answers are parsed by the SDKs' own types
(``parse_*``), the reference for their shapes.

The SDKs are loaded on first use (:func:`sdks`): loading them and their types takes seconds,
which a test process that runs none of these readers (``-k``, ``-m slow``, one module) never
pays.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anthropic
    import httpx2
    import openai
    from anthropic.types import Diagnostics, RawMessageStartEvent
    from openai.types.responses.response import PromptCacheDiagnostics
    from pydantic import TypeAdapter

__all__ = [
    "chat_body_calls",
    "chat_stream_calls",
    "messages_body_calls",
    "messages_stream_calls",
    "parse_anthropic_diagnostics",
    "parse_message_start",
    "parse_openai_diagnostics",
    "responses_body_calls",
    "responses_stream_calls",
    "sdks",
]


SSE = "text/event-stream"
JSON = "application/json"


class _Replay:
    """A transport handler answering every request with the bytes it was last given."""

    def __init__(self) -> None:
        self.chunks: Sequence[bytes] = ()
        self.content_type = SSE

    def serve(self, chunks: Sequence[bytes], content_type: str) -> None:
        self.chunks = chunks
        self.content_type = content_type

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        import httpx2

        def body() -> Iterator[bytes]:
            yield from self.chunks

        return httpx2.Response(200, headers={"content-type": self.content_type}, content=body())


_REPLAY = _Replay()


@dataclass(frozen=True)
class Clients:
    """The SDKs' clients, their requests answered by :data:`_REPLAY`, and the openai SDK's
    reading of ``prompt_cache_diagnostics``."""

    openai: openai.OpenAI
    anthropic: anthropic.Anthropic
    openai_diagnostics: TypeAdapter[PromptCacheDiagnostics]


@cache
def sdks() -> Clients:
    """Load the SDKs, the types the readers parse with and the clients' resources, once; then
    freeze what is alive, as after the collection (``tests/conftest.py``): the full
    collections later in the run (the proxy's at each start, the memory tests') skip the
    SDKs' few hundred thousand objects."""
    import anthropic
    import anthropic.types
    import httpx2
    import openai
    import openai.types.chat
    from openai.types.responses.response import PromptCacheDiagnostics
    from pydantic import TypeAdapter

    clients = Clients(
        openai.OpenAI(
            api_key="unused",
            base_url="http://sdk-reference.invalid/v1",
            http_client=httpx2.Client(transport=httpx2.MockTransport(_REPLAY)),
            max_retries=0,
        ),
        anthropic.Anthropic(
            api_key="unused",
            base_url="http://sdk-reference.invalid",
            http_client=httpx2.Client(transport=httpx2.MockTransport(_REPLAY)),
            max_retries=0,
        ),
        TypeAdapter(PromptCacheDiagnostics),
    )
    # the SDKs import a resource's module on its first use: the ones the readers use, now
    _ = (clients.openai.chat.completions, clients.openai.responses, clients.anthropic.messages)
    gc.freeze()
    return clients


_MODEL = "gemma3"
_PROMPT = "hi"


def chat_stream_calls(chunks: Sequence[bytes]) -> list[tuple[str, str]]:
    """(name, arguments) of each call in the completion the openai SDK's
    ``ChatCompletionStreamState`` assembles from a streamed Chat Completions response (its
    snapshot once the stream is read: ``get_final_completion`` raises on ``length``)."""
    _REPLAY.serve(chunks, SSE)
    with sdks().openai.chat.completions.stream(
        model=_MODEL, messages=[{"role": "user", "content": _PROMPT}]
    ) as stream:
        stream.until_done()
        snapshot = stream.current_completion_snapshot
    calls = snapshot.choices[0].message.tool_calls or []
    return [(c.function.name, c.function.arguments) for c in calls]


def responses_stream_calls(chunks: Sequence[bytes]) -> list[tuple[str, str]]:
    """(name, arguments) of each ``function_call`` item of the response the openai SDK's
    ``ResponseStreamState`` assembles from a streamed Responses API reply (it needs OpenAI's
    ``output_index`` on every item event, which llama-server does not send)."""
    _REPLAY.serve(chunks, SSE)
    with sdks().openai.responses.stream(model=_MODEL, input=_PROMPT) as stream:
        response = stream.get_final_response()
    return [(i.name, i.arguments) for i in response.output if i.type == "function_call"]


def messages_stream_calls(chunks: Sequence[bytes]) -> list[tuple[str, Any]]:
    """(name, input) of each ``tool_use`` block of the message the anthropic SDK's
    ``accumulate_event`` assembles from a streamed Messages reply (``input`` is the SDK's
    parse of the block's ``input_json_delta`` fragments)."""
    _REPLAY.serve(chunks, SSE)
    with sdks().anthropic.messages.stream(
        model=_MODEL, max_tokens=48, messages=[{"role": "user", "content": _PROMPT}]
    ) as stream:
        message = stream.get_final_message()
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def chat_body_calls(body: bytes) -> list[tuple[str, str]]:
    """(name, arguments) of each call of a Chat Completions body, by ``ChatCompletion``."""
    sdks()
    from openai.types.chat import ChatCompletion

    completion = ChatCompletion.model_validate_json(body)
    calls = completion.choices[0].message.tool_calls or []
    return [(c.function.name, c.function.arguments) for c in calls if c.type == "function"]


def responses_body_calls(body: bytes) -> list[tuple[str, str]]:
    """(name, arguments) of each ``function_call`` item of a Responses body, as the openai
    client parses the body of ``responses.create``."""
    _REPLAY.serve([body], JSON)
    response = sdks().openai.responses.create(model=_MODEL, input=_PROMPT)
    return [(i.name, i.arguments) for i in response.output if i.type == "function_call"]


def messages_body_calls(body: bytes) -> list[tuple[str, Any]]:
    """(name, input) of each ``tool_use`` block of a Messages body, by ``Message``."""
    sdks()
    from anthropic.types import Message

    message = Message.model_validate_json(body)
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def parse_anthropic_diagnostics(answer: Any) -> Diagnostics:
    """A Messages ``diagnostics`` object, by the anthropic SDK's ``Diagnostics``."""
    sdks()
    from anthropic.types import Diagnostics

    return Diagnostics.model_validate(answer)


def parse_message_start(event: Any) -> RawMessageStartEvent:
    """A Messages ``message_start`` event, by the anthropic SDK's ``RawMessageStartEvent``."""
    sdks()
    from anthropic.types import RawMessageStartEvent

    return RawMessageStartEvent.model_validate(event)


def parse_openai_diagnostics(answer: Any) -> PromptCacheDiagnostics:
    """A Responses ``prompt_cache_diagnostics`` object, by the openai SDK's
    ``PromptCacheDiagnostics``."""
    return sdks().openai_diagnostics.validate_python(answer)
