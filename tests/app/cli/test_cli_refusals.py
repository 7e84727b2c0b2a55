"""Issue 41, item 7: options and outputs the measurer's commands cannot use are refused up
front, with one line and exit 2, never after the work or with a traceback: a budget of false
findings that is not a finite number >= 0 (calibrate), an output folder that is a file (train,
evaluate, export-model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from model.measurer.checkpoint.settings import default_checkpoint

runner = CliRunner()


def _one_line_exit_2(args: list[str], *names: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), args
    assert "Traceback" not in result.output
    flat = " ".join(result.output.split())
    for name in names:
        assert name in flat, (args, name, result.output)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1"])
def test_calibrate_refuses_a_budget_that_is_not_a_finite_number(tmp_path: Path, value: str) -> None:
    # MODEL_DIR is not even a model: the option is refused before anything is loaded
    args = ["calibrate", str(tmp_path), "--false-per-study", value]
    _one_line_exit_2(args, "--false-per-study")


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\n")
    return path


def test_train_into_a_file_is_refused_before_training(a_file: Path) -> None:
    _one_line_exit_2(["train", str(a_file), "--steps", "1"], str(a_file), "not a folder")
    below = a_file / "checkpoint"  # a folder under a file cannot be made either
    _one_line_exit_2(["train", str(below), "--steps", "1"], str(a_file), "not a folder")
    assert a_file.read_text().startswith("root:")


def test_evaluate_into_a_file_is_refused_before_evaluating(a_file: Path, tmp_path: Path) -> None:
    _one_line_exit_2(["evaluate", "--quick", "--out", str(a_file)], "--out", str(a_file))
    dataset = tmp_path / "dataset"  # not looked at: the output is refused first
    args = ["evaluate", "--dataset", str(dataset), "--out", str(a_file)]
    _one_line_exit_2(args, "--out", str(a_file), "not a folder")


def test_export_model_into_a_file_is_refused(a_file: Path) -> None:
    args = ["export-model", str(default_checkpoint()), str(a_file)]
    _one_line_exit_2(args, str(a_file), "not a folder")
    assert a_file.read_text().startswith("root:")
