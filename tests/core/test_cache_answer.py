"""Tests for proxy.core.cache_answer: which requests ask for prompt-cache diagnostics, and the
answer appended to a body or an event with every other byte kept."""

from __future__ import annotations

import orjson

from proxy.core.cache_answer import Asked, ChatSplitter, asked, with_member, with_member_in_event
from proxy.core.request import analyse_request


def test_only_the_apis_own_option_asks() -> None:
    """Messages' ``diagnostics.previous_message_id`` and Responses'
    ``prompt_cache_options.comparison_response_id`` ask (null: opting in with nothing to
    compare); a request without them, or on another API, asks nothing."""
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    option = {"diagnostics": {"previous_message_id": "chatcmpl-1"}}
    assert asked(analyse_request("POST", "/v1/messages", orjson.dumps(base | option))) == Asked(
        "messages", "chatcmpl-1"
    )
    null = {"diagnostics": {"previous_message_id": None}}
    assert asked(analyse_request("POST", "/v1/messages", orjson.dumps(base | null))) == Asked(
        "messages", None
    )
    assert asked(analyse_request("POST", "/v1/messages", orjson.dumps(base))) is None
    assert (
        asked(analyse_request("POST", "/v1/chat/completions", orjson.dumps(base | option))) is None
    )
    responses = {"input": "hi", "prompt_cache_options": {"comparison_response_id": "resp_1"}}
    assert asked(analyse_request("POST", "/v1/responses", orjson.dumps(responses))) == Asked(
        "responses", "resp_1"
    )
    ttl_only = {"input": "hi", "prompt_cache_options": {"ttl": "30m"}}
    assert asked(analyse_request("POST", "/v1/responses", orjson.dumps(ttl_only))) is None


def test_a_member_is_appended_and_nothing_else_changes() -> None:
    """The member goes last in the object, after its own bytes as they were (escapes,
    spacing, number forms); an empty object gets no comma; what is not a JSON object is
    left alone (None)."""
    body = b'{"a": "\\u00e9", "n": 1.50 }'
    assert with_member(body, "d", {"x": None}) == b'{"a": "\\u00e9", "n": 1.50 ,"d":{"x":null}}'
    assert with_member(b"{}", "d", 1) == b'{"d":1}'
    assert with_member(b"[1]", "d", 1) is None
    assert with_member(b"{not json", "d", 1) is None
    inner = b'{"type":"t","response":{"id":"r"},"timings":{"n":1}}'
    assert with_member(inner, "d", 2, "response") == (
        b'{"type":"t","response":{"id":"r","d":2},"timings":{"n":1}}'
    )


def test_an_event_gets_the_member_in_its_inner_object() -> None:
    """``message_start``'s ``message`` gets the member; the ``event:`` line and the blank
    line stay; an event whose data is not JSON goes as it is."""
    event = b'event: message_start\ndata: {"type":"message_start","message":{"id":"c"}}\n\n'
    assert with_member_in_event(event, "messages", "diagnostics", None) == (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"c",'
        b'"diagnostics":null}}\n\n'
    )
    broken = b"event: message_start\ndata: {oops\n\n"
    assert with_member_in_event(broken, "messages", "diagnostics", None) == broken


def test_chat_completions_asks_with_the_responses_option() -> None:
    """Chat Completions asks with ``prompt_cache_options.comparison_response_id`` (on both
    paths); ``stream_options.include_usage`` moves a stream's answer to the usage chunk."""
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    option = {"prompt_cache_options": {"comparison_response_id": "chatcmpl-1"}}
    for path in ("/v1/chat/completions", "/chat/completions"):
        facts = analyse_request("POST", path, orjson.dumps(base | option))
        assert asked(facts) == Asked("chat_completions", "chatcmpl-1")
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    facts = analyse_request("POST", "/v1/chat/completions", orjson.dumps(base | option | usage))
    assert asked(facts) == Asked("chat_completions", "chatcmpl-1", usage_chunk=True)
    assert asked(analyse_request("POST", "/v1/chat/completions", orjson.dumps(base))) is None


def test_the_chat_splitter_stops_at_the_chunk_with_the_counts() -> None:
    """The splitter passes whole chunks on, holds only an unfinished one, and stops at the
    ``finish_reason`` chunk, or at the usage chunk when asked; never at ``[DONE]``."""
    token = b'data: {"choices":[{"finish_reason":null,"delta":{"content":"a"}}]}\n\n'
    finish = b'data: {"choices":[{"finish_reason":"stop","delta":{}}],"timings":{}}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\n'
    stream = token + finish + usage + b"data: [DONE]\n\n"
    splitter = ChatSplitter(usage_chunk=False)
    assert splitter.split(stream[:10]) == (b"", None)
    assert splitter.split(stream[10 : len(token) + 5]) == (token, None)
    assert splitter.split(stream[len(token) + 5 :]) == (b"", finish + usage + b"data: [DONE]\n\n")
    asked_usage = ChatSplitter(usage_chunk=True)
    assert asked_usage.split(stream) == (token + finish, usage + b"data: [DONE]\n\n")
    none = ChatSplitter(usage_chunk=True)
    assert none.split(token + b"data: [DONE]\n\ndata: {") == (token + b"data: [DONE]\n\n", None)
    assert none.end() == (b"data: {", False)
    event = with_member_in_event(finish, "chat_completions", "prompt_cache_diagnostics", None)
    assert event == finish.replace(
        b'"timings":{}}', b'"timings":{},"prompt_cache_diagnostics":null}'
    )
