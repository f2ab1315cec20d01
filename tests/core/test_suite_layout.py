"""The suite's own layout: every module under ``tests/real/`` marks all its tests ``real``,
which lets a run whose ``-m`` deselects them leave the folder out of its collection
(``tests/conftest.py``)."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REAL_TESTS, deselects

FAST_LOOP = "not real and not load and not browser and not slow"


def _marks_real(tree: ast.Module) -> bool:
    """Whether the module assigns ``pytestmark = pytest.mark.real`` at its top level."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "pytestmark"
        ]:
            return ast.unparse(node.value) == "pytest.mark.real"
    return False


def test_every_real_module_marks_all_its_tests_real() -> None:
    """Each test module under tests/real/ sets ``pytestmark = pytest.mark.real``."""
    modules = sorted(REAL_TESTS.glob("test_*.py"))
    assert len(modules) >= 10
    unmarked = [p.name for p in modules if not _marks_real(ast.parse(p.read_text()))]
    assert unmarked == []


@pytest.mark.parametrize(
    "markexpr",
    [
        FAST_LOOP,
        "not real",
        "not (real or load)",
        "not real or real and not real",
        "real and not real",
    ],
)
def test_expressions_that_deselect_every_real_test(markexpr: str) -> None:
    """An expression false for a ``real`` test whatever its other markers leaves it out."""
    assert deselects(markexpr, "real")


@pytest.mark.parametrize(
    "markexpr",
    [
        "",  # no -m: every test
        "real",
        "not slow",  # a real test that is not slow
        "slow or not real",
        "not real or slow",
        "not load and not browser",
        "not realistic",  # another marker's name
        "real(model='gemma')",  # keyword matching: pytest reads it, nothing is left out here
        "not real-time",  # a name Python cannot read
    ],
)
def test_expressions_that_keep_some_real_test(markexpr: str) -> None:
    """An expression some ``real`` test can satisfy, or one not read here, leaves the folder
    in: pytest selects from it as always."""
    assert not deselects(markexpr, "real")
