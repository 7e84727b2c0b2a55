"""``radcaliper dataset import SOURCE OUT --from reads``: readers' measurements into a dataset,
with the exit codes of ``dataset import`` (0 all imported, 1 some rows skipped, 2 nothing)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from app.cli import app
from ingestion.dataset.format import read_dataset

from tests.support.reads import COLUMNS, row, write_reads_folder, write_table

runner = CliRunner()


def _import(source: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(
        app, ["dataset", "import", str(source), str(out), "--from", "reads", *extra]
    )
    return result.exit_code, result.output


def test_reads_import_exit_0_then_1_with_the_skipped_row(tmp_path: Path) -> None:
    folder = write_reads_folder(tmp_path / "reads")
    out = tmp_path / "ds"
    code, output = _import(folder, out, "--annotator", "site readers")
    assert code == 0, output
    assert "Imported 3 series, 3 lesion (finding)" in output
    dataset = read_dataset(out)
    assert {s.patient_id for s in dataset.studies} == {"LIDC-IDRI-0001", "LIDC-IDRI-0002"}
    assert {f.provenance.annotator for f in dataset.findings} == {
        "site readers (median of 4)",
        "site readers (median of 3)",
    }
    rows = [
        row("LIDC-IDRI-0001_R_1", "LIDC-IDRI-0001", [8.1, 9.0, 8.6, 7.9], [5.2, 6.0, 5.5, 5.0]),
        row("LIDC-IDRI-0002_R_1", "LIDC-IDRI-0002", [6.2, 6.8], [4.1, 4.4], n_reads="4"),
    ]
    write_table(folder, rows)
    code, output = _import(folder, out)
    assert code == 1, output
    assert "skipped" in output and "line 3 (LIDC-IDRI-0002_R_1)" in output
    assert "n_reads is 4 but reads_long_mm has 2" in output
    assert len(read_dataset(out).findings) == 1  # the input's rows replaced


def test_not_a_reads_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, output = _import(tmp_path / "absent", tmp_path / "ds")
    assert code == 2 and "no such file or folder" in output
    code, output = _import(tmp_path, tmp_path / "ds")
    assert code == 2 and "reads.csv: no such file" in output
    write_table(tmp_path, [row("c", "p", [8.0], [5.0])], [c for c in COLUMNS if c != "n_reads"])
    code, output = _import(tmp_path, tmp_path / "ds")
    assert code == 2 and "no column n_reads" in output
    assert not (tmp_path / "ds").exists()


def test_help_names_the_reads_source() -> None:
    result = runner.invoke(app, ["dataset", "import", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "reads" in result.output and "reads.csv" in result.output
