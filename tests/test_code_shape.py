"""Product code stays in small pieces: no module over 400 lines, no function over 80.

Product code is every .py file of the mergepipe package, the top-level folders linked into it
included (the links are followed); tests are not product code."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mergepipe"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80  # from the `def` line to the function's last line


def product_modules() -> list[Path]:
    """The .py files under mergepipe/, following links (each real directory walked once)."""
    seen: set[str] = set()
    out = []
    for top, dirs, files in os.walk(PACKAGE, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        out += [Path(top, f) for f in sorted(files) if f.endswith(".py")]
    return out


Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, Function):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_walk_sees_the_linked_folders() -> None:
    names = {_rel(p) for p in product_modules()}
    for sub in ("catalog", "planner", "executor", "service", "migrations", "benchmarks", "core",
                "jobs", "cli"):
        assert f"mergepipe/{sub}/__init__.py" in names, sub
    assert not any(n.startswith("tests/") for n in names)


def test_no_module_over_400_lines() -> None:
    long = {_rel(p): n for p in product_modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_80_lines() -> None:
    long = {}
    for path in product_modules():
        for name, node in functions(ast.parse(path.read_text(), str(path))):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long[f"{_rel(path)}:{name}"] = lines
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
