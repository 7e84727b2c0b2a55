"""`radcaliper evaluate --quick`: the whole harness end to end on tiny budgets (what CI runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.cli.evaluate import RESULTS_BEGIN, RESULTS_END
from app.cli.train import with_steps

runner = CliRunner()

ROW_KEYS = {
    "mode",
    "success",
    "single_mae",
    "single_r2",
    "long_single_mae",
    "dual_mae_mm2",
    "dual_r2",
    "long_mae",
    "short_mae",
    "ci95",
    "common",
    "common_items",
    "detection",
    "coverage_90",
    "mean_width_90_mm",
    "coverage_curve",
}


def test_quick_evaluation_writes_every_table_and_plot(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text(f"# Results\n\nkept\n\n{RESULTS_BEGIN}\nold table\n{RESULTS_END}\nafter\n")
    args = ["evaluate", "--quick", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w")]
    result = runner.invoke(app, [*args, "--results-md", str(results)])
    assert result.exit_code == 0, result.output
    numeric = json.loads((tmp_path / "out" / "numeric_modes.json").read_text())
    positional = json.loads((tmp_path / "out" / "positional_modes.json").read_text())
    assert [r["mode"] for r in numeric] == ["rned_rnd", "rned_corr", "standard_tokens", "xval"]
    assert [r["mode"] for r in positional] == ["mrope", "circle", "circle_age"]
    for row in numeric + positional:
        assert set(row) >= ROW_KEYS
        assert 0.0 <= row["success"] <= 1.0
        assert {"lesion_recall_10mm", "precision", "vessel_recall"} <= set(row["detection"])
        assert [c["nominal"] for c in row["coverage_curve"]] == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    assert {p.name for p in (tmp_path / "out").glob("*.png")} >= {
        "predicted_vs_true.png",
        "coverage_vs_nominal.png",
    }
    text = results.read_text()
    assert "old table" not in text and "kept" in text and text.rstrip().endswith("after")
    assert "#### Numeric modes" in text and "| circle_age |" in text
    assert "radcaliper evaluate --quick" in text and "run time" in text
    assert "RNED's best decoder" in text
    trained = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert len(trained) == 6  # circle_age is rned_corr's training, done once

    again = runner.invoke(app, args)  # the models are found again, not retrained
    assert again.exit_code == 0, again.output
    assert _untimed(json.loads((tmp_path / "out" / "numeric_modes.json").read_text())) == (
        _untimed(numeric)
    )


def _untimed(rows: list[dict]) -> list[dict]:
    for row in rows:
        row["detection"].pop("seconds_per_study")
    return rows


@pytest.mark.parametrize("command", ["train", "evaluate"])
@pytest.mark.parametrize("text", ["{not json", '{"stages": "many"}', None])
def test_a_config_that_is_not_a_training_configuration_is_one_line_exit_2(
    tmp_path: Path, command: str, text: str | None
) -> None:
    config = tmp_path / "config.json"
    if text is not None:
        config.write_text(text)
    args = [command, "--config", str(config), "--work", str(tmp_path / "work")]
    if command == "train":
        args = ["train", str(tmp_path / "out"), "--config", str(config)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"--config {config}: not a training configuration" in result.output.replace("\n", "")
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ((7,), [100]),
        ((12000, 3000), [80, 20]),  # the default model's stages
        ((1000, 3000), [25, 75]),  # a real checkpoint's projector and LoRA stages
        ((1, 1, 1), [33, 33, 34]),
        ((1000, 1), [99, 1]),  # every stage keeps at least one step
    ],
)
def test_steps_split_over_the_stages_in_their_proportions(
    lengths: tuple[int, ...], expected: list[int]
) -> None:
    from model.measurer.train.config import Stage, TrainConfig

    stages = tuple(Stage(f"s{i}", n, 1e-3, warmup_steps=1) for i, n in enumerate(lengths))
    config = TrainConfig.tiny(seed=0, stages=stages)
    changed = with_steps(config, 100)
    assert [s.steps for s in changed.stages] == expected
    assert [s.name for s in changed.stages] == [s.name for s in config.stages]
    assert changed.seed == config.seed and changed.numeric_mode == config.numeric_mode
    fewer = with_steps(config, len(lengths) - 1)  # fewer steps than stages: the first get one
    assert [s.steps for s in fewer.stages] == [1] * (len(lengths) - 1) + [0]
