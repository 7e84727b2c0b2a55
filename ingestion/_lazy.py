"""Lazy package exports (PEP 562), shared by radcaliper's packages.

A package lists where each public name lives; the name is imported on first access, so that
importing a light submodule (``ingestion.errors``, ``model.numeric.text``) does not pay for the
heavy ones (numpy, pydicom, torch, MONAI).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, sources: Mapping[str, Sequence[str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for ``package``.

    Args:
        package: the package's ``__name__``.
        sources: module name -> the public names it defines.
        namespace: the package's ``globals()``; resolved names are cached there.
    """
    where = {name: module for module, names in sources.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
