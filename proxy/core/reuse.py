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

_WIDTH = 4
"""Bytes a token id takes in a prompt's ``tokens``."""


def repeated_tokens(earlier: bytes, new: bytes, start: int, stop: int) -> int:
    """How many of ``earlier``'s tokens in ``[start, stop)`` lie in a run of at least
    :data:`RUN` tokens that occurs in ``new`` after ``start`` (each token counted once).
    Both are token ids as 4-byte items."""
    tail = new[start * _WIDTH :]
    if stop - start < RUN or len(tail) < RUN * _WIDTH:
        return 0
    size = RUN * _WIDTH
    windows = {tail[at : at + size] for at in range(0, len(tail) - size + 1, _WIDTH)}
    total, covered = 0, start
    for i in range(start, stop - RUN + 1):
        if earlier[i * _WIDTH : i * _WIDTH + size] in windows:
            total += i + RUN - max(i, covered)
            covered = i + RUN
    return total
