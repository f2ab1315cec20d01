"""What a changed prompt recomputed that the cache had held: the earlier prompt's tokens after
the change that the new prompt repeats. Pure.

llama-server reuses a cached prompt only up to the first token that differs. After a change
(a clock in the system prompt, a reordered tool, an edited message), whatever the earlier
prompt had after that point and the new prompt still holds is prefilled again: that is the
change's cost. What the new prompt adds (its new question, the new turn) is not: it had to be
prefilled in any case. Tokens count as repeated in runs of at least :data:`RUN` (in any order:
a tool moved down the list is repeated), so that template markup shared by chance is not.
"""

from __future__ import annotations

__all__ = ["RUN", "repeated_tokens"]

RUN = 16
"""The shortest run of the earlier prompt's tokens counted as repeated."""

MIN_CONTENT = 8
"""A repeated run counts only when this many of its tokens are the request's own text (a
message's content, a tool's JSON): a template whose markers are not special tokens (Gemma
serving a Qwen3 template) writes runs of 16 markup tokens that every prompt shares."""

_WIDTH = 4
"""Bytes a token id takes in a prompt's ``tokens``."""


def repeated_tokens(
    earlier: bytes, new: bytes, start: int, stop: int, content: bytes | None = None
) -> int:
    """How many of ``earlier``'s tokens in ``[start, stop)`` lie in a run of at least
    :data:`RUN` tokens that occurs in ``new`` after ``start`` (each token counted once).
    Both are token ids as 4-byte items. With ``content`` (one byte per earlier token, 1 for
    the request's own text), a run of overlapping windows counts only when it holds at least
    :data:`MIN_CONTENT` such tokens."""
    tail = new[start * _WIDTH :]
    if stop - start < RUN or len(tail) < RUN * _WIDTH:
        return 0
    size = RUN * _WIDTH
    windows = {tail[at : at + size] for at in range(0, len(tail) - size + 1, _WIDTH)}
    total, low, high = 0, -1, -1
    for i in range(start, stop - RUN + 1):
        if earlier[i * _WIDTH : i * _WIDTH + size] in windows:
            if i > high:  # a gap: the run before it is complete
                total += _counted(low, high, content)
                low = i
            high = i + RUN
    return total + _counted(low, high, content)


def _counted(low: int, high: int, content: bytes | None) -> int:
    """The tokens of the run ``[low, high)`` (none when ``low`` is -1), when it holds enough
    of the request's own text."""
    if low < 0:
        return 0
    if content is not None and sum(content[low:high]) < MIN_CONTENT:
        return 0
    return high - low
