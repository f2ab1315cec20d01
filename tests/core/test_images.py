"""Image-token accounting: the image parts of each API, the bodies without them, the
arithmetic of where images sit and what they cost, and the look-ups through the proxy
against a toy vision llama-server whose every count the test knows."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.dialects import CHAT_COMPLETIONS, MESSAGES, RESPONSES
from proxy.core.dialects.base import ImagePart
from proxy.core.images import (
    canonical_body,
    image_cost,
    image_spans,
    split_on_marker,
    without_images,
)
from proxy.core.record import Record
from tests.conftest import ProxyFactory, ProxyUnderTest

# -- the image parts of each API ----------------------------------------------------------------


def chat_image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def messages_image(data: str, media_type: str | None = "image/png") -> dict[str, Any]:
    source: dict[str, Any] = {"type": "base64", "data": data}
    if media_type is not None:
        source["media_type"] = media_type
    return {"type": "image", "source": source}


def urls(parts: list[ImagePart]) -> list[str]:
    return [p.url for p in parts]


def chat_form_urls(form: dict[str, Any]) -> list[str]:
    """The image URLs of a Chat Completions body, in message and part order."""
    out: list[str] = []
    for message in form["messages"]:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            if part.get("type") == "image_url":
                out.append(part["image_url"]["url"])
    return out


class TestFindingParts:
    def test_chat_completions_image_url_parts(self) -> None:
        """Chat Completions: ``image_url`` parts of every message's content list, in order,
        with their paths; text parts and string contents hold none."""
        body = {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, chat_image("u1")]},
                {"role": "tool", "content": [chat_image("u2"), chat_image("u3")]},
            ]
        }
        parts = CHAT_COMPLETIONS.image_parts(body)  # type: ignore[misc]
        assert urls(parts) == ["u1", "u2", "u3"]
        assert [p.path for p in parts] == [
            ("messages", 1, "content", 1),
            ("messages", 2, "content", 0),
            ("messages", 2, "content", 1),
        ]

    def test_responses_input_image_parts(self) -> None:
        """Responses: ``input_image`` parts of user/system/developer messages and of
        ``function_call_output`` outputs, in input order; assistant output text holds none."""
        body = {
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": "r1"}]},
                {"type": "message", "role": "assistant", "content": "ok"},
                {"type": "function_call", "call_id": "c", "name": "look", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [
                        {"type": "input_text", "text": "frame"},
                        {"type": "input_image", "image_url": "r2"},
                    ],
                },
            ]
        }
        parts = RESPONSES.image_parts(body)  # type: ignore[misc]
        assert urls(parts) == ["r1", "r2"]
        assert parts[1].path == ("input", 3, "output", 1)
        assert {p.text_type for p in parts} == {"input_text"}

    def test_messages_image_blocks_in_the_servers_order(self) -> None:
        """Messages: a message's ``tool_result`` images come before its own image blocks (the
        server makes each tool result a message of its own, before the rest); a base64 source
        becomes a data URL (``image/jpeg`` when no media type is given), a url source stays."""
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        messages_image("AAA", None),
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [messages_image("BBB")],
                        },
                        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}},
                    ],
                }
            ]
        }
        parts = MESSAGES.image_parts(body)  # type: ignore[misc]
        assert urls(parts) == [
            "data:image/png;base64,BBB",
            "data:image/jpeg;base64,AAA",
            "http://x/y.png",
        ]

    @pytest.mark.parametrize("dialect", [CHAT_COMPLETIONS, RESPONSES, MESSAGES])
    def test_no_images_no_parts(self, dialect: Any) -> None:
        """A body without images (or of another shape) has no image parts."""
        assert dialect.image_parts({"messages": "x", "input": 3}) == []
        assert dialect.image_parts({"messages": [{"role": "user", "content": "hi"}]}) == []


class TestChatForms:
    def test_responses_chat_form_keeps_images_in_place(self) -> None:
        """The Responses request's Chat Completions form carries its images as ``image_url``
        parts between its text parts, as llama-server converts them."""
        body = {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_image", "image_url": "r1"},
                        {"type": "input_text", "text": "b"},
                    ],
                }
            ]
        }
        form = RESPONSES.chat_form(body)  # type: ignore[misc]
        assert form["messages"][0]["content"] == [
            {"type": "text", "text": "a"},
            chat_image("r1"),
            {"type": "text", "text": "b"},
        ]

    def test_messages_chat_form_keeps_images_in_place(self) -> None:
        """A Messages tool result with an image becomes a tool message of chat parts; the
        turn's own image stays between its text blocks."""
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [messages_image("B")],
                        },
                        {"type": "text", "text": "a"},
                        messages_image("A"),
                    ],
                }
            ]
        }
        tool, user = MESSAGES.chat_form(body)["messages"]  # type: ignore[misc]
        assert tool["content"] == [chat_image("data:image/png;base64,B")]
        assert user["content"] == [
            {"type": "text", "text": "a"},
            chat_image("data:image/png;base64,A"),
        ]


# -- bodies without images ----------------------------------------------------------------------

EMPTY_TEXT = {"type": "text", "text": ""}
_TEXT = st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=5))
_IMAGE = st.builds(chat_image, st.text(min_size=1, max_size=8))
_CONTENT = st.one_of(st.text(max_size=5), st.lists(st.one_of(_TEXT, _IMAGE), max_size=5))
_CHAT_BODIES = st.builds(
    lambda contents: {"messages": [{"role": "user", "content": c} for c in contents]},
    st.lists(_CONTENT, max_size=4),
)


class TestWithoutImages:
    @given(_CHAT_BODIES)
    def test_removing_all_leaves_none_and_the_rest(self, body: dict[str, Any]) -> None:
        """Without its images a body has no image parts, keeps its other parts in order and
        leaves no content list empty that had parts; the body itself is unchanged."""
        before = orjson.dumps(body)
        parts = CHAT_COMPLETIONS.image_parts(body)  # type: ignore[misc]
        bare = without_images(body, parts)
        assert orjson.dumps(body) == before
        assert CHAT_COMPLETIONS.image_parts(bare) == []  # type: ignore[misc]
        for old, new in zip(body["messages"], bare["messages"], strict=True):
            if not isinstance(old["content"], list):
                assert new["content"] == old["content"]
                continue
            texts = [p for p in old["content"] if p["type"] == "text"]
            had_images = len(texts) < len(old["content"])
            assert new["content"] == (texts if texts or not had_images else [EMPTY_TEXT])

    @given(_CHAT_BODIES, st.data())
    def test_keeping_some_keeps_exactly_those(self, body: dict[str, Any], data: Any) -> None:
        """Removing all but some images leaves exactly those, in their order."""
        parts = CHAT_COMPLETIONS.image_parts(body)  # type: ignore[misc]
        keep = data.draw(
            st.sets(st.integers(0, max(0, len(parts) - 1))) if parts else st.just(set())
        )
        kept = without_images(body, parts, keep=sorted(keep))
        assert urls(CHAT_COMPLETIONS.image_parts(kept)) == [  # type: ignore[misc]
            p.url for i, p in enumerate(parts) if i in keep
        ]

    def test_messages_turn_with_only_an_image_keeps_an_empty_text(self) -> None:
        """A Messages turn whose only block was the image keeps an empty text block: the
        server would drop a turn with no blocks at all."""
        body = {"messages": [{"role": "user", "content": [messages_image("A")]}]}
        bare = without_images(body, MESSAGES.image_parts(body))  # type: ignore[misc]
        assert bare["messages"][0]["content"] == [{"type": "text", "text": ""}]

    def test_tool_result_images_removed_from_the_inside(self) -> None:
        """An image inside a Messages tool result is removed from the result's content."""
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "text", "text": "seen"}, messages_image("B")],
                        },
                        messages_image("A"),
                    ],
                }
            ]
        }
        parts = MESSAGES.image_parts(body)  # type: ignore[misc]
        bare = without_images(body, parts, keep=[1])
        assert bare["messages"][0]["content"] == [
            {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": [{"type": "text", "text": "seen"}],
            },
            messages_image("A"),
        ]


# -- where images sit, and what they cost -------------------------------------------------------


class TestArithmetic:
    def test_spans_follow_the_text_pieces(self) -> None:
        """Each block starts after BOS, the text pieces before it and the blocks before it."""
        assert image_spans(1, [3, 2, 4], [10, 20]) == [(4, 14), (16, 36)]

    def test_spans_that_do_not_fit(self) -> None:
        """Pieces that are not one more than the blocks, or an empty block: no spans."""
        assert image_spans(1, [3, 2], [10, 20]) is None
        assert image_spans(1, [3, 2], [0]) is None

    def test_split_on_marker(self) -> None:
        """The rendered text cut at the marker: one more piece than markers."""
        assert split_on_marker("a<m>b<m>", "<m>") == ["a", "b", ""]

    def test_cold_request_pays_every_block_token(self) -> None:
        """Nothing cached: every block token is prefilled at the request's own rate."""
        cost = image_cost([(4, 14), (16, 36)], 32, 0, 40, 80.0)
        assert (cost.cached, cost.prefilled_tokens, cost.prefill_ms) == (0, 30, 60.0)

    def test_cache_past_the_images_costs_nothing(self) -> None:
        """The cache reaching past every block: all cached, 0 ms, even without timings."""
        cost = image_cost([(4, 14), (16, 36)], 32, 39, 1, None)
        assert (cost.cached, cost.prefilled_tokens, cost.prefill_ms) == (2, 0, 0.0)

    def test_cache_between_images(self) -> None:
        """The cache ending between two images: the first cached, the second paid."""
        cost = image_cost([(4, 14), (16, 36)], 32, 15, 25, 50.0)
        assert (cost.cached, cost.prefilled_tokens, cost.prefill_ms) == (1, 20, 40.0)

    def test_cache_at_the_chunk_start(self) -> None:
        """The cache ending on the block's begin token (a different image after the same
        text): the rest of the block is paid, the image not cached."""
        cost = image_cost([(4, 14)], 11, 5, 20, 20.0)
        assert (cost.cached, cost.prefilled_tokens, cost.prefill_ms) == (0, 9, 9.0)

    def test_no_position(self) -> None:
        """Without spans the cost is known only when nothing was cached."""
        assert image_cost(None, 30, 0, 40, 80.0).prefill_ms == 60.0
        assert image_cost(None, 30, 5, 40, 80.0).prefill_ms is None
        assert image_cost([(1, 2)], 1, None, 40, 80.0).cached is None

    def test_paid_without_timings_is_unknown(self) -> None:
        """The Messages API sends no prefill time: a paid image's milliseconds are unknown."""
        cost = image_cost([(4, 14)], 10, 0, 20, None)
        assert (cost.prefilled_tokens, cost.prefill_ms) == (10, None)

    @given(
        st.lists(st.tuples(st.integers(0, 5), st.integers(1, 30)), min_size=1, max_size=5),
        st.integers(0, 200),
    )
    def test_cost_properties(self, layout: list[tuple[int, int]], cache_n: int) -> None:
        """For any layout and cache reach: the prefilled tokens are the block tokens at or
        beyond ``cache_n``; a cached image's block ends within the cache; more cache never
        costs more."""
        spans = image_spans(1, [gap for gap, _ in layout] + [3], [size for _, size in layout])
        assert spans is not None
        cost = image_cost(spans, None, cache_n, 100, 100.0)
        tokens = {p for start, end in spans for p in range(start, end)}
        assert cost.prefilled_tokens == sum(1 for p in tokens if p >= cache_n)
        assert cost.cached == sum(1 for _, end in spans if end <= cache_n)
        more = image_cost(spans, None, cache_n + 1, 100, 100.0)
        assert more.prefilled_tokens is not None and cost.prefilled_tokens is not None
        assert more.prefilled_tokens <= cost.prefilled_tokens


# -- through the proxy, against a toy vision server ---------------------------------------------

MARKER = "<__media_toy__>"
BOS = 1


def block_of(url: str) -> int:
    """The toy projector's block for an image: it depends on the image, as a real dynamic
    resolution projector's does."""
    return 5 + len(url) % 7


def toy_render(body: dict[str, Any]) -> str:
    """The toy template: each message as ``<role> text``, images as the marker."""
    out = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, list):
            content = "".join(
                MARKER if p["type"] == "image_url" else p.get("text", "") for p in content
            )
        out.append(f"<{message['role']}> {content}\n")
    return "".join(out) + "<assistant>"


def toy_tokens(text: str) -> int:
    return len(text.split())


def toy_count(body: dict[str, Any]) -> int:
    """BOS, the text pieces between markers, and each image's block."""
    pieces = toy_render(body).split(MARKER)
    return BOS + sum(toy_tokens(p) for p in pieces) + sum(block_of(u) for u in chat_form_urls(body))


class ToyVision:
    """A toy llama-server with a projector: counting, template, tokenizer, props, chat."""

    def __init__(self, cache_n: int = 0, fail: str | None = None) -> None:
        self.cache_n = cache_n
        self.fail = fail
        self.marker = MARKER
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions/input_tokens", self._count)
        self.app.router.add_post("/apply-template", self._template)
        self.app.router.add_post("/tokenize", self._tokenize)
        self.app.router.add_get("/props", self._props)
        self.app.router.add_post("/v1/chat/completions", self._chat)

    async def _count(self, request: web.Request) -> web.Response:
        if self.fail == "count":
            return web.json_response({"error": {"code": 500}}, status=500)
        return web.json_response({"input_tokens": toy_count(await request.json())})

    async def _template(self, request: web.Request) -> web.Response:
        return web.json_response({"prompt": toy_render(await request.json())})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        n = toy_tokens(body["content"]) + (BOS if body.get("add_special") else 0)
        return web.json_response({"tokens": list(range(n))})

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response({"media_marker": self.marker})

    async def _chat(self, request: web.Request) -> web.Response:
        total = toy_count(await request.json())
        timings = {
            "prompt_n": total - self.cache_n,
            "prompt_ms": 2.0 * (total - self.cache_n),
            "cache_n": self.cache_n,
            "predicted_n": 1,
            "predicted_ms": 1.0,
        }
        return web.json_response(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "timings": timings,
            }
        )


async def run(
    make_proxy: ProxyFactory, aiohttp_server: Any, toy: ToyVision, body: dict[str, Any]
) -> Record:
    server = await aiohttp_server(toy.app)
    proxy: ProxyUnderTest = await make_proxy(
        str(server.make_url("")).rstrip("/"), accounting={"enabled": True, "attribution": False}
    )
    resp = await proxy.client.post(
        "/v1/chat/completions",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 200
    await resp.read()
    deadline = time.monotonic() + 5
    while not proxy.captured.records:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    return proxy.captured.records[0]


def two_images() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "you see through a camera"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "left frame"},
                    chat_image("data:image/png;base64,AAAA"),
                    {"type": "text", "text": "and right frame"},
                    chat_image("data:image/png;base64,BBBBBBB"),
                ],
            },
        ]
    }


def toy_spans(body: dict[str, Any]) -> list[tuple[int, int]]:
    """Where the toy puts each image's block (computed from its own rules)."""
    pieces = toy_render(body).split(MARKER)
    spans, position = [], BOS
    for piece, url in zip(pieces, chat_form_urls(body), strict=False):
        position += toy_tokens(piece)
        spans.append((position, position + block_of(url)))
        position += block_of(url)
    return spans


class TestThroughTheProxy:
    async def test_counts_and_a_cold_cost(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """Two images, nothing cached: the total and per-image counts are the toy's own
        differences, and every block token is priced at the request's rate."""
        body = two_images()
        record = await run(make_proxy, aiohttp_server, ToyVision(), body)
        full = toy_count(body)
        parts = CHAT_COMPLETIONS.image_parts(body)  # type: ignore[misc]
        assert record.images == 2
        assert record.image_tokens == full - toy_count(without_images(body, parts))
        assert record.image_tokens_each == [
            full - toy_count(without_images(body, parts, keep=[1])),
            full - toy_count(without_images(body, parts, keep=[0])),
        ]
        blocks = sum(end - start for start, end in toy_spans(body))
        assert (record.images_cached, record.image_prefill_ms) == (0, 2.0 * blocks)
        assert record.accounting_error is None

    async def test_cache_between_the_images(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """The cache ending between the two blocks: the first image cached, the second's
        block paid, so the positions the proxy found are the toy's."""
        body = two_images()
        first, second = toy_spans(body)
        toy = ToyVision(cache_n=first[1] + 1)
        record = await run(make_proxy, aiohttp_server, toy, body)
        assert record.images_cached == 1
        assert record.image_prefill_ms == 2.0 * (second[1] - second[0])

    async def test_a_failed_count_leaves_nulls_and_a_reason(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """The counting endpoint failing: the image count stands, the rest is null, and the
        record says why (``images: ``)."""
        record = await run(make_proxy, aiohttp_server, ToyVision(fail="count"), two_images())
        assert record.images == 2
        assert (record.image_tokens, record.images_cached, record.image_prefill_ms) == (
            None,
            None,
            None,
        )
        assert record.accounting_error is not None
        assert record.accounting_error.startswith("images: ")

    async def test_an_unknown_marker_gives_no_position(
        self, make_proxy: ProxyFactory, aiohttp_server: Any
    ) -> None:
        """A marker that is not in the rendering (another server's): the counts stand, a
        cached prompt's image cost is unknown, and the record says the position is unknown."""
        toy = ToyVision(cache_n=3)
        toy.marker = "<__media_other__>"
        record = await run(make_proxy, aiohttp_server, toy, two_images())
        assert record.image_tokens is not None
        assert (record.images_cached, record.image_prefill_ms) == (None, None)
        assert record.accounting_error is not None
        assert "images: position unknown" in record.accounting_error

    def test_canonical_body_is_one_turn(self) -> None:
        """The per-image count's body: one user turn holding only that image."""
        assert chat_form_urls(canonical_body("u")) == ["u"]
