"""Tests for proxy.core.numbers: the one rule for writing figures."""

from __future__ import annotations

import math

import pytest

from proxy.core.numbers import figure, figure_or_dash


class TestFigure:
    @pytest.mark.parametrize(
        ("value", "text"),
        [
            (2061.0, "2,061"),
            (93.46, "93.5"),
            (4.25, "4.25"),
            (0.6125, "0.61"),
            (326.53, "327"),
            (36.03, "36.0"),
            (1_234_567.8, "1,234,568"),
        ],
    )
    def test_three_significant_figures(self, value: float, text: str) -> None:
        """The measurement's own way of writing: 2,061 ms, 93.5 ms, 4.25 ms."""
        assert figure(value) == text

    @pytest.mark.parametrize(("value", "text"), [(796.0, "796"), (9.0, "9"), (0.0, "0"), (7, "7")])
    def test_whole_numbers_have_no_decimals(self, value: float, text: str) -> None:
        """A whole number is written without decimals whatever its size."""
        assert figure(value) == text

    @pytest.mark.parametrize(
        ("value", "text"), [(-1.5, "-1.50"), (-24.25, "-24.2"), (-150.0, "-150")]
    )
    def test_negative_by_magnitude(self, value: float, text: str) -> None:
        """A negative figure (an overhead below zero) gets the digits of its magnitude."""
        assert figure(value) == text

    def test_not_finite(self) -> None:
        """Infinity and NaN are written, not an exception."""
        assert figure(math.inf) == "inf"
        assert figure(math.nan) == "nan"


class TestFigureOrDash:
    def test_unknown_is_a_dash(self) -> None:
        """None (unknown) is written as a dash; a known value as figure() writes it."""
        assert figure_or_dash(None) == "-"
        assert figure_or_dash(4.25) == "4.25"
