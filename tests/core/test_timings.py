"""Tests for proxy.core.timings: what of llama-server's clock is believed, and what no server
can produce (dropped and named), from the parse to the record, ``/stats`` and ``/metrics``."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.core.timings import MAX_TOK_S, ServerTimings, plausible
from tests.conftest import ProxyFactory
from tests.fakes import load_recording, make_timings
from tests.serve.test_accounting import ToyLlama, ask, body_of, toy, wait_record

__all__ = ["toy"]  # the fixture, imported for the test below


class TestFromJson:
    def test_real_timings_are_taken_whole(self) -> None:
        """A real llama-server ``timings`` object (a recorded stream's last event) is read
        whole, and nothing is implausible."""
        body = load_recording("chat_stream").body
        last = [line for line in body.split(b"\n") if b'"timings"' in line][-1]
        t = ServerTimings.from_json(orjson.loads(last.removeprefix(b"data: "))["timings"])
        assert t is not None
        assert None not in (t.prompt_n, t.prompt_ms, t.cache_n, t.predicted_n, t.predicted_ms)
        assert t.implausible == ()
        assert plausible(t) is t

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("prompt_ms", -1.0),
            ("prompt_ms", math.inf),
            ("predicted_ms", "12"),
            ("prompt_n", -3),
            ("cache_n", 2.5),
            ("predicted_n", 2**60),
            ("draft_n", True),
        ],
    )
    def test_a_value_no_server_sends_is_dropped_and_named(self, key: str, value: Any) -> None:
        """A negative, non-finite, fractional, huge or non-numeric value is ``None`` and its
        field named; the other fields are kept."""
        t = ServerTimings.from_json({**make_timings(), key: value})
        assert t is not None
        assert getattr(t, key) is None
        assert t.implausible == (key,)
        assert t.prompt_n is not None or key == "prompt_n"

    def test_absent_fields_are_not_implausible(self) -> None:
        """A field the server did not send is unknown, not implausible."""
        t = ServerTimings.from_json({"predicted_n": 3})
        assert t == ServerTimings(predicted_n=3)


class TestPlausible:
    def test_a_rate_above_any_server_drops_the_duration(self) -> None:
        """1,000 tokens in 1e-300 ms (a rate of 1e306 tok/s), or in 0 ms, drops that
        duration; a fast but possible rate stays."""
        for prompt_ms in (1e-300, 0.0):
            t = plausible(ServerTimings(prompt_n=1000, prompt_ms=prompt_ms))
            assert t is not None
            assert (t.prompt_ms, t.implausible) == (None, ("prompt_ms",))
        fast = ServerTimings(prompt_n=1000, prompt_ms=1000 * 1000.0 / MAX_TOK_S)
        assert plausible(fast) is fast
        t = plausible(ServerTimings(predicted_n=51, predicted_ms=1e-9))
        assert t is not None and t.implausible == ("predicted_ms",)

    def test_more_drafts_accepted_than_drafted(self) -> None:
        """50 drafts accepted of 2 drops the accepted count; 2 of 2 stays."""
        t = plausible(ServerTimings(draft_n=2, draft_n_accepted=50))
        assert t is not None
        assert (t.draft_n, t.draft_n_accepted, t.implausible) == (2, None, ("draft_n_accepted",))
        whole = ServerTimings(draft_n=2, draft_n_accepted=2)
        assert plausible(whole) is whole

    def test_one_token_in_no_time_is_possible(self) -> None:
        """One generated token has no decode step: 0 ms of decode is not implausible."""
        t = ServerTimings(predicted_n=1, predicted_ms=0.0, prompt_n=0, prompt_ms=0.0)
        assert plausible(t) is t


async def test_implausible_timings_never_reach_stats_or_metrics(
    toy: ToyLlama, make_proxy: ProxyFactory
) -> None:
    """A response whose prefill took 1e-300 ms and whose drafts exceed what was drafted: the
    record has those fields null and says ``implausible_timings``; ``/stats`` and the
    Prometheus prefill sum count only the plausible request before it."""
    proxy = await make_proxy(toy.url)
    toy.timings = make_timings(prompt_n=100, prompt_ms=50.0)
    await ask(proxy, body_of([]))
    fine = await wait_record(proxy)
    assert fine.analysis_error is None and fine.prefill_ms == 50.0
    toy.timings = {**make_timings(prompt_n=100, prompt_ms=1e-300), "draft_n": 2}
    toy.timings["draft_n_accepted"] = 50
    await ask(proxy, body_of([]))
    record = await wait_record(proxy, 2)
    assert (record.prefill_ms, record.prefill_tok_s, record.draft_acceptance) == (None, None, None)
    assert record.analysis_error == "implausible_timings:prompt_ms,draft_n_accepted"
    stats = orjson.loads(await (await proxy.admin.get("/stats")).read())
    assert "1e+303" not in orjson.dumps(stats).decode()
    text = (await (await proxy.admin.get("/metrics")).read()).decode()
    sums = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "timing_proxy_prefill_seconds_sum"
    }
    assert sums["timing_proxy_prefill_seconds_sum"] == pytest.approx(0.05)
