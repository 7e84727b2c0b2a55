"""``radcaliper train-click`` and ``calibrate-click``: a click model trained on reads, attached to
a checkpoint whose clicks it then answers; and what they refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.cli.clicks import CLICK_FOLDER, attach_click_model
from ingestion.errors import ModelError
from model.measurer.checkpoint import checkpoint_hash, default_checkpoint, read_settings
from model.measurer.infer import CheckpointMeasurer

from tests.support.reads import reads_dataset

runner = CliRunner()

CALIBRATION_ROWS = (  # LIDC-IDRI-0010 is on the calibration side of the split
    ("LIDC-IDRI-0010_R_1", "LIDC-IDRI-0010", [8.1, 9.0, 8.6], [5.2, 6.0, 5.5]),
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(dataset folder, click model) from two steps of train-click on three read lesions."""
    tmp = tmp_path_factory.mktemp("click-cli")
    dataset = reads_dataset(tmp).root
    model = tmp / "click"
    result = runner.invoke(
        app,
        ["train-click", str(model), "--dataset", str(dataset), "--steps", "2", "--threads", "1"],
    )
    assert result.exit_code == 0, result.output
    return dataset, model


def test_train_click_writes_a_click_model(trained: tuple[Path, Path]) -> None:
    _, model = trained
    settings = read_settings(model)
    assert settings.tasks == ("point", "axes")
    assert settings.lesion_view is not None
    assert settings.calibration is None
    assert settings.training["side"] == "train" and settings.training["lesions"] == 3
    assert settings.not_for_clinical_use


def test_train_click_refuses_a_dataset_without_training_patients(tmp_path: Path) -> None:
    dataset = reads_dataset(tmp_path, rows=CALIBRATION_ROWS).root
    result = runner.invoke(app, ["train-click", str(tmp_path / "m"), "--dataset", str(dataset)])
    assert result.exit_code == 2
    assert "no read lesion" in result.output
    assert not (tmp_path / "m").exists()


def test_train_click_refuses_a_missing_dataset(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["train-click", str(tmp_path / "m"), "--dataset", str(tmp_path / "nowhere")]
    )
    assert result.exit_code == 2
    assert "nowhere" in result.output


def test_calibrate_click_refuses_what_is_not_a_click_model(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    dataset, _ = trained
    result = runner.invoke(
        app, ["calibrate-click", str(default_checkpoint()), "--dataset", str(dataset)]
    )
    assert result.exit_code == 2
    assert "not a click model" in result.output


def test_calibrate_click_needs_calibration_patients(trained: tuple[Path, Path]) -> None:
    dataset, model = trained  # only training patients in this dataset
    result = runner.invoke(app, ["calibrate-click", str(model), "--dataset", str(dataset)])
    assert result.exit_code == 2
    assert "no lesion" in result.output or "calibrate on" in result.output


def test_an_attached_click_model_answers_clicks_and_is_part_of_the_identity(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    _, model = trained
    checkpoint = tmp_path / "demo"
    shutil.copytree(default_checkpoint(), checkpoint)
    before = checkpoint_hash(checkpoint)
    attach_click_model(checkpoint, model)
    assert read_settings(checkpoint).click_model == CLICK_FOLDER
    attached = checkpoint_hash(checkpoint)
    assert attached != before
    # a change inside the click model changes the checkpoint's identity
    settings = checkpoint / CLICK_FOLDER / "radcaliper.json"
    data = json.loads(settings.read_text())
    data["version"] = "9.9.9"
    settings.write_text(json.dumps(data))
    assert checkpoint_hash(checkpoint) != attached
    measurer = CheckpointMeasurer.load(checkpoint)
    assert measurer.click is not None


def test_a_click_folder_outside_the_checkpoint_is_refused(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    _, model = trained
    checkpoint = tmp_path / "demo"
    shutil.copytree(default_checkpoint(), checkpoint)
    shutil.copytree(model, tmp_path / "outside")
    path = checkpoint / "radcaliper.json"
    data = json.loads(path.read_text())
    data["click_model"] = "../outside"
    path.write_text(json.dumps(data))
    with pytest.raises(ModelError, match="not a folder of the checkpoint"):
        CheckpointMeasurer.load(checkpoint)
    data["click_model"] = "missing"
    path.write_text(json.dumps(data))
    with pytest.raises(ModelError, match="not a folder of the checkpoint"):
        CheckpointMeasurer.load(checkpoint)


def test_calibrate_click_refuses_to_attach_to_what_is_not_a_checkpoint(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    _, model = trained
    dataset = reads_dataset(tmp_path, rows=CALIBRATION_ROWS).root
    before = (model / "radcaliper.json").read_bytes()
    result = runner.invoke(
        app,
        [
            "calibrate-click",
            str(model),
            "--dataset",
            str(dataset),
            "--attach-to",
            str(tmp_path / "not-a-checkpoint"),
        ],
    )
    assert result.exit_code == 2
    assert "not-a-checkpoint" in result.output
    assert (model / "radcaliper.json").read_bytes() == before  # nothing written


def test_an_exported_checkpoint_keeps_its_click_model(tmp_path: Path) -> None:
    out = tmp_path / "exported"
    result = runner.invoke(app, ["export-model", str(default_checkpoint()), str(out)])
    assert result.exit_code == 0, result.output
    assert read_settings(out).click_model == CLICK_FOLDER
    assert (out / CLICK_FOLDER / "model.safetensors").is_file()
    assert CheckpointMeasurer.load(out).click is not None


def test_attaching_again_replaces_the_click_model_whole(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    _, model = trained
    checkpoint = tmp_path / "demo"
    shutil.copytree(default_checkpoint(), checkpoint)
    settings_before = json.loads((checkpoint / "radcaliper.json").read_text())
    newer = tmp_path / "newer"
    shutil.copytree(model, newer)
    data = json.loads((newer / "radcaliper.json").read_text())
    data["version"] = "2.0.0"
    (newer / "radcaliper.json").write_text(json.dumps(data))
    attach_click_model(checkpoint, model)
    attach_click_model(checkpoint, newer)
    attach_click_model(checkpoint, checkpoint / CLICK_FOLDER)  # itself: nothing to copy
    assert read_settings(checkpoint / CLICK_FOLDER).version == "2.0.0"
    assert not any(p.name.endswith(".partial") for p in checkpoint.iterdir())
    after = json.loads((checkpoint / "radcaliper.json").read_text())
    assert {k: v for k, v in after.items() if k != "click_model"} == {
        k: v for k, v in settings_before.items() if k != "click_model"
    }
