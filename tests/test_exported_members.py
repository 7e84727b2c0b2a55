"""Each package's public API is exactly its ``__all__`` (after httpx's test of the same name)."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "app",
    "ingestion",
    "ingestion.dataset",
    "ingestion.dicom",
    "model",
    "model.baseline",
    "model.numeric",
    "model.circle_rope",
    "model.measurer",
    "model.measurer.calibrate",
    "model.measurer.checkpoint",
    "model.measurer.data",
    "model.measurer.evaluate",
    "model.measurer.infer",
    "model.measurer.inputs",
    "model.measurer.tasks",
    "model.measurer.train",
    "db",
    "db.audit",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_resolve(name: str) -> None:
    module = importlib.import_module(name)
    assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ has duplicates"
    for member in module.__all__:
        assert getattr(module, member) is not None, f"{name}.{member}"


LAZY_PACKAGES = [
    "ingestion",
    "ingestion.dataset",
    "ingestion.dicom",
    "model",
    "model.baseline",
    "model.numeric",
    "model.circle_rope",
    "model.measurer",
    "model.measurer.calibrate",
    "model.measurer.checkpoint",
    "model.measurer.data",
    "model.measurer.evaluate",
    "model.measurer.infer",
    "model.measurer.inputs",
    "model.measurer.tasks",
    "model.measurer.train",
    "db",
    "db.audit",
]


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_lazy_table_matches_all(name: str) -> None:
    module = importlib.import_module(name)
    listed = [n for names in module._SOURCES.values() for n in names]
    assert sorted(listed) == sorted(module.__all__)


@pytest.mark.parametrize("name", PACKAGES)
def test_public_members_are_listed(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and not isinstance(v, type(importlib))  # submodules
        and n not in {"annotations", "importlib", "TYPE_CHECKING", "Any"}
    }
    assert public <= set(module.__all__), public - set(module.__all__)
