"""The layers of ``proxy/``, read from the source: who imports whom, and where I/O may happen.

The rule (docs/architecture.md): ``proxy.core`` is pure and imports only itself;
``proxy.config`` imports the core; ``proxy.serve`` imports the core and the config;
``proxy.commands`` may import anything; nothing outside the commands imports them. Every
import counts, also those inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "proxy"

ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "config": frozenset({"core", "config"}),
    "serve": frozenset({"core", "config", "serve"}),
    "commands": frozenset({"core", "config", "serve", "commands", ""}),  # "": __version__
    "": frozenset({"commands"}),  # proxy/__init__.py and __main__.py
}
"""Layer -> the layers its modules may import."""

IO_MODULES = frozenset(
    {
        "aiohttp", "asyncio", "fcntl", "http", "importlib", "io", "logging", "multiprocessing",
        "os", "pathlib", "prometheus_client", "select", "selectors", "shutil", "signal",
        "socket", "ssl", "structlog", "subprocess", "sys", "tempfile", "threading", "tiktoken",
        "urllib", "yarl", "zipfile", "tarfile", "gzip",
    }
)  # fmt: skip
"""Top-level modules that read or write the world: none of them in the core."""

IO_CALLS = frozenset({"open", "print", "input", "exec", "eval", "__import__"})


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, tree: ast.Module) -> Iterator[str]:
    """Every module ``tree`` imports, absolute, wherever the import statement stands."""
    package = name if name.count(".") == 0 or _is_package(name) else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # `from proxy.core import sse` imports the module proxy.core.sse
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").is_file()


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else ""


def graph(found: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the proxy modules it imports."""
    return {
        name: {dep for dep in imported(name, tree) if dep in found and dep != name}
        for name, tree in found.items()
    }


@pytest.fixture(scope="module")
def trees() -> dict[str, ast.Module]:
    """Each module of proxy/ by name, parsed once for this file's tests (which only read
    the trees; they go with the module's end, not kept for the rest of the run)."""
    return modules()


@pytest.fixture(scope="module")
def edges(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """The import graph of proxy/, made once for this file's tests (which only read it)."""
    return graph(trees)


def test_every_module_sits_in_a_known_layer(trees: dict[str, ast.Module]) -> None:
    """Each module of proxy/ is the package itself, the config, or under core/serve/commands."""
    strays = [n for n in trees if layer(n) == "" and n not in ("proxy", "proxy.__main__")]
    assert strays == []


def test_layers_import_only_what_the_rule_allows(edges: dict[str, set[str]]) -> None:
    """core imports only core, config only core, serve not the commands."""
    broken = sorted(
        f"{name} imports {dep}"
        for name, deps in edges.items()
        for dep in deps
        if layer(dep) not in ALLOWED[layer(name)]
    )
    assert broken == []


def test_the_core_does_no_io(trees: dict[str, ast.Module]) -> None:
    """No module in proxy/core imports an I/O module or calls open, print or input."""
    found = []
    for name, tree in trees.items():
        if layer(name) != "core":
            continue
        for dep in imported(name, tree):
            if dep.split(".")[0] in IO_MODULES:
                found.append(f"{name} imports {dep}")
        for node in ast.walk(tree):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Name) and called.id in IO_CALLS:
                found.append(f"{name}:{called.lineno} calls {called.id}()")
    assert found == []


def test_no_import_cycle(edges: dict[str, set[str]]) -> None:
    """The import graph of proxy/ (function-level imports included) has no cycle."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            pytest.fail(" -> ".join(cycle))


def test_background_tasks_are_spawned_with_a_reference(trees: dict[str, ast.Module]) -> None:
    """Only proxy/serve/tasks.py creates tasks: elsewhere ``.create_task`` and
    ``ensure_future`` would leave a task only the loop's weak set holds."""
    found = [
        f"{name}:{node.lineno}"
        for name, tree in trees.items()
        if name != "proxy.serve.tasks"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("create_task", "ensure_future")
    ]
    assert found == []


class TestTheChecksCanFail:
    """The checks above, fed a module that breaks each rule."""

    def test_a_relative_import_is_resolved(self) -> None:
        """``from ..serve import relay`` in proxy.core.x is seen as proxy.serve.relay."""
        tree = ast.parse("from ..serve import relay\n")
        assert "proxy.serve.relay" in set(imported("proxy.core.x", tree))

    def test_a_function_level_import_counts(self) -> None:
        """An import inside a function body is an edge like any other."""
        tree = ast.parse("def f():\n    from proxy.commands import cli\n")
        assert "proxy.commands.cli" in set(imported("proxy.core.x", tree))

    def test_layer_names(self) -> None:
        """Modules are placed by their second name part."""
        assert [layer(n) for n in ("proxy.core.sse", "proxy.config", "proxy.serve.app")] == [
            "core",
            "config",
            "serve",
        ]
        assert "serve" not in ALLOWED["core"]
