"""``proxy/`` uses aiohttp and CPython through their public interfaces only: no private
module, attribute or hook of either, read from the source (comments and docstrings too, so
a workaround cannot hide behind a string)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"

FORBIDDEN = {
    "aiohttp's client protocol (ResponseHandler)": r"client_proto",
    "aiohttp's server protocol": r"web_protocol",
    "StreamResponse's private switch": r"_send_headers_immediately",
    "a connector's private protocol factory": r"\._factory\b",
    "a private parser (aiohttp's or re's)": r"\._parser\b",
    "CPython's private regex parser": r"\bre\._parser\b|\bsre_parse\b|\bsre_compile\b",
    "a private name of an aiohttp module": r"\baiohttp(\.[a-z_]+)*\._[A-Za-z]",
}
"""What no file of ``proxy/`` may name, with why."""


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE.parent)): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _hits(pattern: str, sources: dict[str, str]) -> list[str]:
    found = re.compile(pattern)
    return [
        f"{name}:{number}: {line.strip()}"
        for name, text in sources.items()
        for number, line in enumerate(text.splitlines(), 1)
        if found.search(line)
    ]


@pytest.mark.parametrize("pattern", list(FORBIDDEN.values()), ids=list(FORBIDDEN))
def test_no_private_name_is_named(pattern: str) -> None:
    """No line of ``proxy/`` names a private aiohttp or CPython module, attribute or hook."""
    assert _hits(pattern, _sources()) == []


def _private_imports(tree: ast.Module) -> list[str]:
    """Imports of a private aiohttp module or of a private name from an aiohttp module."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            found += [n for n in names if n.startswith("aiohttp.") and "._" in f".{n}"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
            module = node.module or ""
            if "._" in f".{module}":
                found.append(module)
            found += [f"{module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_private_aiohttp_import() -> None:
    """No module of ``proxy/`` imports a private aiohttp module or a private name from one."""
    found = {name: _private_imports(ast.parse(text, name)) for name, text in _sources().items()}
    assert {name: imports for name, imports in found.items() if imports} == {}


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        (
            "from aiohttp.client_proto import ResponseHandler",
            "aiohttp's client protocol (ResponseHandler)",
        ),
        ("    _send_headers_immediately = False", "StreamResponse's private switch"),
        ("        self._factory = handler", "a connector's private protocol factory"),
        ("if self._parser is not None:", "a private parser (aiohttp's or re's)"),
        ("import re._parser", "CPython's private regex parser"),
        ("import sre_parse", "CPython's private regex parser"),
        ("aiohttp.web_protocol.RequestHandler", "aiohttp's server protocol"),
        ("aiohttp.helpers._SENTINEL", "a private name of an aiohttp module"),
    ],
)
def test_each_pattern_finds_what_it_names(line: str, pattern: str) -> None:
    """Each pattern fires on a line that uses what it forbids (so the checks above can fail)."""
    assert _hits(FORBIDDEN[pattern], {"example.py": line}) != []


@pytest.mark.parametrize(
    "line",
    [
        "from aiohttp import web",
        "resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)",
        "transport = connection.transport",
        "response_class=UpstreamResponse,",
        "self._parsed = parse(body)",
        "import re",
    ],
)
def test_public_uses_pass(line: str) -> None:
    """Ordinary public uses of aiohttp and ``re`` match no pattern (nothing is said)."""
    assert [p for p in FORBIDDEN.values() if _hits(p, {"example.py": line})] == []


def test_private_import_check_finds_one() -> None:
    """The import check names a private module and a private name, and passes public ones."""
    tree = ast.parse(
        "import aiohttp._http_parser\n"
        "from aiohttp.helpers import _SENTINEL\n"
        "from aiohttp import web\n"
        "from aiohttp.connector import Connection\n"
    )
    assert _private_imports(tree) == ["aiohttp._http_parser", "aiohttp.helpers._SENTINEL"]
