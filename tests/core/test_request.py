"""Tests for proxy.core.request: what the proxy reads of a request body."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.record import Kind
from proxy.core.request import RequestFacts, analyse_request, not_streamed
from tests.fakes import RECORDINGS_DIR, load_recording
from tests.profiles import examples

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ARM = {"type": "function", "function": {"name": "move_arm", "parameters": {"type": "object"}}}


_WORDS = st.sampled_from(["stream", "Stream", "streams", 'x"stream', 'stream"', "s\u00e9", "m"])
_SCALARS = st.one_of(st.booleans(), st.none(), st.integers(-5, 5), _WORDS, st.text(max_size=8))
_JSON_OBJECTS = st.dictionaries(
    _WORDS,
    st.recursive(
        _SCALARS,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_WORDS, inner, max_size=3),
        max_leaves=8,
    ),
    max_size=4,
)
"""JSON objects whose keys and strings are drawn to hit ``stream`` and its near misses."""


def body(**fields: Any) -> bytes:
    return orjson.dumps({"model": "gemma-3-270m", "messages": MESSAGES, **fields})


class TestKind:
    @pytest.mark.parametrize(
        ("method", "path", "raw", "kind"),
        [
            ("POST", CHAT, body(tools=[WEATHER]), Kind.TOOL),
            ("POST", CHAT, body(tools=[WEATHER, ARM], stream=True), Kind.TOOL),
            ("POST", CHAT, body(tools=[]), Kind.CHAT),
            ("POST", CHAT, body(tools=None), Kind.CHAT),
            ("POST", CHAT, body(), Kind.CHAT),
            ("POST", CHAT, body(tools={"get_weather": 1}), Kind.CHAT),
            ("POST", "/chat/completions", body(tools=[WEATHER]), Kind.TOOL),
            ("POST", CHAT + "/", body(), Kind.CHAT),
            ("POST", CHAT, b"", Kind.CHAT),
            ("POST", "/v1/completions", orjson.dumps({"prompt": "The capital of"}), Kind.OTHER),
            ("POST", "/v1/completions", body(tools=[WEATHER]), Kind.OTHER),
            ("POST", "/completion", orjson.dumps({"prompt": "x", "stream": True}), Kind.OTHER),
            ("POST", "/v1/embeddings", orjson.dumps({"input": "x"}), Kind.OTHER),
            ("GET", "/health", b"", Kind.OTHER),
            ("GET", "/v1/models", b"", Kind.OTHER),
            ("GET", CHAT, b"", Kind.OTHER),
            ("GET", CHAT, body(tools=[WEATHER]), Kind.OTHER),
        ],
        ids=[
            "chat_with_tools",
            "chat_two_tools_stream",
            "chat_empty_tools",
            "chat_null_tools",
            "chat_no_tools",
            "chat_tools_not_a_list",
            "unversioned_chat_path",
            "trailing_slash",
            "chat_empty_body",
            "completions",
            "completions_with_tools",
            "native_completion",
            "embeddings",
            "get_health",
            "get_models",
            "get_chat_path",
            "get_chat_with_body",
        ],
    )
    def test_kind(self, method: str, path: str, raw: bytes, kind: Kind) -> None:
        """tool = POST chat with a non-empty tools list; chat = other POST chat; else other."""
        assert analyse_request(method, path, raw).kind is kind


class TestFields:
    def test_tool_names_collected(self) -> None:
        """The names of every declared function are collected."""
        facts = analyse_request("POST", CHAT, body(tools=[WEATHER, ARM]))
        assert facts.tool_names == frozenset({"get_weather", "move_arm"})

    def test_malformed_tools_skipped(self) -> None:
        """Tools without a string function name are skipped; the others still count."""
        tools = [
            WEATHER,
            {"type": "function"},
            {"function": {"name": 3}},
            "x",
            None,
            {"function": "name"},
        ]
        facts = analyse_request("POST", CHAT, body(tools=tools))
        assert facts.tool_names == frozenset({"get_weather"})
        assert facts.kind is Kind.TOOL
        assert facts.error is None

    def test_no_tools_no_names(self) -> None:
        """Without tools the name set is empty."""
        assert analyse_request("POST", CHAT, body()).tool_names == frozenset()

    @pytest.mark.parametrize(
        ("fields", "stream"),
        [
            ({"stream": True}, True),
            ({"stream": False}, False),
            ({}, False),
            ({"stream": None}, False),
            ({"stream": "true"}, False),
            ({"stream": 1}, False),
        ],
        ids=["true", "false", "absent", "null", "string", "int"],
    )
    def test_stream_flag(self, fields: dict[str, Any], stream: bool) -> None:
        """stream is True only for a JSON true; false, absent or non-bool read as False."""
        assert analyse_request("POST", CHAT, body(**fields)).stream is stream

    def test_model(self) -> None:
        """The requested model name is read; a non-string model is None."""
        assert analyse_request("POST", CHAT, body()).model == "gemma-3-270m"
        raw = orjson.dumps({"model": 7, "messages": MESSAGES})
        assert analyse_request("POST", CHAT, raw).model is None

    def test_body_kept(self) -> None:
        """The parsed body object is kept for accounting."""
        raw = body(tools=[WEATHER])
        assert analyse_request("POST", CHAT, raw).body == orjson.loads(raw)

    def test_get_has_no_facts(self) -> None:
        """A GET is not parsed: no model, stream unknown (None), no body, no error."""
        assert analyse_request("GET", "/health", b"") == RequestFacts(kind=Kind.OTHER)

    def test_empty_post_body_no_error(self) -> None:
        """An empty POST body is not an analysis error."""
        facts = analyse_request("POST", CHAT, b"")
        assert facts.error is None
        assert facts.body is None


class TestErrors:
    @pytest.mark.parametrize(("path", "kind"), [(CHAT, Kind.CHAT), ("/v1/completions", Kind.OTHER)])
    def test_not_json(self, path: str, kind: Kind) -> None:
        """A non-JSON body gives error request_body_not_json and keeps the path's kind."""
        facts = analyse_request("POST", path, b'{"model": "gemma-3-270m", "messages": [')
        assert facts.error == "request_body_not_json"
        assert facts.kind is kind
        assert facts.body is None
        assert facts.tool_names == frozenset()

    def test_invalid_utf8(self) -> None:
        """Bytes that are not UTF-8 are reported as not JSON, not raised."""
        facts = analyse_request("POST", CHAT, b"\xff\xfe{}")
        assert facts.error == "request_body_not_json"

    @pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"42", b"null", b"true"])
    def test_not_an_object(self, raw: bytes) -> None:
        """JSON that is not an object gives request_body_not_an_object, kind from the path."""
        facts = analyse_request("POST", CHAT, raw)
        assert facts.error == "request_body_not_an_object"
        assert facts.kind is Kind.CHAT
        assert facts.body is None

    def test_valid_body_no_error(self) -> None:
        """A valid chat body has no analysis error."""
        assert analyse_request("POST", CHAT, body()).error is None


class TestRecordedRequests:
    @pytest.mark.parametrize(
        ("name", "kind", "stream"),
        [
            ("tool_stream", Kind.TOOL, True),
            ("tool_nostream", Kind.TOOL, False),
            ("chat_stream", Kind.CHAT, True),
            ("chat_nostream", Kind.CHAT, False),
            ("completions_stream", Kind.OTHER, True),
            ("health", Kind.OTHER, None),
        ],
    )
    def test_recorded(self, name: str, kind: Kind, stream: bool | None) -> None:
        """The requests sent to the real llama-server classify as expected."""
        if not (RECORDINGS_DIR / f"{name}.json").exists():
            pytest.skip(f"no recording {name}")
        rec = load_recording(name)
        facts = analyse_request(rec.request_method, rec.request_path, rec.request_body)
        assert facts.kind is kind
        assert facts.stream is stream
        if kind is Kind.TOOL:
            assert facts.tool_names == frozenset({"get_weather", "move_arm"})


class TestApi:
    @pytest.mark.parametrize(
        ("path", "api"),
        [
            ("/v1/chat/completions", "chat_completions"),
            ("/v1/responses", "responses"),
            ("/responses", "responses"),
            ("/v1/messages", "messages"),
            ("/completion", "completions"),
            ("/v1/completions", "completions"),
            ("/infill", "completions"),
            ("/v1/messages/count_tokens", "other"),
            ("/v1/embeddings", "other"),
            ("/health", "other"),
        ],
    )
    def test_the_api_of_a_path(self, path: str, api: str) -> None:
        """Each agent API's generation paths name their dialect; every other path is other."""
        assert analyse_request("POST", path, b"{}").api == api

    def test_responses_and_messages_with_tools_are_tool_requests(self) -> None:
        """Tools make a Responses or Messages request a tool request, read in the API's own
        tool shape (flat ``name`` for Responses, ``{name, input_schema}`` for Messages)."""
        responses = b'{"input":"hi","tools":[{"type":"function","name":"go","parameters":{}}]}'
        messages = b'{"messages":[],"tools":[{"name":"go","input_schema":{}}]}'
        for path, body in (("/v1/responses", responses), ("/v1/messages", messages)):
            facts = analyse_request("POST", path, body)
            assert (facts.kind, facts.tool_names) == (Kind.TOOL, frozenset({"go"}))


class TestNotStreamed:
    """``not_streamed`` tells, without parsing, that a body does not ask for a stream; the
    relay then leaves the parse for after the request is on its way."""

    @pytest.mark.parametrize(
        "raw",
        [
            body(),
            body(stream=False),
            b'{"model":"m","stream" :\t false,"messages":[]}',
            b'{"stream":false,"stream":false}',
            b"not json at all",
            body(messages=[{"role": "user", "content": 'say \\"stream\\": true'}]),
        ],
    )
    def test_bodies_without_a_stream_are_told_so(self, raw: bytes) -> None:
        """Absent, false (with any JSON whitespace, repeated), only inside a string, or no
        JSON: told, and the parse agrees (no stream)."""
        assert not_streamed(raw)
        assert analyse_request("POST", CHAT, raw).stream is not True

    @pytest.mark.parametrize(
        "raw",
        [
            body(stream=True),
            b'{"stream":false,"stream":true}',
            b'{"\\u0073tream":true}',
            b'{"stream":null}',
            b'{"model":"m","tags":["stream"],"stream":false}',
            b'{"stream":"false"}',
        ],
    )
    def test_anything_else_is_left_to_the_parse(self, raw: bytes) -> None:
        """A true, an escaped key, a value ``"stream"`` or any other value: not told, so
        the body is parsed before it is sent (the first two are streams)."""
        assert not not_streamed(raw)

    @given(obj=_JSON_OBJECTS, ascii_only=st.booleans(), spaced=st.booleans(), escaped=st.booleans())
    @settings(max_examples=examples(400), deadline=None)
    def test_never_wrong(
        self, obj: dict[str, Any], ascii_only: bool, spaced: bool, escaped: bool
    ) -> None:
        """On any JSON object (keys and strings drawn to hit ``stream``, written with or
        without escapes and spaces, ``"stream"`` spelled with an escaped letter or not), a
        body told not streamed parses to no stream."""
        raw = json.dumps(
            obj, ensure_ascii=ascii_only, separators=(", ", " : ") if spaced else (",", ":")
        ).encode()
        if escaped:  # the same JSON, the key written with an escape
            raw = raw.replace(b'"stream"', b'"\\u0073tream"')
        if not_streamed(raw):
            assert analyse_request("POST", CHAT, raw).stream is not True
