"""Tests for proxy.core.dialects.completions: native ``/completion`` and ``/infill``, and the
OpenAI legacy ``/v1/completions``, read by one dialect (wire shapes of protocol doc §4.7, §8.8,
as seen on the real server)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from proxy.commands.provision import LlamaServer
from proxy.core.dialects.completions import COMPLETIONS
from proxy.core.record import ServerTimings
from proxy.core.tracker import Observation, StreamTracker
from tests.fakes import FakeClock, sse_json

MODEL = "gemma-3-270m-q4_k_m"
TIMINGS = {
    "cache_n": 0,
    "prompt_n": 2,
    "prompt_ms": 733.209,
    "prompt_per_token_ms": 366.6045,
    "prompt_per_second": 2.7277352023774943,
    "predicted_n": 8,
    "predicted_ms": 5139.402,
    "predicted_per_token_ms": 734.2002857142858,
    "predicted_per_second": 1.3620261656900938,
}
TIMINGS_OBSERVED = ServerTimings(
    prompt_n=2, prompt_ms=733.209, cache_n=0, predicted_n=8, predicted_ms=5139.402
)
PIECES = (",", "\n\n", "I", " have", " a", " ", "2", "0")
"""The eight pieces the real server streamed for prompt "Hello" at temperature 0."""
ERROR = {"error": {"code": 500, "message": "Compute error.", "type": "server_error"}}


def observe(chunks: Iterable[bytes], *, sse: bool = True) -> Observation:
    """Feed chunk i at time i + 1 (seconds since the request) and finish."""
    clock = FakeClock()
    tracker = StreamTracker(0.0, sse=sse, clock=clock, dialect=COMPLETIONS)
    for i, chunk in enumerate(chunks):
        clock.now = float(i + 1)
        tracker.feed(chunk)
    return tracker.finish()


# native /completion ---------------------------------------------------------------------------


def native_partial(n: int, piece: str, *, tokens_evaluated: int = 2, **extra: Any) -> bytes:
    """A native partial: every token its own event and HTTP chunk, with its token id."""
    return sse_json(
        {
            "index": 0,
            "content": piece,
            "tokens": [236000 + n],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": n,
            "tokens_evaluated": tokens_evaluated,
            **extra,
        }
    )


def native_final(
    stop_type: str = "limit", *, content: str = "", tokens_predicted: int = 8, **over: Any
) -> dict[str, Any]:
    """The native final object, keys in llama-server's order (``id_slot`` before ``stop``)."""
    final: dict[str, Any] = {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": MODEL,
        "tokens_predicted": tokens_predicted,
        "tokens_evaluated": 2,
        "generation_settings": {"temperature": 0.0, "stop": [], "n_predict": 8, "lora": []},
        "prompt": "<bos>Hello",
        "has_new_line": True,
        "truncated": False,
        "stop_type": stop_type,
        "stopping_word": "",
        "tokens_cached": 9,
        "timings": TIMINGS,
    }
    final.update(over)
    return final


def native_stream(stop_type: str = "limit", **over: Any) -> list[bytes]:
    return [native_partial(n, p) for n, p in enumerate(PIECES, 1)] + [
        sse_json(native_final(stop_type, **over))
    ]


class TestPaths:
    def test_the_completion_endpoints_are_this_dialects(self) -> None:
        """/completion, /completions, /v1/completions and /infill (trailing slash or not)
        belong to this dialect; chat, Responses and paths that merely end alike do not."""
        for path in ("/completion", "/completions", "/v1/completions", "/infill", "/infill/"):
            assert COMPLETIONS.handles(path), path
        for path in ("/v1/chat/completions", "/chat/completions", "/v1/responses", "/x/infill"):
            assert not COMPLETIONS.handles(path), path
        assert COMPLETIONS.name == "completions"

    def test_no_tools_on_these_endpoints(self) -> None:
        """A prompt completion is no tool turn: no tool names, and no tool calls even in an
        object shaped like a Chat Completions tool call."""
        call = {"index": 0, "function": {"name": "go", "arguments": "{}"}}
        tools = [{"type": "function", "function": {"name": "go"}}]
        streamed = {"choices": [{"delta": {"tool_calls": [call]}}]}
        body = {"choices": [{"message": {"tool_calls": [call]}}]}
        assert not COMPLETIONS.tool_request("POST", "/v1/completions")
        assert COMPLETIONS.tool_names(tools) == frozenset()
        assert COMPLETIONS.tool_reader()(streamed) is None
        assert COMPLETIONS.body_tool_calls(body) is None

    def test_stop_types_in_chat_words(self) -> None:
        """stop_type eos and word are "stop", limit is "length"; none (and an unknown or
        non-string value) states no reason."""
        read = COMPLETIONS.finish_reasons
        assert read({"stop_type": "eos"}) == ["stop"]
        assert read({"stop_type": "word"}) == ["stop"]
        assert read({"stop_type": "limit"}) == ["length"]
        assert read({"stop_type": "none"}) == []
        assert read({"stop_type": "other"}) == []
        assert read({"stop_type": 3}) == []

    def test_odd_input_is_read_as_nothing(self) -> None:
        """Malformed counts, choices and usage give no values instead of raising."""
        for obj in (
            {"stop": True, "tokens_predicted": -1},
            {"stop": True, "tokens_predicted": True},
            {"usage": {"completion_tokens": "8"}},
            {"usage": [1]},
            {"choices": "x"},
        ):
            assert COMPLETIONS.usage(obj) is None, obj
            assert COMPLETIONS.finish_reasons(obj) == [], obj


class TestNativeStream:
    def test_text_reply_cut_by_the_limit(self) -> None:
        """Each partial with a piece is a token event (first at its chunk, last at the eighth);
        the final object gives finish "length", its timings and model, and ends the stream
        (done, though no [DONE] comes)."""
        obs = observe(native_stream("limit"))
        assert obs.events == 9
        assert obs.token_events == 8
        assert (obs.first_token_s, obs.last_token_s) == (1.0, 8.0)
        assert obs.finish_reason == "length"
        assert obs.timings == TIMINGS_OBSERVED
        assert obs.model == MODEL
        assert obs.tool_calls == () and obs.tool_call_s is None
        assert obs.upstream_error is None and obs.analysis_error is None
        assert obs.done

    def test_stop_word(self) -> None:
        """A stop word ends the turn as "stop"; the held-back stop token's partial carries no
        piece (only timings) and is no token event."""
        chunks = [native_partial(n, p, tokens_evaluated=6) for n, p in enumerate(PIECES[:7], 1)]
        chunks.append(native_partial(8, "", tokens_evaluated=6, timings=TIMINGS))
        chunks.append(sse_json(native_final("word", stopping_word=".")))
        obs = observe(chunks)
        assert obs.token_events == 7
        assert (obs.first_token_s, obs.last_token_s) == (1.0, 7.0)
        assert obs.finish_reason == "stop"
        assert obs.timings == TIMINGS_OBSERVED

    def test_end_of_sequence_and_none(self) -> None:
        """eos is "stop"; stop_type none leaves the finish reason unknown (None)."""
        assert observe(native_stream("eos")).finish_reason == "stop"
        assert observe(native_stream("none")).finish_reason is None

    def test_counts_without_timings(self) -> None:
        """Without timings (e.g. filtered by response_fields) only tokens_predicted is a count:
        tokens_evaluated is the whole prompt and tokens_cached the slot's length, neither the
        uncached nor the cached share."""
        final = native_final()
        del final["timings"]
        obs = observe([native_partial(1, ","), sse_json(final)])
        assert obs.timings == ServerTimings(predicted_n=8)

    def test_a_cut_stream_states_no_count(self) -> None:
        """A stream cut before the final object has no finish reason and no counts: the
        first partial's running tokens_predicted (1) is not taken as the total."""
        obs = observe(native_stream()[:5])
        assert obs.token_events == 5
        assert obs.finish_reason is None
        assert obs.timings is None

    def test_mid_stream_error(self) -> None:
        """An error after the headers is one data event and the end of the stream: it is the
        upstream error, the tokens before it still count, no finish reason is invented."""
        obs = observe([native_partial(1, ","), native_partial(2, "\n\n"), sse_json(ERROR)])
        assert obs.token_events == 2
        assert obs.upstream_error == "server_error:500"
        assert obs.finish_reason is None and obs.timings is None and not obs.done

    def test_chunk_boundaries_do_not_matter(self) -> None:
        """The same bytes split one byte a chunk are read as when each event is its own chunk:
        the same counts, reason and timings."""
        whole = b"".join(native_stream())
        obs = observe([whole[i : i + 1] for i in range(len(whole))])
        assert obs.token_events == 8
        assert obs.finish_reason == "length"
        assert obs.timings == TIMINGS_OBSERVED

    def test_progress_and_per_token_timings(self) -> None:
        """With return_progress and timings_per_token, a progress-only event (no piece) is no
        token; each partial's timings are read and the final object's win."""
        progress = {"total": 2, "cache": 0, "processed": 2, "time_ms": 30.0}
        partial_timings = {**TIMINGS, "predicted_n": 1, "predicted_ms": 1.0}
        chunks = [
            native_partial(0, "", prompt_progress=progress),
            native_partial(1, ",", timings=partial_timings),
            sse_json(native_final()),
        ]
        obs = observe(chunks)
        assert obs.token_events == 1
        assert obs.first_token_s == 2.0
        assert obs.timings == TIMINGS_OBSERVED


# OpenAI legacy /v1/completions ----------------------------------------------------------------


def legacy_chunk(text: str, finish: str | None = None, **tail: Any) -> bytes:
    """A /v1/completions chunk, keys in llama-server's order (usage before id, timings last)."""
    obj: dict[str, Any] = {
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        "created": 1796072122,
        "model": MODEL,
        "system_fingerprint": "b0-unknown",
        "object": "text_completion",
    }
    if "usage" in tail:
        obj["usage"] = tail.pop("usage")
    obj["id"] = "chatcmpl-nwncK8tHxwaO0W2mvjUoUj1vwSTtoPAl"
    obj.update(tail)
    return sse_json(obj)


USAGE = {
    "completion_tokens": 8,
    "prompt_tokens": 2,
    "total_tokens": 10,
    "prompt_tokens_details": {"cached_tokens": 0},
}


def legacy_stream(finish: str = "length", **final: Any) -> list[bytes]:
    """The pieces, the final chunk (its own HTTP chunk), then [DONE] from a separate write."""
    final.setdefault("usage", USAGE)
    final.setdefault("timings", TIMINGS)
    return [legacy_chunk(p) for p in PIECES] + [
        legacy_chunk("", finish, **final),
        b"data: [DONE]\n\n",
    ]


class TestLegacyStream:
    def test_text_reply_cut_by_the_limit(self) -> None:
        """Each chunk with text is a token event; the final chunk gives finish_reason as is
        and timings; [DONE] ends the stream (done)."""
        obs = observe(legacy_stream("length"))
        assert obs.events == 10
        assert obs.token_events == 8
        assert (obs.first_token_s, obs.last_token_s) == (1.0, 8.0)
        assert obs.finish_reason == "length"
        assert obs.timings == TIMINGS_OBSERVED
        assert obs.model == MODEL
        assert obs.tool_calls == () and obs.tool_call_s is None
        assert obs.done

    def test_natural_stop(self) -> None:
        """finish_reason "stop" is kept as it is."""
        assert observe(legacy_stream("stop")).finish_reason == "stop"

    def test_usage_when_no_timings(self) -> None:
        """Without timings the usage gives the uncached prompt tokens (prompt_tokens less the
        cached ones), the cached ones and completion_tokens, as on Chat Completions."""
        usage = {**USAGE, "prompt_tokens": 221, "prompt_tokens_details": {"cached_tokens": 216}}
        stream = legacy_stream(usage=usage)
        stream[-2] = legacy_chunk("", "length", usage=usage)
        obs = observe(stream)
        assert obs.timings == ServerTimings(prompt_n=5, cache_n=216, predicted_n=8)

    def test_usage_without_the_cached_share(self) -> None:
        """A usage that does not state the cached tokens gives completion_tokens alone: the
        uncached share of prompt_tokens is unknown."""
        usage = {"completion_tokens": 8, "prompt_tokens": 2, "total_tokens": 10}
        assert COMPLETIONS.usage({"usage": usage}) == ServerTimings(predicted_n=8)

    def test_mid_stream_error(self) -> None:
        """A mid-stream error event ends the stream without [DONE]: upstream error, not done,
        no finish reason."""
        obs = observe([legacy_chunk(","), sse_json(ERROR)])
        assert obs.token_events == 1
        assert obs.upstream_error == "server_error:500"
        assert obs.finish_reason is None and not obs.done


class TestBodies:
    def test_native_body(self) -> None:
        """A non-streamed /completion body (the final object with the whole text) gives the
        finish reason, timings and model; no token events (no stream) and no tool calls."""
        body = orjson.dumps(native_final("limit", content=",\n\nI have a 20"))
        obs = observe([body[:100], body[100:]], sse=False)
        assert obs.finish_reason == "length"
        assert obs.timings == TIMINGS_OBSERVED
        assert obs.model == MODEL
        assert obs.token_events == 0 and obs.tool_calls == () and obs.tool_call_s is None

    def test_legacy_body(self) -> None:
        """A non-streamed /v1/completions body gives its finish_reason, timings and model."""
        body = orjson.dumps(
            {
                "choices": [
                    {"text": ",\n\nI", "index": 0, "logprobs": None, "finish_reason": "stop"}
                ],
                "created": 1796072141,
                "model": MODEL,
                "system_fingerprint": "b0-unknown",
                "object": "text_completion",
                "usage": USAGE,
                "id": "chatcmpl-fF3VhqQGdQUOI5jZza2JHP6eDu1l7KcF",
                "timings": TIMINGS,
            }
        )
        obs = observe([body], sse=False)
        assert obs.finish_reason == "stop"
        assert obs.timings == TIMINGS_OBSERVED
        assert obs.model == MODEL and obs.tool_calls == ()

    def test_error_body(self) -> None:
        """/infill on a model without FIM tokens answers a 501 error body: the upstream error."""
        body = orjson.dumps(
            {
                "error": {
                    "code": 501,
                    "message": "Infill is not supported by this model: prefix token is missing",
                    "type": "not_supported_error",
                }
            }
        )
        obs = observe([body], sse=False)
        assert obs.upstream_error == "not_supported_error:501"
        assert obs.finish_reason is None and obs.timings is None


# the real server ------------------------------------------------------------------------------


def _stream_direct(url: str, body: dict[str, Any]) -> list[bytes]:
    """POST a streamed request and return the HTTP chunks exactly as received."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    chunks: list[bytes] = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.headers.get("Content-Type", "").startswith("text/event-stream")
        while chunk := resp.read1(65536):
            chunks.append(chunk)
    return chunks


def _reference(chunks: list[bytes]) -> tuple[list[tuple[int, dict[str, Any] | None]], bool]:
    """An independent read: every event's data parsed (None for [DONE]) with the index of the
    chunk that completed it, and whether the stream ended ([DONE], or a native final object
    with ``stop: true``)."""
    events: list[tuple[int, dict[str, Any] | None]] = []
    buffer = b""
    for i, chunk in enumerate(chunks):
        buffer += chunk
        while b"\n\n" in buffer:
            raw, buffer = buffer.split(b"\n\n", 1)
            data = b"".join(
                line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")
            )
            if data:
                events.append((i, None if data == b"[DONE]" else json.loads(data)))
    return events, any(obj is None or obj.get("stop") is True for _, obj in events)


def _piece(obj: dict[str, Any]) -> str:
    if "choices" in obj:
        return str(obj["choices"][0].get("text") or "")
    return str(obj.get("content") or "")


@pytest.mark.real
def test_real_completion_streams(llama_server: LlamaServer) -> None:
    """Native /completion and legacy /v1/completions streamed straight from the real
    llama-server: the observation's token events, first/last token times, finish reason,
    timings, model and end equal what an independent parse finds in the very same bytes."""
    requests = {
        "/completion": {"prompt": "Hello", "n_predict": 8, "temperature": 0, "stream": True},
        "/v1/completions": {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "stream": True},
    }
    for path, body in requests.items():
        chunks = _stream_direct(llama_server.url + path, body)
        events, ended = _reference(chunks)
        final = [obj for _, obj in events if obj is not None][-1]
        tokens = [i + 1.0 for i, obj in events if obj is not None and _piece(obj)]
        obs = observe(chunks)
        assert obs.token_events == len(tokens) > 0, path
        assert (obs.first_token_s, obs.last_token_s) == (tokens[0], tokens[-1]), path
        assert obs.timings == ServerTimings.from_json(final["timings"]), path
        assert obs.model == final["model"], path
        assert obs.tool_calls == () and obs.upstream_error is None, path
        assert obs.done == ended, path
        if path == "/completion":
            expected = {"eos": "stop", "word": "stop", "limit": "length"}.get(final["stop_type"])
            assert obs.finish_reason == expected
            assert obs.timings is not None and ended  # the final object (stop: true) ends it
            assert obs.timings.predicted_n == final["tokens_predicted"]
            prompt = (obs.timings.prompt_n or 0) + (obs.timings.cache_n or 0)
            assert prompt == final["tokens_evaluated"]
        else:
            usage = final["usage"]
            assert obs.finish_reason == final["choices"][0]["finish_reason"]
            assert ended
            assert COMPLETIONS.usage(final) == ServerTimings(
                prompt_n=usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"],
                cache_n=usage["prompt_tokens_details"]["cached_tokens"],
                predicted_n=usage["completion_tokens"],
            )
            assert obs.timings is not None
            assert obs.timings.predicted_n == usage["completion_tokens"]
