"""The measurer's commands: measure (JSON contract, default model, refusals), train (a tiny
configuration through the CLI, resumable), calibrate (its error when nothing can be matched, and
a real calibration with the demo model)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from ingestion.phantoms import write_phantoms
from model.measurer.checkpoint.settings import SETTINGS_NAME, default_checkpoint

from tests.support.measurer import TINY, small_base_config
from tests.support.series import SeriesFactory

runner = CliRunner()


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("studies")
    write_phantoms(root / "held_out", n=2, seed=31337, nifti=True)
    return root / "held_out"


def test_measure_prints_the_json_contract_with_the_demo_model(studies: Path) -> None:
    result = runner.invoke(app, ["measure", str(studies / "phantom_0000" / "dicom"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    truth = json.loads((studies / "phantom_0000" / "truth.json").read_text())
    assert data["study_instance_uid"] == truth["study_instance_uid"]
    assert data["series_instance_uid"] == truth["series_instance_uid"]
    assert data["patient_id"] == truth["patient_id"]
    assert data["model"] == {
        "name": "radcaliper-demo",
        "version": json.loads((default_checkpoint() / SETTINGS_NAME).read_text())["version"],
        "numeric_mode": "rned_corr",
        "not_for_clinical_use": True,
    }
    assert data["findings"], "the demo model found nothing in a phantom"
    for finding in data["findings"]:
        assert set(finding) == {
            "id",
            "kind",
            "center_lps_mm",
            "slice_index",
            "measurements",
            "axes_lps_mm",
        }
        names = [m["name"] for m in finding["measurements"]]
        assert names == (
            ["long_axis", "short_axis"] if finding["kind"] == "lesion" else ["diameter"]
        )
        for m in finding["measurements"]:
            if m["value_mm"] is not None:
                low, high = m["range_mm"]
                assert low <= m["value_mm"] <= high and m["coverage"] == 0.9


def test_measure_table_says_not_for_clinical_use(studies: Path) -> None:
    result = runner.invoke(app, ["measure", str(studies / "phantom_0001" / "dicom")])
    assert result.exit_code == 0, result.output
    assert "NOT FOR CLINICAL USE" in result.stdout and "radcaliper-demo" in result.stdout


def test_measure_refuses_what_it_cannot_measure(
    studies: Path, tmp_path: Path, write_series: SeriesFactory
) -> None:
    nifti = studies / "phantom_0000" / "image.nii.gz"
    refused = runner.invoke(app, ["measure", str(nifti)])
    assert refused.exit_code == 2 and "RADCALIPER_NIFTI_MODALITY=CT" in refused.output
    measured = runner.invoke(
        app, ["measure", str(nifti), "--json"], env={"RADCALIPER_NIFTI_MODALITY": "CT"}
    )
    assert measured.exit_code == 0, measured.output
    write_series(tmp_path / "mr", n=4, modality="MR")
    mr = runner.invoke(app, ["measure", str(tmp_path / "mr")])
    assert mr.exit_code == 2 and "trained on CT only" in mr.output
    assert "Traceback" not in mr.output
    empty = runner.invoke(app, ["measure", str(tmp_path / "nothing")])
    assert empty.exit_code == 2 and "no usable CT series" in empty.output
    not_a_model = runner.invoke(
        app, ["measure", str(studies / "phantom_0000" / "dicom"), "--model", str(tmp_path)]
    )
    assert not_a_model.exit_code == 2 and "radcaliper.json is missing" in not_a_model.output


def test_train_then_calibrate_through_the_cli(tmp_path: Path, studies: Path) -> None:
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY.to_json()))
    out = tmp_path / "model"
    result = runner.invoke(app, ["train", str(out), "--config", str(config)])
    assert result.exit_code == 0, result.output
    settings = json.loads((out / SETTINGS_NAME).read_text())
    assert settings["training"]["config"] == TINY.to_json()
    assert settings["training"]["command"].startswith("radcaliper train")
    assert settings["calibration"] is None
    again = runner.invoke(app, ["train", str(out), "--config", str(config)])
    assert again.exit_code == 0  # resumes at the end: nothing to do
    other = dataclasses.replace(TINY, seed=2)
    config.write_text(json.dumps(other.to_json()))
    clash = runner.invoke(app, ["train", str(out), "--config", str(config)])
    assert clash.exit_code == 2 and "another configuration" in clash.output
    bad = runner.invoke(app, ["train", str(out), "--numeric-mode", "roman"])
    assert bad.exit_code == 2 and "rned_corr" in bad.output

    untrained = runner.invoke(app, ["calibrate", str(out), "--phantoms", str(studies), "--n", "10"])
    assert untrained.exit_code == 2 and "train it longer" in untrained.output
    assert json.loads((out / SETTINGS_NAME).read_text())["calibration"] is None


def test_calibrate_stores_ranges_with_their_mae(tmp_path: Path) -> None:
    model = tmp_path / "demo"
    shutil.copytree(default_checkpoint(), model)  # with its click model's folder
    result = runner.invoke(
        app,
        [
            "calibrate",
            str(model),
            *("--n", "10", "--seed", "555", "--coverage", "0.8"),  # the fewest the CLI takes
            *("--decode-quantile", "0.05", "--false-per-study", "0.5"),
        ],
    )
    assert result.exit_code == 0, result.output
    settings = json.loads((model / SETTINGS_NAME).read_text())
    detection = settings["detection"]  # the demo verifies candidates: an operating point
    assert detection["false_per_study"] == 0.5 and detection["studies"] == 10
    assert 0.0 <= detection["min_presence"] <= 1.0
    within = detection["fitted_false_per_study"] <= 0.5  # else the fewest false findings
    assert ("within the budget" if within else "over the budget") in result.stdout
    assert f"below {detection['min_presence']:.10g} is not reported" in result.stdout
    check = settings["decode_check"]  # the weakest decode it reports as a number
    assert check["quantile"] == 0.05 and check["n"] >= 10 and -1 <= check["min_confidence"] < 1
    assert f"below {check['min_confidence']:.3f}" in result.stdout
    calibration = settings["calibration"]
    assert set(calibration) == {"long_axis", "short_axis", "diameter"}
    for rule in calibration.values():
        assert rule["coverage"] == 0.8 and rule["n"] >= 4 and rule["mae_mm"] >= 0  # 4 for 0.8
        assert rule["kind"] in ("absolute", "adaptive")
    assert "empirical" in result.stdout and "coverage" in result.stdout  # the table's column


def test_train_base_model_runs_both_stages_and_names_the_run(tmp_path: Path, studies: Path) -> None:
    """`radcaliper train OUT --base-model DIR`: a local Qwen2.5-VL directory (here a tiny one
    with random weights) fine-tuned in its two stages, split by --steps in their proportions,
    the checkpoint named after the base model; it measures through `radcaliper measure`."""
    from model.measurer.checkpoint.base import write_random_base_model

    base = write_random_base_model(tmp_path / "qwen-tiny", "tiny", seed=0)
    small = small_base_config("unused", measure_batch=1)  # --base-model below replaces it
    config = tmp_path / "small.json"
    config.write_text(json.dumps(small.to_json()))
    out = tmp_path / "run"
    args = ["train", str(out), "--config", str(config), "--base-model", str(base)]
    result = runner.invoke(app, [*args, "--steps", "4"])
    assert result.exit_code == 0, result.output
    settings = json.loads((out / SETTINGS_NAME).read_text())
    assert settings["name"] == "radcaliper-qwen-tiny"
    trained = settings["training"]["config"]
    assert trained["base_model"] == str(base)
    assert [(s["trainable"], s["steps"]) for s in trained["stages"]] == [
        ("projector", 1),
        ("lora", 3),
    ]
    series = str(studies / "phantom_0000" / "dicom")
    measured = runner.invoke(app, ["measure", series, "--model", str(out), "--json", "--no-store"])
    assert measured.exit_code == 0, measured.output
    assert json.loads(measured.stdout)["model"]["name"] == "radcaliper-qwen-tiny"
    help_text = runner.invoke(app, ["train", "--help"]).output
    assert "--base-model" in help_text and "--name" in help_text

    # the checkpoint holds what changed; export-model writes it standalone, base or not
    assert (out / "delta.safetensors").is_file() and not (out / "model.safetensors").exists()
    moved = base.rename(tmp_path / "moved")
    failed = runner.invoke(app, ["export-model", str(out), str(tmp_path / "whole")])
    assert failed.exit_code != 0 and "which is not there" in failed.output
    exported = runner.invoke(
        app, ["export-model", str(out), str(tmp_path / "whole"), "--base-model", str(moved)]
    )
    assert exported.exit_code == 0, exported.output
    measured = runner.invoke(
        app, ["measure", series, "--model", str(tmp_path / "whole"), "--json", "--no-store"]
    )
    assert measured.exit_code == 0, measured.output
    assert "--base-model" in runner.invoke(app, ["export-model", "--help"]).output


@pytest.mark.parametrize(("shape", "share"), [("3b", "7.4 %"), ("7b", "4.4 %")])
def test_train_dry_run_prints_the_memory_of_a_published_shape(
    tmp_path: Path, shape: str, share: str
) -> None:
    """`train --base-model DIR --dry-run` reads only DIR/config.json (here the released 3B or
    7B shape, no weights) and prints the estimated peak memory with checkpointing and bf16
    weights, and the checkpoint's share of the model; nothing is written."""
    from transformers import Qwen2_5_VLConfig

    from model.backbone import published_qwen2_5_vl_kwargs

    base = tmp_path / f"qwen-{shape}"
    Qwen2_5_VLConfig(**published_qwen2_5_vl_kwargs(shape)).save_pretrained(base)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", str(out), "--base-model", str(base), "--dry-run"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "total (peak)" in text and "gradient checkpointing on" in text
    assert "frozen weights bfloat16" in text and share in text
    assert not out.exists()
    plain = runner.invoke(
        app,
        ["train", str(out), "--base-model", str(base), "--dry-run", "--no-gradient-checkpointing"],
    )
    assert "gradient checkpointing off" in " ".join(plain.output.split())
    missing = runner.invoke(app, ["train", str(out), "--base-model", str(tmp_path), "--dry-run"])
    assert missing.exit_code != 0 and "config.json" in missing.output
    bad = runner.invoke(app, ["train", str(out), "--dry-run", "--weights-dtype", "bfloat16"])
    assert bad.exit_code != 0 and "needs a base model" in bad.output
