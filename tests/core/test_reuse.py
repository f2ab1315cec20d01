"""Tests for proxy.core.reuse: the earlier prompt's tokens after a change that the new prompt
repeats, against a naive count over token lists."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.reuse import RUN, repeated_tokens
from tests.corpus.truth import naive_repeated


def as_bytes(ids: list[int]) -> bytes:
    return array("I", ids).tobytes()


def naive(
    earlier: list[int], new: list[int], start: int, stop: int, content: list[int] | None = None
) -> int:
    """The corpus truth's naive search (every place tried) over ``[start, stop)``."""
    return naive_repeated(earlier, new, start, stop, own=content)


@st.composite
def edited(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    """An earlier prompt, a new one made of its blocks moved, dropped, changed or kept, and
    the first token where they may differ."""
    earlier = draw(st.lists(st.integers(0, 40), min_size=0, max_size=120))
    blocks = []
    at = 0
    while at < len(earlier):
        size = draw(st.integers(1, 40))
        blocks.append(earlier[at : at + size])
        at += size
    new: list[int] = []
    for block in draw(st.permutations(blocks)):
        action = draw(st.sampled_from(["keep", "keep", "drop", "change"]))
        if action == "keep":
            new += block
        elif action == "change":
            new += draw(st.lists(st.integers(0, 40), max_size=30))
    start = draw(st.integers(0, min(len(earlier), len(new))))
    return earlier, new, start


@given(edited())
def test_equals_the_naive_count(case: tuple[list[int], list[int], int]) -> None:
    """Whatever was moved, dropped or changed, the count equals marking every earlier token
    inside a repeated run of ``RUN`` tokens."""
    earlier, new, start = case
    got = repeated_tokens(as_bytes(earlier), as_bytes(new), start, len(earlier))
    assert got == naive(earlier, new, start, len(earlier))


def test_a_moved_block_is_repeated() -> None:
    """Two blocks swapped after the change point are both repeated."""
    a, b = list(range(100, 130)), list(range(200, 230))
    head = [1] * 5
    got = repeated_tokens(as_bytes([*head, 7, *a, *b]), as_bytes([*head, 8, *b, *a]), 5, 66)
    assert got == 60


def test_new_content_and_short_runs_are_not_repeated() -> None:
    """Content only the new prompt has, and runs shorter than ``RUN``, count nothing; the
    stop bound excludes what the earlier prompt had after it."""
    earlier = list(range(1000, 1040))
    assert repeated_tokens(as_bytes(earlier), as_bytes(list(range(1, 60))), 0, 40) == 0
    short = earlier[:10] + [5] * 30
    assert repeated_tokens(as_bytes(earlier), as_bytes(short), 0, 40) == 0
    assert repeated_tokens(as_bytes(earlier), as_bytes(earlier), 0, RUN - 1) == 0
    assert repeated_tokens(as_bytes(earlier), as_bytes(earlier), 0, 40) == 40


@given(edited(), st.data())
def test_with_a_content_mask_equals_the_naive_count(
    case: tuple[list[int], list[int], int], data: st.DataObject
) -> None:
    """With a content mask, a run of repeated tokens counts only when it holds enough of the
    request's own text, as the naive count says."""
    earlier, new, start = case
    content = data.draw(st.lists(st.integers(0, 1), min_size=len(earlier), max_size=len(earlier)))
    got = repeated_tokens(as_bytes(earlier), as_bytes(new), start, len(earlier), bytes(content))
    assert got == naive(earlier, new, start, len(earlier), content)


def test_shared_template_markup_alone_is_not_repeated() -> None:
    """Two unrelated prompts that end with the same 20 tokens of template markup (a
    generation prompt that the tokenizer cuts into plain-text pieces) repeat nothing; the
    same run holding the request's own text is repeated."""
    markup = list(range(500, 520))
    earlier = [1, 2, 3, *range(100, 130), *markup]
    new = [1, 2, 3, *range(200, 240), *markup]
    content = [0, 0, 0, *[1] * 30, *[0] * 20]
    assert repeated_tokens(as_bytes(earlier), as_bytes(new), 3, len(earlier), bytes(content)) == 0
    assert repeated_tokens(as_bytes(earlier), as_bytes(new), 3, len(earlier)) == 20
    text = [0, 0, 0, *[1] * 30, *[1] * 10, *[0] * 10]
    assert repeated_tokens(as_bytes(earlier), as_bytes(new), 3, len(earlier), bytes(text)) == 20


def test_a_short_last_question_after_a_moved_block_is_repeated() -> None:
    """After a reordered tool list, the template's footer, a last question of five tokens and
    the generation prompt (one run of 40, five of them the request's own text: all it still
    has) are repeated; the same run after an edited question, holding only part of the
    question, is not."""
    tool_a, tool_b = list(range(100, 120)), list(range(200, 220))
    tail = [*range(300, 320), *range(400, 405), *range(500, 515)]
    earlier = [1, 2, *tool_a, *tool_b, *tail]
    new = [1, 2, *tool_b, *tool_a, *tail]
    content = bytes([0, 0, *[1] * 40, *[0] * 20, *[1] * 5, *[0] * 15])
    assert repeated_tokens(as_bytes(earlier), as_bytes(new), 2, len(earlier), content) == 80
    edited = [1, 2, *tool_b, *tool_a, *range(300, 320), *range(400, 403), 999, *range(500, 515)]
    assert repeated_tokens(as_bytes(earlier), as_bytes(edited), 2, len(earlier), content) == 40


def test_the_last_word_of_another_question_does_not_make_its_markup_repeated() -> None:
    """Two different questions ending in the same token (``?``) before the same 20 tokens of
    markup: the run from that token holds all the text the earlier prompt has left, but it
    starts inside the earlier question, so it is not repeated; a one-token question repeated
    whole (the run starts at its text's first token) is."""
    markup, tail = list(range(300, 306)), list(range(500, 520))
    earlier = [1, 2, *range(100, 130), *markup, *range(400, 405), *tail]
    content = bytes([0, 0, *[1] * 30, *[0] * 6, *[1] * 5, *[0] * 20])
    new = [1, 2, *range(600, 640), *markup, *range(700, 708), 404, *tail]
    assert repeated_tokens(as_bytes(earlier), as_bytes(new), 2, len(earlier), content) == 0
    assert naive(earlier, new, 2, len(earlier), list(content)) == 0
    one_word = [1, 2, *range(100, 130), *markup, 404, *tail]
    content = bytes([0, 0, *[1] * 30, *[0] * 6, 1, *[0] * 20])
    got = repeated_tokens(as_bytes(one_word), as_bytes(new), 2, len(one_word), content)
    assert got == 21 == naive(one_word, new, 2, len(one_word), list(content))
