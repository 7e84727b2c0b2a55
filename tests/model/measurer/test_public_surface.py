"""``model.measurer`` exports a handful of names (at most 25): the ``Measurer`` protocol, the
checkpoint measurer and the result types; everything else comes from its subpackages, each with
its own ``__all__``. Importing it costs nothing: no torch, no transformers."""

from __future__ import annotations

import subprocess
import sys

import model.measurer

SUBPACKAGES = ("tasks", "inputs", "data", "train", "infer", "calibrate", "evaluate", "checkpoint")


def test_at_most_25_names_and_each_resolves() -> None:
    names = model.measurer.__all__
    assert len(names) <= 25, f"model.measurer exports {len(names)} names"
    for name in names:
        assert getattr(model.measurer, name) is not None
    assert "Measurer" in names and "StudyResult" in names


def test_each_subpackage_names_its_surface() -> None:
    import importlib

    for sub in SUBPACKAGES:
        package = importlib.import_module(f"model.measurer.{sub}")
        assert package.__all__, f"model.measurer.{sub} has an empty __all__"
        for name in package.__all__:
            assert getattr(package, name) is not None


def test_importing_the_facade_imports_no_torch() -> None:
    code = (
        "import sys, model.measurer, model.measurer.tasks\n"
        "heavy = [m for m in ('torch', 'transformers', 'monai') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
