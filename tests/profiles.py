"""The hypothesis profiles, and each property test's count of examples stated against them.

Off CI the conftest loads ``dev``: every property test draws a tenth of its examples, so the
fast inner loop stays fast. Under ``CI`` hypothesis loads its own ``ci`` profile (every
example, derandomized); ``--hypothesis-profile=default`` runs every example on a developer's
machine. The properties and their assertions are the same under every profile; only the
number of inputs drawn differs.
"""

from __future__ import annotations

from hypothesis import settings

FULL = 100
"""The examples per test of hypothesis's ``default`` and ``ci`` profiles: a test's count is
stated for a profile of this many."""

settings.register_profile("dev", max_examples=FULL // 10)

FEWEST = 5
"""No property test draws fewer examples than this (or its full count, when smaller)."""


def examples(full: int) -> int:
    """``full`` examples under a profile of ``FULL`` examples per test, scaled by the
    profile loaded when the test module is imported (a tenth under ``dev``)."""
    scaled = full * settings().max_examples // FULL
    return max(scaled, min(full, FEWEST))


def use_dev_profile_off_ci() -> None:
    """Load ``dev`` unless a profile other than hypothesis's ``default`` is loaded already
    (hypothesis loads ``ci`` by itself when it sees a CI environment)."""
    if settings.get_current_profile_name() == "default":
        settings.load_profile("dev")
