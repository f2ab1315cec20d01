"""What a changed prompt recomputed that the cache had held: the earlier prompt's tokens after
the change that the new prompt repeats. Pure.

llama-server reuses a cached prompt only up to the first token that differs. After a change
(a clock in the system prompt, a reordered tool, an edited message), whatever the earlier
prompt had after that point and the new prompt still holds is prefilled again: that is the
change's cost. What the new prompt adds (its new question, the new turn) is not: it had to be
prefilled in any case. Tokens count as repeated in runs of at least :data:`RUN`, in any order
(a tool moved down the list is repeated), each holding enough of the request's own text (or
all of it that the earlier prompt still had, from the start of a text on), so that template
markup shared by chance (from the last character of another question on) is not.
"""

from __future__ import annotations

from proxy.core.prefix import shared_prefix

__all__ = ["MIN_CONTENT", "RUN", "repeated_tokens"]

RUN = 16
"""The shortest run of the earlier prompt's tokens counted as repeated."""

MIN_CONTENT = 8
"""A repeated run counts only when this many of its tokens are the request's own text (a
message's content, a tool's JSON), or when it starts outside a text or at its first token and
holds all such text the earlier prompt has from the run on (a short last question repeated
after a reordered tool list): a template whose markers are not special tokens (Gemma serving a
Qwen3 template) writes runs of 16 markup tokens that every prompt shares, and the ``?`` that
ends two different questions starts such a run."""

_WIDTH = 4
"""Bytes a token id takes in a prompt's ``tokens``."""


def repeated_tokens(
    earlier: bytes, new: bytes, start: int, stop: int, content: bytes | None = None
) -> int:
    """How many of ``earlier``'s tokens in ``[start, stop)`` ``new`` repeats after
    ``start``: from each token, the longest run of ``earlier`` found anywhere in ``new``
    after ``start``; a run of at least :data:`RUN` tokens is counted and passed over, else
    the next token is tried. Both are token ids as 4-byte items. With ``content`` (one byte
    per earlier token, 1 for the request's own text), a run counts only when at least
    :data:`MIN_CONTENT` of its tokens are such text, or, for a run that does not start inside
    a text (after its first token), all of it from the run to ``stop`` (and at least one)."""
    tail = new[start * _WIDTH :]
    if stop - start < RUN or len(tail) < RUN * _WIDTH:
        return 0
    places = _run_starts(tail)
    size = RUN * _WIDTH
    left = _content_left(content, start, stop) if content is not None else []
    total, i = 0, start
    while i + RUN <= stop:
        found = places.get(earlier[i * _WIDTH : i * _WIDTH + size])
        if found:
            rest = earlier[i * _WIDTH : stop * _WIDTH]
            length = max(shared_prefix(rest, tail[at * _WIDTH :]) for at in found)
            if content is None or sum(content[i : i + length]) >= _needed(content, left, i, start):
                total += length
                i += length
                continue
        i += 1
    return total


def _needed(content: bytes, left: list[int], i: int, start: int) -> int:
    """The text tokens a run from ``i`` must hold: :data:`MIN_CONTENT`, or all that is left
    to ``stop`` (at least one) when that is fewer and the run does not start inside a text."""
    inside = i > 0 and content[i] == 1 and content[i - 1] == 1
    return MIN_CONTENT if inside else max(1, min(MIN_CONTENT, left[i - start]))


def _run_starts(tail: bytes) -> dict[bytes, list[int]]:
    """Where each run of :data:`RUN` tokens starts in ``tail`` (the first few places)."""
    size = RUN * _WIDTH
    places: dict[bytes, list[int]] = {}
    for at in range(len(tail) // _WIDTH - RUN + 1):
        where = places.setdefault(tail[at * _WIDTH : at * _WIDTH + size], [])
        if len(where) < 16:
            where.append(at)
    return places


def _content_left(content: bytes, start: int, stop: int) -> list[int]:
    """For each token in ``[start, stop)``: the content tokens from it to ``stop``."""
    left = [0] * (stop - start + 1)
    for i in range(stop - 1, start - 1, -1):
        left[i - start] = left[i - start + 1] + content[i]
    return left
