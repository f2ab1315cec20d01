"""The arithmetic of ``timing-proxy explain`` (``proxy/core/experiment.py``) on fixed inputs:
the spread, the noise rule, each term's row, and the raw call parser."""

from __future__ import annotations

import pytest

from proxy.core.experiment import (
    NOT_MEASURABLE,
    CacheSample,
    DecodeSample,
    Difference,
    ImageSample,
    SchemaSample,
    ThinkingSample,
    ToolCallSeen,
    cache_term,
    decode_term,
    difference,
    image_term,
    iqr,
    raw_call,
    render_table,
    same_call,
    schema_term,
    thinking_term,
    unavailable,
)


def test_iqr_interpolates_the_quartiles_inclusively() -> None:
    """The spread is q3 - q1 with quartiles interpolated between the ordered values: for
    1..5 the quartiles are 2 and 4; for two values, half their distance; none below two."""
    assert iqr([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(2.0)
    assert iqr([10.0, 30.0]) == pytest.approx(10.0)
    assert iqr([7.0]) is None
    assert iqr([]) is None


def test_difference_holds_median_spread_and_count() -> None:
    """A term's difference is the median of the paired differences, their IQR, and n."""
    diff = difference([100.0, 140.0, 120.0, 400.0])
    assert diff.p50 == pytest.approx(130.0)
    assert diff.spread == pytest.approx(iqr([100.0, 140.0, 120.0, 400.0]))
    assert diff.n == 4
    assert difference([]) == Difference(None, None, 0)


@pytest.mark.parametrize(
    ("values", "measurable"),
    [
        ([100.0, 120.0], True),  # both pairs agree: the median lies outside the spread
        ([100.0, -20.0], False),  # the pairs disagree on the sign
        ([5.0, 5.0, 5.0], True),  # no spread at all, a non-zero median
        ([0.0, 0.0, 0.0], False),  # no difference
        ([50.0], False),  # one pair has no spread
        ([-40.0, 50.0, 10.0, -30.0, 60.0], False),  # a median of 10 within an IQR of 80
    ],
)
def test_the_noise_rule(values: list[float], measurable: bool) -> None:
    """A difference is measurable only when |p50| > IQR, with two pairs at least."""
    assert difference(values).measurable is measurable


def test_one_outlier_pair_does_not_hide_a_clear_difference() -> None:
    """The IQR survives one pair disturbed by a burst of load, which min-max would not."""
    values = [200.0, 210.0, 190.0, 205.0, -900.0]
    assert difference(values).measurable
    assert min(values) < 0 < max(values)


def test_schema_term_measures_beside_the_records_estimate() -> None:
    """Schema prefill: with-tools prefill less without; the estimate is schema tokens at the
    with-tools request's own ms per token, as the record prices it."""
    samples = [
        SchemaSample(with_tools_ms=1100.0, with_tools_prompt_n=550, without_tools_ms=80.0,
                     schema_tokens=500),
        SchemaSample(with_tools_ms=1000.0, with_tools_prompt_n=550, without_tools_ms=60.0,
                     schema_tokens=500),
    ]  # fmt: skip
    term = schema_term(samples)
    assert term.diff.p50 == pytest.approx((1020.0 + 940.0) / 2)
    assert term.diff.measurable
    estimates = [500 * 1100.0 / 550, 500 * 1000.0 / 550]
    row = term.to_dict()
    assert row["estimate_p50_ms"] == pytest.approx(sum(estimates) / 2, abs=1e-3)
    assert row["schema_tokens_p50"] == 500
    assert row["measurable"] is True
    assert "estimates" in term.suggests


def test_schema_term_within_noise_says_not_measurable() -> None:
    """Pairs that disagree on the sign print "not measurable here", still with the estimate."""
    samples = [
        SchemaSample(100.0, 50, 80.0, 5),
        SchemaSample(70.0, 50, 90.0, 5),
    ]
    term = schema_term(samples)
    assert not term.diff.measurable
    assert term.suggests.startswith(NOT_MEASURABLE)


def test_cache_term_is_the_saving_and_its_share_of_the_call() -> None:
    """The free fix: cold less warm prefill, and that saving as a percentage of the cold
    call's prefill plus decode."""
    samples = [
        CacheSample(cold_ms=900.0, warm_ms=100.0, call_ms=2000.0, warm_cached_tokens=500),
        CacheSample(cold_ms=1000.0, warm_ms=120.0, call_ms=2200.0, warm_cached_tokens=500),
    ]
    term = cache_term(samples)
    assert term.diff.p50 == pytest.approx((800.0 + 880.0) / 2)
    shares = [100 * 800.0 / 2000.0, 100 * 880.0 / 2200.0]
    assert term.to_dict()["saving_percent_p50"] == pytest.approx(sum(shares) / 2)
    assert term.to_dict()["warm_cached_tokens_p50"] == 500
    assert "saves" in term.suggests


def _decode(chat: ToolCallSeen | None, raw: ToolCallSeen | None, tokens: tuple[int, int],
            ms: tuple[float, float]) -> DecodeSample:  # fmt: skip
    return DecodeSample(
        chat_call=chat,
        chat_tokens=tokens[0],
        chat_decode_ms=ms[0],
        chat_tok_s=1000 * (tokens[0] - 1) / ms[0],
        raw_call=raw,
        raw_tokens=tokens[1],
        raw_decode_ms=ms[1],
        raw_tok_s=1000 * (tokens[1] - 1) / ms[1],
    )


CALL = ToolCallSeen("get_weather", {"city": "Paris"})


def test_decode_term_compares_only_matching_calls() -> None:
    """The tool path's decode: chat decode ms less raw over the pairs with the same call and
    token count; a pair that differs is left out and counted."""
    other = ToolCallSeen("get_weather", {"city": "Rome"})
    samples = [
        _decode(CALL, CALL, (30, 30), (3000.0, 2000.0)),
        _decode(CALL, CALL, (30, 30), (3100.0, 2050.0)),
        _decode(CALL, other, (30, 30), (3000.0, 1000.0)),
        _decode(CALL, CALL, (30, 28), (3000.0, 1000.0)),
    ]
    term = decode_term(samples)
    assert term.diff.n == 2
    assert term.diff.p50 == pytest.approx((1000.0 + 1050.0) / 2)
    row = term.to_dict()
    assert row["matching"] == 2
    assert row["pairs"] == 4
    assert row["chat_tok_s_p50"] == pytest.approx(
        (1000 * 29 / 3000.0 + 1000 * 29 / 3100.0) / 2, abs=1e-3
    )
    assert "2 pair(s) differed" in term.suggests
    assert "slows decode" in term.suggests


def test_decode_term_with_no_matching_call_reports_no_difference() -> None:
    """When the raw completion wrote another call in every pair, no difference is given."""
    term = decode_term([_decode(CALL, None, (30, 30), (3000.0, 2000.0))])
    assert "another call" in term.suggests
    no_chat = decode_term([_decode(None, CALL, (30, 30), (3000.0, 2000.0))])
    assert "no tool call through Chat Completions in 1 of 1" in no_chat.suggests
    assert term.diff.p50 is None
    assert term.diff.n == 0
    assert term.suggests.startswith("not compared")
    assert term.to_dict()["all_raw_tok_s_p50"] is not None


def test_decode_term_equal_rates_point_at_the_tokens() -> None:
    """Decode within the noise on both paths says the slower call is its tokens."""
    samples = [
        _decode(CALL, CALL, (30, 30), (3000.0, 3050.0)),
        _decode(CALL, CALL, (30, 30), (3050.0, 3000.0)),
    ]
    term = decode_term(samples)
    assert not term.diff.measurable
    assert term.suggests.startswith(NOT_MEASURABLE)
    assert "its tokens" in term.suggests


def test_thinking_term_counts_ms_and_tokens_before_the_call() -> None:
    """Thinking on less off, before the first call; a pair where thinking on never reached
    the call is a lower bound and said so."""
    samples = [
        ThinkingSample(on_ms=4000.0, on_tokens=48, on_called=False, off_ms=200.0,
                       off_tokens=3, off_called=True),
        ThinkingSample(on_ms=3000.0, on_tokens=40, on_called=True, off_ms=250.0,
                       off_tokens=3, off_called=True),
    ]  # fmt: skip
    term = thinking_term(samples)
    assert term.diff.p50 == pytest.approx((3800.0 + 2750.0) / 2)
    assert term.to_dict()["tokens_before_call_p50"] == pytest.approx((45 + 37) / 2)
    assert term.to_dict()["on_without_call"] == 1
    assert "lower bound" in term.suggests
    assert "enable_thinking" in term.suggests


def test_thinking_term_needs_a_call_without_thinking() -> None:
    """A pair whose request without thinking made no call has no baseline: left out; with
    none left, no difference is given."""
    no_baseline = ThinkingSample(4000.0, 48, False, 9000.0, 48, False)
    called = ThinkingSample(3000.0, 40, True, 250.0, 3, True)
    assert thinking_term([no_baseline, called, called]).diff.n == 2
    term = thinking_term([no_baseline])
    assert term.diff.p50 is None
    assert term.suggests.startswith("not compared")


def test_image_term_is_prefill_with_less_without() -> None:
    """Image: prefill with the image less without it, with the image's tokens."""
    term = image_term([ImageSample(700.0, 100.0, 260), ImageSample(650.0, 90.0, 260)])
    assert term.diff.p50 == pytest.approx((600.0 + 560.0) / 2)
    assert term.to_dict()["image_tokens_p50"] == 260


def test_raw_call_reads_the_first_call_object() -> None:
    """A raw completion's call: the first JSON object with a name and arguments, after any
    markup; arguments given as a string are parsed; a template placeholder is no call."""
    text = 'junk <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    assert raw_call(text) == CALL
    assert raw_call('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}') == CALL
    assert raw_call('<tool_call>\n{"name": "move_arm", "arguments": <args-json-object>\n') is None
    assert raw_call("no call here") is None


def test_same_call_needs_name_and_parsed_arguments() -> None:
    """Calls match on the name and the parsed arguments (key order and spacing aside);
    arguments that were not JSON never match."""
    wire = ToolCallSeen.from_wire("get_weather", '{ "city" :"Paris"}')
    assert same_call(wire, CALL)
    assert not same_call(ToolCallSeen.from_wire("get_weather", "{not json"), CALL)
    assert not same_call(None, CALL)
    assert not same_call(ToolCallSeen("other", {"city": "Paris"}), CALL)


def test_render_table_has_one_row_per_term() -> None:
    """The table: a header, then term, ms p50, IQR, n and what it suggests per term; an
    unmeasured term shows dashes and its reason."""
    pairs = [CacheSample(900.0, 100.0, 2000.0, 500), CacheSample(1000.0, 120.0, 2200.0, 500)]
    rows = [cache_term(pairs), unavailable("image", "no projector")]
    lines = render_table(rows).splitlines()
    assert lines[0].split()[:4] == ["term", "ms", "p50", "IQR"]
    assert lines[1].startswith("free fix (cache warm)")
    assert "840" in lines[1]
    assert lines[2].split()[:4] == ["image", "-", "-", "0"]
    assert lines[2].endswith("no projector")
