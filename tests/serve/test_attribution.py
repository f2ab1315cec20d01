"""Prefix attribution through the proxy, against the toy llama-server of test_accounting.

The toy renders and tokenizes as tests/serve/test_accounting.py describes; its answer's ``timings``
are set per request so that the prompt it says it evaluated is the one the proxy rendered.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.core.request import analyse_request
from proxy.serve.attribution import (
    UNSUPPORTED_RETRY_S,
    Attributor,
    ImagesInPrompt,
    LookupUnsupported,
)
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import FakeClock, make_timings
from tests.serve.test_accounting import (
    APPLY_TEMPLATE,
    READ_FILE,
    RUN_SHELL,
    SYSTEM,
    TOKENIZE,
    WRITE_FILE,
    ToyLlama,
    ask,
    body_of,
    input_tokens,
    render,
    settle,
    toy,
    toy_pieces,
    wait_record,
)

__all__ = ["toy"]  # the fixture, imported for the tests below


async def start(make_proxy: ProxyFactory, toy: ToyLlama, **privacy: Any) -> ProxyUnderTest:
    """The proxy in front of the toy with attribution on (schema accounting too)."""
    return await make_proxy(
        toy.url, accounting={"enabled": True, "attribution": True}, privacy=privacy
    )


def evaluated(toy: ToyLlama, body: dict[str, Any], cache_n: int) -> None:
    """The toy's next answer says it evaluated ``body``'s prompt, ``cache_n`` of it cached,
    at 2 ms per prompt token."""
    total = input_tokens(body)
    toy.timings = make_timings(
        prompt_n=total - cache_n, prompt_ms=2.0 * (total - cache_n), cache_n=cache_n
    )


async def send(
    proxy: ProxyUnderTest, toy: ToyLlama, body: dict[str, Any], cache_n: int, count: int
) -> Any:
    """Send ``body`` (the toy evaluating it with ``cache_n`` cached); its record, the
    ``count``-th."""
    evaluated(toy, body, cache_n)
    await ask(proxy, body)
    return await wait_record(proxy, count)


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> int:
    """The first token (BOS counted) where the toy's renderings of ``a`` and ``b`` differ."""
    pa, pb = toy_pieces(render(a)), toy_pieces(render(b))
    same = 0
    while same < min(len(pa), len(pb)) and pa[same] == pb[same]:
        same += 1
    return 1 + same


def clocked(second: int, user: str = "Status?") -> dict[str, Any]:
    """A chat request with tools whose system prompt holds a clock."""
    clock = f"{SYSTEM} Time: 12:00:{second:02d}. Be brief."
    return body_of([READ_FILE, WRITE_FILE], system=clock, user=user)


def repeated_after(a: dict[str, Any], b: dict[str, Any]) -> int:
    """The toy tokens of ``a``'s rendering after the one where it first differs from ``b``,
    when ``b`` differs from ``a`` in that one token only (a clock)."""
    return len(toy_pieces(render(a))) - first_difference(a, b)


class TestAttribution:
    async def test_clock_in_the_system_prompt(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A clock in the system prompt: the second call is a rewrite at messages[0].content,
        diverging where the renderings' tokens first differ, losing what the first prompt
        had after the clock and the second repeats (at the request's own rate while no
        reference rate is known), with the system-prompt cause and its fix in /stats."""
        proxy = await start(make_proxy, toy)
        first = await send(proxy, toy, clocked(1), 0, 1)
        at = first_difference(clocked(1), clocked(2))
        second = await send(proxy, toy, clocked(2), at, 2)
        assert first.prefix_kind == "cold" and first.prefill_cause is None
        total = input_tokens(clocked(2))
        assert (second.prefix_kind, second.diverged_at, second.diverged_section) == (
            "rewrite",
            at,
            "messages[0].content",
        )
        assert second.reusable_tokens == at
        assert second.cache_lost_tokens == 0
        assert second.diverged_cost_ms == pytest.approx((total - at) * 2.0)
        assert second.prefill_cause == "system_prompt_changed"
        lost = repeated_after(clocked(1), clocked(2))
        assert lost >= 16
        assert second.prefill_lost_tokens == lost
        assert second.prefill_lost_ms == pytest.approx(lost * 2.0)
        assert (second.conversation, second.turn) == (first.conversation, 2)
        stats = orjson.loads(await (await proxy.admin.get("/stats")).read())
        top = stats["cache"]["findings"][0]
        assert (top["cause"], top["section"], top["requests"]) == (
            "system_prompt_changed",
            "messages[0].content",
            1,
        )
        assert (top["lost_tokens"], top["lost_ms"]) == (lost, pytest.approx(lost * 2.0))
        assert "system prompt" in top["fix"]
        assert stats["conversations"][first.conversation]["turns"] == 2

    async def test_independent_questions_on_a_shared_prefix_blame_nothing(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """One-shot questions sharing the system prompt and the tools, the server reusing
        the whole shared prefix: each is a branch of its own conversation, no cause, no
        loss, and /stats has no finding."""
        proxy = await start(make_proxy, toy)
        questions = ["Show me /etc/hosts.", "List the branches.", "What changed today?"]
        bodies = [body_of([READ_FILE, WRITE_FILE], user=q) for q in questions]
        records = [await send(proxy, toy, bodies[0], 0, 1)]
        for i, body in enumerate(bodies[1:], start=2):
            shared = first_difference(bodies[0], body)
            records.append(await send(proxy, toy, body, shared, i))
        assert [r.prefix_kind for r in records] == ["cold", "branch", "branch"]
        assert [r.prefill_cause for r in records] == [None, None, None]
        assert [r.prefill_lost_ms for r in records] == [None, None, None]
        assert len({r.conversation for r in records}) == 3
        assert all(r.attribution_error is None for r in records)
        stats = orjson.loads(await (await proxy.admin.get("/stats")).read())
        assert stats["cache"]["findings"] == []

    async def test_reordered_tools_name_the_first_moved_tool(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Tools sent in another order: a rewrite at the first tool that moved."""
        proxy = await start(make_proxy, toy)
        a = body_of([READ_FILE, WRITE_FILE, RUN_SHELL])
        b = body_of([READ_FILE, RUN_SHELL, WRITE_FILE])
        await send(proxy, toy, a, 0, 1)
        second = await send(proxy, toy, b, 0, 2)
        assert (second.prefix_kind, second.diverged_section, second.prefill_cause) == (
            "rewrite",
            "tools[1]:run_shell",
            "tools_changed",
        )
        assert second.diverged_at == first_difference(a, b)

    async def test_next_turn_extends_and_a_repeat_is_a_retry(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A next turn extends the previous prompt (no cause); sending it again is a retry in
        the same turn, every token but the last reusable."""
        proxy = await start(make_proxy, toy)
        one = body_of([READ_FILE])
        two = {
            **one,
            "messages": [
                *one["messages"],
                {"role": "assistant", "content": "Here it is."},
                {"role": "user", "content": "And /etc/passwd?"},
            ],
        }
        first = await send(proxy, toy, one, 0, 1)
        second = await send(proxy, toy, two, input_tokens(one) - 1, 2)
        third = await send(proxy, toy, two, input_tokens(two) - 1, 3)
        assert (second.prefix_kind, second.prefill_cause, second.turn) == ("extends", None, 2)
        assert second.conversation == first.conversation
        assert (third.prefix_kind, third.turn, third.cache_lost_tokens) == ("retry", 2, 0)
        assert third.reusable_tokens == input_tokens(two) - 1

    async def test_cache_prompt_false(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """cache_prompt false on a repeat: everything reusable was lost, and said why."""
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE])
        await send(proxy, toy, body, 0, 1)
        again = await send(proxy, toy, {**body, "cache_prompt": False}, 0, 2)
        assert again.cache_lost_tokens == again.reusable_tokens == input_tokens(body) - 1
        assert again.prefill_cause == "cache_prompt_off"

    async def test_renderings_are_cached_by_content(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """The same prompt twice is rendered and tokenized once (plus one BOS probe)."""
        proxy = await start(make_proxy, toy)
        body = body_of([])
        await send(proxy, toy, body, 0, 1)
        await send(proxy, toy, body, 0, 2)
        await settle(toy)
        assert toy.calls[APPLY_TEMPLATE] == 1
        assert [b.get("with_pieces", False) for b in toy.bodies[TOKENIZE]] == [False, True]

    async def test_a_rendering_that_is_not_the_evaluated_prompt_attributes_nothing(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """When the server says it evaluated another number of tokens than the rendering
        holds, no position is trusted: the fields stay null, with the reason."""
        proxy = await start(make_proxy, toy)
        toy.timings = make_timings(prompt_n=3, cache_n=0)
        await ask(proxy, body_of([]))
        record = await wait_record(proxy)
        assert record.prefix_kind is None and record.diverged_at is None
        assert record.attribution_error == "rendered_prompt_differs"

    async def test_text_only_when_asked(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """By default a record names the section, never the text; with show_diff_text the
        80 characters on each side of the change are shown."""
        quiet = await start(make_proxy, toy)
        await send(quiet, toy, clocked(1), 0, 1)
        assert (await send(quiet, toy, clocked(2), 0, 2)).diverged_text is None
        shown = await start(make_proxy, toy, show_diff_text=True)
        await send(shown, toy, clocked(1), 0, 1)
        record = await send(shown, toy, clocked(2), 0, 2)
        assert record.diverged_text is not None
        assert record.diverged_text["after"].startswith(" 12:00:02. Be brief.")
        assert record.prefill_cause == "system_prompt_changed"
        assert record.diverged_text["before"].endswith(f"{SYSTEM} Time:")

    async def test_explicit_conversation_id(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """An agent that names its conversation (``user``) is grouped by that name (as sent
        with ``[privacy] raw_conversation_ids``; tests/serve/test_faults_secrets.py: hashed)."""
        proxy = await start(make_proxy, toy, raw_conversation_ids=True)
        first = await send(proxy, toy, {**clocked(1), "user": "arm-1"}, 0, 1)
        second = await send(proxy, toy, {**body_of([READ_FILE]), "user": "arm-1"}, 0, 2)
        assert [(r.conversation, r.turn) for r in (first, second)] == [("arm-1", 1), ("arm-1", 2)]


async def test_conversation_id_in_a_header(toy: ToyLlama, make_proxy: ProxyFactory) -> None:
    """The configured header names the conversation, before the body's ``user``."""
    proxy = await start(make_proxy, toy)
    body = {**clocked(1), "user": "from-body"}
    evaluated(toy, body, 0)
    resp = await proxy.client.post(
        "/v1/chat/completions",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json", "X-Conversation-Id": "arm-7"},
    )
    await resp.read()
    record = await wait_record(proxy)
    assert (record.conversation, record.turn) == ("arm-7", 1)


async def test_a_prompt_with_images_is_not_attributed_and_says_why() -> None:
    """/tokenize reads an image's media marker as text, so the prompt positions after an
    image are not the server's: such a prompt is not attributed (no look-up is made) and
    the failure names ImagesInPrompt, which the record carries as attribution_error."""

    async def post(path: str, body: dict[str, Any]) -> Any:
        raise AssertionError(f"no look-up expected, got {path}")

    attributor = Attributor(post)
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ],
        "max_tokens": 4,
    }
    facts = analyse_request("POST", "/v1/chat/completions", orjson.dumps(body))
    task = attributor.begin(facts)
    assert task is not None
    with pytest.raises(ImagesInPrompt):
        await task


async def test_an_upstream_without_the_lookups_is_not_asked_again_for_a_while() -> None:
    """An upstream that answers /tokenize or /apply-template with 404 (not llama-server) is
    asked once: for UNSUPPORTED_RETRY_S every later prompt gets that refusal at once (the
    record's attribution_error), with no request; after it, the look-ups are tried again."""
    posts: list[str] = []
    clock = FakeClock(1000.0)

    async def post(path: str, body: dict[str, Any]) -> Any:
        posts.append(path)
        raise LookupUnsupported(f"{path}: 404")

    attributor = Attributor(post, clock=clock)

    def facts(n: int) -> Any:
        body = {"messages": [{"role": "user", "content": f"turn {n}"}], "max_tokens": 4}
        return analyse_request("POST", "/v1/chat/completions", orjson.dumps(body))

    first = attributor.begin(facts(0))
    assert first is not None
    with pytest.raises(LookupUnsupported):
        await first
    asked = len(posts)
    assert asked >= 1
    for n in range(1, 20):
        refused = attributor.begin(facts(n))
        assert refused is not None and refused.done()
        with pytest.raises(LookupUnsupported):
            await refused
    assert len(posts) == asked, "no look-up while the refusal stands"
    clock.advance(UNSUPPORTED_RETRY_S + 1)
    again = attributor.begin(facts(99))
    assert again is not None
    with pytest.raises(LookupUnsupported):
        await again
    assert len(posts) > asked
