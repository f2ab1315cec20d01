"""A tool call cut by the token limit, against the real llama-server through the proxy, on
the Responses API and Anthropic Messages, streamed and not.

llama-server's Responses API says ``status: "completed"`` (and so does the cut call's item)
when ``max_output_tokens`` ends the turn inside the call's arguments; Messages says
``stop_reason: "max_tokens"`` and, in a body, writes ``input: {}`` for the cut arguments. The
record must say what Chat Completions says for the same generation: finish ``length`` and
``tool_call_truncated: true``; with enough tokens for the arguments the call is not
truncated.

Run with ``-s`` to see one JSON line per request: the record's fields beside what the server
itself said.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from proxy.core.headers import REQUEST_ID_HEADER
from tests.conftest import ProxyProcess

pytestmark = pytest.mark.real

PROMPT = "What is the weather in Paris right now?"
DESCRIPTION = "Get the current weather for a city."
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}
NO_THINKING = {"enable_thinking": False}
STOP = ["</tool_call>"]
WHOLE_ARGUMENTS = '{"city": "Paris"}'

CUT_LIMIT = 20
"""Too few tokens for the call: with this prompt, template and model at temperature 0 the
call's name is parsed by the 16th generated token and its arguments end at the 24th (seen:
a limit of 20 stops them at ``{"city":``, 22 at ``{"city": "Paris``)."""
ENOUGH = {"responses": 100, "messages": 30}
"""Tokens enough for the arguments: on Responses the stop word ends the turn at 30; Messages
drops ``parallel_tool_calls``, so the model goes on to a second call's markup after the
first and the limit ends the turn there, after the whole first call."""

PRINTED = (
    *("api", "stream", "max_tokens", "predicted_n", "finish_reason", "tool_calls"),
    *("tool_call_valid", "tool_call_truncated", "tool_args_chars", "outcome"),
)


def _request(api: str, limit: int, stream: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of a get_weather request on ``api`` with the token ``limit``."""
    if api == "responses":
        tool = {"type": "function", "name": "get_weather", "description": DESCRIPTION}
        return "/v1/responses", {
            "model": "gemma",
            "input": PROMPT,
            "tools": [tool | {"parameters": PARAMETERS}],
            "parallel_tool_calls": False,
            "max_output_tokens": limit,
            "temperature": 0,
            "stop": STOP,
            "chat_template_kwargs": NO_THINKING,
            "stream": stream,
        }
    return "/v1/messages", {
        "model": "gemma",
        "max_tokens": limit,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [{"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMETERS}],
        "stop_sequences": STOP,
        "temperature": 0,
        "chat_template_kwargs": NO_THINKING,
        "stream": stream,
    }


def _send(base: str, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
    """POST ``body``; the proxy's request id and the whole response body as received."""
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.headers[REQUEST_ID_HEADER], resp.read()


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON data of every event of a stream."""
    out = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(json.loads(line[6:]))
    return out


def _server_said(api: str, raw: bytes, stream: bool) -> dict[str, Any]:
    """The server's own word on how the turn ended: Responses' final response (its status,
    usage and output items), Messages' stop reason and output tokens, and the arguments of
    the calls as the response carries them (joined fragments of a stream)."""
    if api == "responses":
        if stream:
            events = _events(raw)
            final = next(e["response"] for e in events if e["type"] == "response.completed")
        else:
            final = json.loads(raw)
        calls = [i for i in final["output"] if i["type"] == "function_call"]
        return {
            "status": final["status"],
            "output_tokens": final["usage"]["output_tokens"],
            "item_status": [c["status"] for c in calls],
            "arguments": [c["arguments"] for c in calls],
        }
    if stream:
        events = _events(raw)
        end = next(e for e in events if e["type"] == "message_delta")
        reason, output = end["delta"]["stop_reason"], end["usage"]["output_tokens"]
        fragments: dict[int, str] = {}
        for e in events:
            delta = e.get("delta", {})
            if e["type"] == "content_block_delta" and delta.get("type") == "input_json_delta":
                fragments[e["index"]] = fragments.get(e["index"], "") + delta["partial_json"]
        arguments = [fragments[k] for k in sorted(fragments)]
    else:
        message = json.loads(raw)
        reason, output = message["stop_reason"], message["usage"]["output_tokens"]
        uses = [b for b in message["content"] if b["type"] == "tool_use"]
        arguments = [json.dumps(b["input"]) for b in uses]
    return {"stop_reason": reason, "output_tokens": output, "arguments": arguments}


def _run(
    proxy: ProxyProcess, api: str, limit: int, stream: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One request through the proxy: its record and what the server said; prints both."""
    path, body = _request(api, limit, stream)
    request_id, raw = _send(proxy.url, path, body)
    record = proxy.record(request_id, within=30)
    said = _server_said(api, raw, stream)
    line = {"record": {name: record.get(name) for name in PRINTED}, "server": said}
    print(json.dumps(line, separators=(",", ":")))
    return record, said


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "body"])
@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_limit_inside_the_arguments_truncates_the_call(
    proxy_process: ProxyProcess, api: str, stream: bool
) -> None:
    """max tokens 20 stop the call inside its arguments: the server says ``completed``
    (Responses, the call's item too) or ``max_tokens`` (Messages) after 20 tokens, and the
    record says finish ``length`` and ``tool_call_truncated: true`` for the one call."""
    record, said = _run(proxy_process, api, CUT_LIMIT, stream)
    assert said["output_tokens"] == CUT_LIMIT
    assert len(said["arguments"]) == 1 and said["arguments"][0] != WHOLE_ARGUMENTS
    if api == "responses":
        assert said["status"] == "completed" and said["item_status"] == ["completed"]
        assert WHOLE_ARGUMENTS.startswith(said["arguments"][0])
    else:
        assert said["stop_reason"] == "max_tokens"
    assert record["outcome"] == "completed" and record["kind"] == "tool"
    assert (record["predicted_n"], record["max_tokens"], record["tool_calls"]) == (
        CUT_LIMIT,
        CUT_LIMIT,
        1,
    )
    assert record["finish_reason"] == "length"
    assert record["tool_call_truncated"] is True


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "body"])
@pytest.mark.parametrize("api", ["responses", "messages"])
def test_enough_tokens_leave_the_call_whole(
    proxy_process: ProxyProcess, api: str, stream: bool
) -> None:
    """With tokens enough for the arguments the call is whole, valid and not truncated:
    finish ``tool_calls`` on Responses (the stop word ended the turn), ``length`` on
    Messages (the limit ended it after the whole call)."""
    limit = ENOUGH[api]
    record, said = _run(proxy_process, api, limit, stream)
    assert said["arguments"][0] == WHOLE_ARGUMENTS
    assert record["outcome"] == "completed" and record["kind"] == "tool"
    assert record["tool_calls"] == len(said["arguments"]) and record["tool_call_valid"] is True
    if api == "responses":
        assert said["output_tokens"] < limit
        assert (record["finish_reason"], record["tool_call_tokens"]) == (
            "tool_calls",
            said["output_tokens"],
        )
    else:
        assert said["stop_reason"] == "max_tokens"
        assert record["finish_reason"] == "length"
    assert record["tool_call_truncated"] is False
