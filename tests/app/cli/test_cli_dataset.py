"""``radcaliper dataset import|show`` and the commands that read datasets: ``evaluate
--dataset``, ``train --dataset`` (mixed with phantoms) and ``calibrate --dataset``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.cli.evaluate import DATASET_BEGIN, DATASET_END
from ingestion.dataset.format import read_dataset
from ingestion.phantoms import write_phantoms
from model.measurer.checkpoint.settings import SETTINGS_NAME

from tests.support.measurer import TINY

runner = CliRunner()


@pytest.fixture(scope="module")
def phantoms(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-dataset") / "phantoms"
    write_phantoms(root, n=2, seed=8202)
    return root


def test_import_is_idempotent_and_show_lists_it(phantoms: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    first = runner.invoke(app, ["dataset", "import", str(phantoms), str(out), "--from", "phantoms"])
    assert first.exit_code == 0, first.output
    assert "Imported 2 series, 4 lesion (finding), 2 vessel (finding)" in first.output
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    again = runner.invoke(app, ["dataset", "import", str(phantoms), str(out), "--from", "phantoms"])
    assert again.exit_code == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files  # same rows, byte for byte
    shown = runner.invoke(app, ["dataset", "show", str(out)])
    assert shown.exit_code == 0 and "phantoms" in shown.output
    row = next(line for line in shown.output.splitlines() if "phantoms" in line)
    assert [cell.strip() for cell in row.split("│")[3:8]] == ["2", "4", "2", "0", "0"]
    assert len(read_dataset(out).findings) == 6


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = runner.invoke(
        app, ["dataset", "import", str(tmp_path / "nope"), str(tmp_path / "ds"), "--from", "sr"]
    )
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    wrong = runner.invoke(app, ["dataset", "import", str(tmp_path), str(tmp_path), "--from", "x"])
    assert wrong.exit_code == 2 and "masks" in wrong.output  # the choices
    nothing = runner.invoke(
        app, ["dataset", "import", str(tmp_path), str(tmp_path / "new"), "--from", "sr"]
    )
    assert nothing.exit_code == 2 and "no DICOM SR file under this folder" in nothing.output
    assert "was not made" in nothing.output and not (tmp_path / "new").exists()
    evaluated = runner.invoke(app, ["evaluate", "--dataset", str(tmp_path)])
    assert evaluated.exit_code == 2 and "not a radcaliper dataset" in evaluated.output
    assert "Loading weights" not in evaluated.output  # the folder is checked before the model
    not_dataset = runner.invoke(app, ["dataset", "show", str(tmp_path)])
    assert not_dataset.exit_code == 2 and "not a radcaliper dataset" in not_dataset.output
    assert "Traceback" not in not_dataset.output


def test_evaluate_train_and_calibrate_read_a_dataset(phantoms: Path, tmp_path: Path) -> None:
    data = tmp_path / "ds"
    runner.invoke(app, ["dataset", "import", str(phantoms), str(data), "--from", "phantoms"])
    results = tmp_path / "RESULTS.md"
    results.write_text(f"# R\n\n{DATASET_BEGIN}\nold\n{DATASET_END}\nafter\n")
    evaluated = runner.invoke(
        app, ["evaluate", "--dataset", str(data), "--results-md", str(results)]
    )
    assert evaluated.exit_code == 0, evaluated.output
    out = data / "evaluation"
    folder = next(out.iterdir())  # MODEL-VERSION
    assert folder.name.startswith("radcaliper-demo-")
    summary = json.loads((folder / "evaluation.json").read_text())
    assert summary["model"]["not_for_clinical_use"] is True
    assert summary["summary"]["studies"] == 2 and len(summary["studies"]) == 2
    assert summary["summary"]["vessels"] == 2
    assert {"bland_altman", "recall_by_size", "coverage", "answers_parsed"} <= set(
        summary["summary"]
    )
    assert {p.name for p in folder.iterdir()} >= {
        "evaluation.md",
        "agreement.png",
        "predicted_vs_true.png",
    }
    text = results.read_text()
    assert "old" not in text and "| lesions >= 10 mm found |" in text and "after" in text

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY.to_json()))
    model = tmp_path / "model"
    trained = runner.invoke(
        app, ["train", str(model), "--config", str(config), "--dataset", f"{data}:2,phantoms:1"]
    )
    assert trained.exit_code == 0, trained.output
    source = json.loads((model / SETTINGS_NAME).read_text())["training"]["source"]
    assert source["source"] == "mixed"
    assert [p["source"] for p in source["parts"]] == ["dataset", "phantoms"]
    assert source["parts"][0]["path"] == str(data.resolve())
    both = runner.invoke(
        app, ["train", str(model), "--dataset", str(data), "--phantoms", str(phantoms)]
    )
    assert both.exit_code == 2 and "not both" in both.output
    bad = runner.invoke(app, ["train", str(model), "--dataset", f"{data}:zero:0"])
    assert bad.exit_code == 2 and "weight must be > 0" in bad.output

    restricted = tmp_path / "nc"
    runner.invoke(
        app,
        [
            *("dataset", "import", str(phantoms), str(restricted)),
            *("--from", "phantoms", "--licence", "CC BY-NC 3.0"),
        ],
    )
    warned = runner.invoke(
        app,
        [
            *("train", str(tmp_path / "m2"), "--config", str(config), "--steps", "1"),
            *("--dataset", f"{restricted},phantoms"),
        ],
    )
    assert warned.exit_code == 0, warned.output
    assert "training data under 'CC BY-NC 3.0'" in warned.output

    untrained = runner.invoke(app, ["calibrate", str(model), "--dataset", str(data)])
    assert untrained.exit_code == 2 and "nothing to calibrate against" in untrained.output


def test_sr_round_trip_through_a_dataset_gives_back_the_srs_values(
    phantoms: Path, tmp_path: Path
) -> None:
    """measure -> store -> export-sr -> dataset import --from sr -> evaluate --dataset: the
    same model measuring the same study again matches every finding of its own SR, with its
    values (the SR carries them exactly)."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    dicom = phantoms / "phantom_0000" / "dicom"
    measured = runner.invoke(app, ["measure", str(dicom), "--db", url, "--json"])
    assert measured.exit_code == 0, measured.output
    result = json.loads(measured.stdout)
    exported = runner.invoke(
        app, ["export-sr", result["study_instance_uid"], str(tmp_path / "sr"), "--db", url]
    )
    assert exported.exit_code == 0, exported.output
    data = tmp_path / "ds"
    imported = runner.invoke(
        app,
        [
            "dataset",
            "import",
            str(tmp_path / "sr"),
            str(data),
            "--from",
            "sr",
            "--images",
            str(dicom),
        ],
    )
    assert imported.exit_code == 0, imported.output
    rows = read_dataset(data).findings
    values = sorted(
        m["value_mm"] for f in result["findings"] for m in f["measurements"] if m["value_mm"]
    )
    assert sorted(
        v for r in rows for v in (r.long_axis_mm, r.short_axis_mm, r.diameter_mm) if v
    ) == pytest.approx(values, abs=1e-9)
    evaluated = runner.invoke(
        app, ["evaluate", "--dataset", str(data), "--out", str(tmp_path / "e")]
    )
    assert evaluated.exit_code == 0, evaluated.output
    summary = json.loads((tmp_path / "e" / "evaluation.json").read_text())["summary"]
    assert summary["lesions_10mm"] + summary["vessels"] == len(rows) == len(result["findings"])
    assert summary["lesion_recall_10mm"] in (1.0, None) and summary["vessel_recall"] in (1.0, None)
    assert all(mae == pytest.approx(0.0, abs=1e-6) for mae in summary["mae_mm"].values())
    assert summary["false_findings"] == 0 and summary["unjudged_findings"] == 0


REAL = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "real-ct"


@pytest.mark.skipif(
    not (REAL / "cases.json").is_file(), reason=f"the real CT development set is not at {REAL}"
)
def test_evaluate_on_real_cases_end_to_end(tmp_path: Path) -> None:
    """Real CT and MR through the commands a site uses: the CT nodule is measured and scored,
    the MR study is refused and its tumour counted apart."""
    cases = {c["id"]: c for c in json.loads((REAL / "cases.json").read_text())["cases"]}
    data = tmp_path / "real"
    for case_id in ("lidc0314_nodule", "mr_brain2"):
        case = cases[case_id]
        labels = tmp_path / f"{case_id}.json"
        labels.write_text(json.dumps(case["label_map"]))
        folder = REAL / case["input"].split("/")[0]
        imported = runner.invoke(
            app,
            [
                *("dataset", "import", str(folder / "labels.nii.gz"), str(data)),
                *("--from", "masks", "--image", str(REAL / case["input"])),
                *("--labels", str(labels), "--modality", case["modality"]),
                *("--licence", case["source"]["licence"]),
            ],
        )
        assert imported.exit_code == 0, imported.output
    evaluated = runner.invoke(
        app, ["evaluate", "--dataset", str(data), "--out", str(tmp_path / "e")]
    )
    assert evaluated.exit_code == 0, evaluated.output
    result = json.loads((tmp_path / "e" / "evaluation.json").read_text())
    by_case = {Path(s["image"]).parent.name: s for s in result["studies"]}
    nodule, brain = by_case["lidc0314_nodule"], by_case["mr_brain2"]
    assert not nodule["refused"] and nodule["true_findings"] == 1 and nodule["seconds"] > 0
    assert brain["refused"] and "MR" in brain["error"]
    summary = result["summary"]
    assert (summary["studies"], summary["refused"]) == (2, 1)
    assert summary["lesions_10mm"] == 1 and summary["findings_in_refused_studies"] == 1
    assert "| lidc0314_nodule/dicom | 1 |" in evaluated.output


@pytest.mark.skipif(
    not (REAL / "cases.json").is_file(), reason=f"the real CT backgrounds are not at {REAL}"
)
def test_train_hold_out_names_hybrid_backgrounds_only(tmp_path: Path) -> None:
    """--hold-out without a hybrid source is refused before anything is trained; an unknown
    background is named (nothing written either way)."""
    alone = runner.invoke(app, ["train", str(tmp_path / "a"), "--hold-out", "lidc0314_nodule"])
    assert alone.exit_code == 2 and "use it with --dataset hybrid" in alone.output
    unknown = runner.invoke(
        app,
        ["train", str(tmp_path / "b"), "--dataset", "hybrid", "--hold-out", "no_such_case"],
    )
    assert unknown.exit_code == 2 and "no_such_case" in unknown.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
