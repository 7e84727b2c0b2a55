"""``benchmarks/bench_click_baseline.py``: its help, its refusals of bad input (exit code 2,
naming the value) and a run on a two-case copy of the LIDC layout written here (NIfTI crops with
a synthetic nodule), whose JSON holds the summary and a row per case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np

REPOSITORY = Path(__file__).resolve().parents[3]
SCRIPT = REPOSITORY / "benchmarks" / "bench_click_baseline.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_help_names_the_options() -> None:
    done = run("--help")
    assert done.returncode == 0, done.stderr
    for option in ("--data", "--json", "--limit"):
        assert option in done.stdout


def test_a_folder_without_reads_is_refused(tmp_path: Path) -> None:
    done = run("--data", str(tmp_path))
    assert done.returncode == 2
    assert str(tmp_path) in done.stderr and "reads.csv" in done.stderr


def test_a_limit_below_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "reads.csv").write_text("case\n")
    done = run("--data", str(tmp_path), "--limit", "0")
    assert done.returncode == 2 and "--limit must be >= 1, got 0" in done.stderr


def write_case(data: Path, case: str, radius_mm: float, seed: int) -> None:
    """A lung crop (0.7 mm pixels, 2.5 mm slices) with a round nodule and its mask."""
    rng = np.random.default_rng(seed)
    shape = (50, 50, 5)  # NIfTI (column, row, slice)
    x, y = np.meshgrid(np.arange(50) * 0.7, np.arange(50) * 0.7, indexing="ij")
    inside = (x - 17.5) ** 2 + (y - 17.5) ** 2 <= radius_mm**2
    mask = np.zeros(shape, dtype=np.int16)
    mask[:, :, 2] = inside
    image = rng.normal(-850.0, 20.0, shape)
    image[:, :, 2][inside] = 20.0
    affine = np.diag([-0.7, -0.7, 2.5, 1.0])
    for folder, array in (("image", image.astype(np.int16)), ("mask", mask)):
        (data / folder).mkdir(exist_ok=True)
        nib.save(nib.Nifti1Image(array, affine), data / folder / f"{case}.nii.gz")


def test_a_run_scores_each_case_and_writes_the_json(tmp_path: Path) -> None:
    data = tmp_path / "lidc"
    data.mkdir()
    write_case(data, "CASE-1_R_1", 5.0, 1)
    write_case(data, "CASE-2_R_1", 3.0, 2)
    (data / "reads.csv").write_text(
        "case,patient_id,reads_long_mm,reads_short_mm,median_read_long_mm,"
        "median_read_short_mm\n"
        "CASE-1_R_1,CASE-1,9.6;10.4;10.0,9.5;10.1;9.9,10.0,9.9\n"
        "CASE-2_R_1,CASE-2,6.0;6.4,5.8;6.0,6.2,5.9\n"
    )
    out = tmp_path / "out.json"
    done = run("--data", str(data), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| all | 2 | 2 |" in done.stdout
    document = json.loads(out.read_text())
    assert document["model"]["not_for_clinical_use"] is True
    summary = document["summary"]
    assert summary["n"] == 2 and summary["segmented"] == 2
    assert summary["long_mae_mm"] < 1.5
    # the readers' own level on the same rows: each reader against the others' median
    # (CASE-1: |9.6 - 10.2|, |10.4 - 9.8|, |10.0 - 10.0|; CASE-2: 0.4, 0.4)
    assert summary["readers_long_mae_mm"] == round((0.6 + 0.6 + 0.0 + 0.4 + 0.4) / 5, 3)
    assert [b["n"] for b in summary["bins"]] == [0, 1, 1, 0]
    rows = {row["case"]: row for row in document["cases"]}
    assert set(rows) == {"CASE-1_R_1", "CASE-2_R_1"}
    assert abs(rows["CASE-1_R_1"]["long_mm"] - 10.0) < 1.5
