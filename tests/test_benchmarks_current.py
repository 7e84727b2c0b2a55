"""Benchmarks and experiments run against the current code: every name they import from the
product (``app``, ``db``, ``ingestion``, ``model``) or from ``tests.support`` exists there.

Each ``benchmarks/**/*.py`` is read with :mod:`ast` (not run); its imports, at module level and
inside functions, are resolved by importing the named module and looking the name up. A move
or a rename that leaves a benchmark behind fails here instead of on the next person who runs it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").rglob("*.py"))
CHECKED = ("app", "db", "ingestion", "model", "tests.support")


def imported_names(source: str) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, line)`` for each checked import in ``source``."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if _checked(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _checked(node.module or ""):
            found += [(str(node.module), a.name, node.lineno) for a in node.names]
    return found


def _checked(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in CHECKED)


def missing(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (or ``import module``) would fail, or None."""
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        return f"{module} cannot be imported ({error})"
    if name is None or name == "*" or hasattr(imported, name):
        return None
    if importlib.util.find_spec(f"{module}.{name}") is not None:
        return None
    return f"{module} has no {name}"


def test_the_reader_finds_function_level_imports_and_skips_others() -> None:
    source = "import os\nfrom app.cli import main\ndef f():\n    from model.gone import x\n"
    assert imported_names(source) == [("app.cli", "main", 2), ("model.gone", "x", 4)]
    assert missing("model.measurer", "CheckpointMeasurer") is None
    assert missing("model.measurer", "no_such_name") == "model.measurer has no no_such_name"
    assert missing("model.no_such_module", None) is not None


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_of_a_benchmark_resolves(path: Path) -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {why}"
        for module, name, line in imported_names(path.read_text(encoding="utf-8"))
        if (why := missing(module, name)) is not None
    ]
    assert not problems, "\n".join(problems)
