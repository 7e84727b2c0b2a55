"""``docs/architecture.md`` stays a true map: every module or folder it names exists.

A path in backticks that starts with a product package (``app/``, ``model/``, ``db/``,
``ingestion/``) or ``tests/`` must exist in the repository; several paths in one pair of
backticks, separated by commas, are each checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"`((?:app|model|db|ingestion|tests)/[A-Za-z0-9_./-]*)`")


def named_paths(text: str) -> list[str]:
    """The repository paths ``text`` names in backticks, in order."""
    return [m.group(1) for m in NAMED.finditer(text)]


def test_the_finder_reads_paths_and_ignores_other_code() -> None:
    text = "see `app/cli/` and `model/x.py`, not `radcaliper batch` nor `Volume`"
    assert named_paths(text) == ["app/cli/", "model/x.py"]


def test_the_map_names_the_main_folders() -> None:
    named = set(named_paths(DOC.read_text(encoding="utf-8")))
    for folder in ("app/cli/", "app/batch/", "app/resident/", "app/ui/", "model/measurer/infer/"):
        assert folder in named, f"{DOC.name} does not describe {folder}"


@pytest.mark.parametrize("path", sorted(set(named_paths(DOC.read_text(encoding="utf-8")))))
def test_every_named_module_exists(path: str) -> None:
    target = ROOT / path
    if path.endswith("/"):
        assert target.is_dir(), f"{DOC.name} names the folder {path}, which does not exist"
    else:
        assert target.exists(), f"{DOC.name} names {path}, which does not exist"
