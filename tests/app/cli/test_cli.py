"""The command line: inspect's contract, exit codes, help texts, start-up imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app

from tests.support.series import SeriesFactory

runner = CliRunner()


def test_inspect_json_contract(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "study" / "ct", n=5, gap=2.0)
    (tmp_path / "study" / "junk.txt").write_text("hello")
    result = runner.invoke(app, ["inspect", str(tmp_path / "study"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (series,) = report["series"]
    assert series["series_instance_uid"] == written.series_uid
    assert series["study_instance_uid"] == written.study_uid
    assert series["modality"] == "CT"
    assert series["dimensions"] == {"rows": 8, "columns": 10, "slices": 5}
    assert series["spacing_mm"] == {"row": 0.7, "column": 0.8, "slice": 2.0}
    assert series["orientation"]["plane"] == "axial"
    assert series["orientation"]["row_direction"] == [1.0, 0.0, 0.0]
    (rejected,) = report["rejected"]
    assert rejected["path"].endswith("junk.txt") and "not a DICOM file" in rejected["reason"]


def test_inspect_table_output(tmp_path: Path, write_series: SeriesFactory) -> None:
    write_series(tmp_path / "s", n=3)
    result = runner.invoke(app, ["inspect", str(tmp_path / "s")])
    assert result.exit_code == 0
    assert "8 x 10 x 3" in result.stdout and "axial" in result.stdout


def test_headers_only_does_not_decode(tmp_path: Path, write_series: SeriesFactory) -> None:
    write_series(tmp_path / "s", n=3)
    result = runner.invoke(app, ["inspect", str(tmp_path / "s"), "--json", "--headers-only"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["series"][0]["dimensions"]["slices"] == 3


@pytest.mark.parametrize("content", [None, b"", b"garbage" * 100])
def test_nothing_usable_exits_2_without_traceback(tmp_path: Path, content: bytes | None) -> None:
    target = tmp_path / "thing"
    if content is not None:
        target.write_bytes(content)
    result = runner.invoke(app, ["inspect", str(target)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "No usable CT/MR series" in result.stdout


def test_inspect_whole_pydicom_corpus_never_tracebacks(pydicom_test_dir: Path) -> None:
    result = runner.invoke(app, ["inspect", str(pydicom_test_dir), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["series"]) >= 5 and len(report["rejected"]) >= 50


def _commands() -> list[list[str]]:
    import typer.main

    group = typer.main.get_command(app)
    return [[]] + [[name] for name in group.commands]  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "radcaliper")
def test_every_command_has_help(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.stdout
    assert len(result.stdout.split()) > 15  # a description, not just the usage line


def test_bad_setting_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["inspect", str(tmp_path)], env={"RADCALIPER_LOG_LEVEL": "LOUD"})
    assert result.exit_code == 2
    assert "invalid RADCALIPER_* setting" in result.output
    assert "Traceback" not in result.output


PROBE = """
import sys
from app.cli import main
sys.argv = {argv!r}
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "monai", "gradio") if m in sys.modules)
sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
"""


@pytest.mark.parametrize("argv", [["radcaliper", "--help"], ["radcaliper", "inspect", "{dir}"]])
def test_help_and_inspect_do_not_import_torch_or_transformers(
    argv: list[str], pydicom_test_dir: Path
) -> None:
    argv = [a.replace("{dir}", str(pydicom_test_dir / "CT_small.dcm")) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
        check=False,
    )
    assert "HEAVY=\n" in proc.stderr, proc.stderr
