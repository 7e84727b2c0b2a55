"""``radcaliper evaluate --dataset DIR --task click``: the demo model and the classical baseline
at the same clicks of lesions with readers' reads, every figure written (JSON, markdown, plots),
and the usage errors."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.cli.evaluate import CLICK_BEGIN, CLICK_END
from ingestion.dataset.format import write_import
from ingestion.dataset.reads import import_reads
from ingestion.phantoms import write_phantoms

from tests.support.reads import row, write_crop, write_table

runner = CliRunner()
ALL_SIDES = [
    a for side in ("train", "validation", "calibration", "test") for a in ("--split", side)
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three lesions in lung (about -800 HU) of two patients, each read by 3-4 readers."""
    root = tmp_path_factory.mktemp("clicks")
    rows = [
        row("LIDC-IDRI-0001_R_1", "LIDC-IDRI-0001", [8.1, 9.0, 8.6, 7.9], [5.2, 6.0, 5.5, 5.0]),
        row("LIDC-IDRI-0001_R_2", "LIDC-IDRI-0001", [10.5, 11.2, 9.9], [7.1, 7.7, 6.6]),
        row("LIDC-IDRI-0002_R_1", "LIDC-IDRI-0002", [6.2, 6.8, 7.0, 6.4], [4.1, 4.4, 4.9, 4.0]),
    ]
    for r in rows:
        write_crop(root / "source", r["case"], background_hu=-800.0, margin_px=12)
    write_table(root / "source", rows)
    write_import(root / "dataset", [import_reads(root / "source")])
    return root / "dataset"


def test_every_figure_for_the_model_and_the_baseline(dataset: Path, tmp_path: Path) -> None:
    out, md = tmp_path / "out", tmp_path / "RESULTS.md"
    md.write_text("# results\n")
    args = ["evaluate", "--dataset", str(dataset), "--task", "click", *ALL_SIDES, "--seed", "3"]
    done = runner.invoke(app, [*args, "--out", str(out), "--results-md", str(md)])
    assert done.exit_code == 0, done.output
    data = json.loads((out / "click_evaluation.json").read_text())
    assert stat.S_IMODE((out / "click_evaluation.json").stat().st_mode) == 0o600  # names cases
    assert "LIDC-IDRI" not in (out / "click_evaluation.md").read_text()
    assert data["lesions"] == 3 and data["seed"] == 3
    labels = sorted(data["measurers"], key=lambda label: "baseline" in label)  # model first
    assert len(labels) == 2 and labels[0].startswith("radcaliper-demo")
    assert labels[1].startswith("click-threshold-baseline")
    for label in labels:
        summary = data["measurers"][label]["summary"]
        assert summary["overall"]["n"] == 3
        assert set(summary["size_bins"]) == {"< 6 mm", "6-10 mm", "10-20 mm", ">= 20 mm"}
        assert sum(b["n"] for b in summary["size_bins"].values()) == 3
        assert summary["seconds_per_click"]["clicks"] >= 9  # 3 clicks per lesion at least
        cases = data["measurers"][label]["cases"]
        assert [len(c["extra"]) for c in cases] == [2, 2, 2]
        assert all(c["outside"] is not None for c in cases)  # lung to click in
        assert {c["patient"] for c in cases} == {"LIDC-IDRI-0001", "LIDC-IDRI-0002"}
    baseline = data["measurers"][labels[1]]["summary"]["overall"]
    assert baseline["measured"] == 3  # a bright lesion in lung: the yardstick segments it
    assert baseline["long_axis"]["mae_mm"] < 2.0
    text = (out / "click_evaluation.md").read_text()
    for figure in ("long axis MAE", "readers' long MAE, LOO", "coverage", "nothing here",
                   "three clicks", "seconds per click", ">= 20 mm"):  # fmt: skip
        assert figure in text, figure
    assert (out / "predicted_vs_true.png").stat().st_size > 1000
    assert len(list(out.glob("bland_altman_*.png"))) == 2
    results = md.read_text()
    assert results.startswith("# results") and results.count(CLICK_BEGIN) == 1
    assert CLICK_END in results and "long axis MAE" in results


def test_the_test_side_alone_and_nothing_to_click(dataset: Path, tmp_path: Path) -> None:
    from ingestion.dataset.split import Side, side_of

    sides = {side_of("LIDC-IDRI-0001"), side_of("LIDC-IDRI-0002")}
    done = runner.invoke(
        app, ["evaluate", "--dataset", str(dataset), "--task", "click", "--out", str(tmp_path)]
    )
    if Side.TEST in sides:
        assert done.exit_code == 0, done.output
    else:  # the default is the test side: these patients are elsewhere
        assert done.exit_code == 2
        assert "no lesion on the test side" in done.output


def test_usage_errors_are_exit_2_with_the_reason(tmp_path: Path) -> None:
    no_dataset = runner.invoke(app, ["evaluate", "--task", "click"])
    assert no_dataset.exit_code == 2 and "--task click needs --dataset" in no_dataset.output
    split_alone = runner.invoke(app, ["evaluate", "--split", "test", "--quick"])
    assert split_alone.exit_code == 2 and "--split goes with" in split_alone.output
    bad_side = runner.invoke(
        app, ["evaluate", "--dataset", str(tmp_path), "--task", "click", "--split", "holdout"]
    )
    assert bad_side.exit_code == 2 and "holdout" in bad_side.output
    bad_task = runner.invoke(app, ["evaluate", "--dataset", str(tmp_path), "--task", "guess"])
    assert bad_task.exit_code == 2 and "guess" in bad_task.output
    missing = runner.invoke(
        app, ["evaluate", "--dataset", str(tmp_path / "nope"), "--task", "click"]
    )
    assert missing.exit_code == 2 and "nope" in missing.output
    phantoms = tmp_path / "phantoms"
    write_phantoms(phantoms, n=1, seed=5)
    ds = tmp_path / "ds"
    imported = runner.invoke(
        app, ["dataset", "import", str(phantoms), str(ds), "--from", "phantoms"]
    )
    assert imported.exit_code == 0, imported.output
    no_reads = runner.invoke(
        app,
        [
            "evaluate",
            "--dataset",
            str(ds),
            "--task",
            "click",
            *ALL_SIDES,
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert no_reads.exit_code == 2 and "split by patient" in no_reads.output
    assert "Loading weights" not in no_reads.output  # refused before the model loads
    help_text = runner.invoke(app, ["evaluate", "--help"]).output
    assert "--task" in help_text and "--split" in help_text
