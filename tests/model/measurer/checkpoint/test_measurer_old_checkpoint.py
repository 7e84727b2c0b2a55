"""A checkpoint written by ``radcaliper train`` before the measurer's code was rearranged
(issue 42) still loads and measures as it did.

``tests/data/checkpoint-0.3.4-layout/`` was written by the code of commit 388d421 (``radcaliper
train OUT --config tiny.json --threads 1`` with ``TrainConfig.tiny()``: three steps, not
calibrated). Its ``measure --json`` result on phantom seed 3 (written with ``radcaliper phantoms
--n 1 --seed 3``) was recorded with that code: no findings, and these three warnings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from app.cli import app
from ingestion.errors import ModelError
from ingestion.load import load_path
from ingestion.phantoms import write_phantoms
from model.measurer import CheckpointMeasurer, StudyResult, checkpoint_hash, read_settings

OLD = Path(__file__).resolve().parents[3] / "data" / "checkpoint-0.3.4-layout"

# recorded with the code before the move (see the module docstring)
WARNINGS_BEFORE = [
    "outside the validated domain: the study's anatomy is not known; radcaliper-demo 0.1.0 was "
    "validated on phantom",
    "radcaliper-demo 0.1.0 is not calibrated: its values have no ranges; run 'radcaliper "
    "calibrate' on the checkpoint before using them",
    "31 of 31 find answers were malformed; their planes were not searched in those passes",
]


@pytest.fixture(scope="module")
def phantom_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("old-checkpoint")
    (study,) = write_phantoms(out, n=1, seed=3)
    return study


def test_settings_and_hash_read_back_unchanged() -> None:
    settings = read_settings(OLD)
    stored = json.loads((OLD / "radcaliper.json").read_text())
    assert json.loads(json.dumps(settings.to_json())) == stored
    assert settings.name == "radcaliper-demo" and settings.version == "0.1.0"
    assert len(checkpoint_hash(OLD)) == 64


def test_an_old_checkpoint_measures_as_before(tmp_path: Path, phantom_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(OLD, model)
    torch.set_num_threads(1)
    args = ["measure", str(phantom_dir / "dicom"), "--model", str(model), "--json", "--no-store"]
    result = CliRunner().invoke(app, [*args, "--no-resident"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{") :])
    assert data["model"]["name"] == "radcaliper-demo" and data["model"]["version"] == "0.1.0"
    assert data["findings"] == []
    assert data["warnings"] == WARNINGS_BEFORE


def test_the_old_checkpoint_through_the_measurer_protocol(phantom_dir: Path) -> None:
    measurer = CheckpointMeasurer.load(OLD)
    assert measurer.info.name == "radcaliper-demo"
    volume = load_path(phantom_dir / "dicom").volumes[0]
    result = measurer.measure(volume, source=str(phantom_dir))
    assert isinstance(result, StudyResult) and result.findings == ()
    truth = json.loads((phantom_dir / "truth.json").read_text())["findings"][0]
    x, y, z = (float(v) for v in truth["center_lps_mm"])
    with pytest.raises(ModelError, match="malformed"):
        measurer.measure_at(volume, (x, y, z))
