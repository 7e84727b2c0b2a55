"""Issue 41, item 7: what radcaliper writes of a patient for someone to pick up, an exported SR
(``export-sr``, ``batch --export-sr``) and a study uploaded in the UI, is readable by its owner
only (0600 files, 0700 folders it creates), whatever the umask (0o022 here, the usual one)."""

from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.sr import export_study_sr
from app.ui.uploads import receive_upload
from db.engine import Store
from ingestion.volume import Volume

from tests.support.db import make_result, store_one

runner = CliRunner()


@pytest.fixture
def usual_umask() -> Iterator[None]:
    mask = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(mask)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_an_exported_sr_is_the_owners_only(
    store: Store, volume: Volume, tmp_path: Path, usual_umask: None
) -> None:
    result = make_result(volume)
    store_one(store, result, volume)
    study_uid = result.study_instance_uid
    out = tmp_path / "pacs" / "outbox"  # neither folder there yet
    done = runner.invoke(app, ["export-sr", study_uid, str(out), "--db", str(store.url)])
    assert done.exit_code == 0, done.output
    (written,) = out.iterdir()
    assert written.name == f"{study_uid}.sr.dcm" and _mode(written) == 0o600
    assert _mode(out) == _mode(tmp_path / "pacs") == 0o700
    # an existing folder (a PACS gateway's outbox) keeps its mode; the file is still private
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    with store.reader() as session:
        again = export_study_sr(session, study_uid, shared)
    assert _mode(again.path) == 0o600 and _mode(shared) == 0o755
    assert [p.name for p in shared.iterdir()] == [again.path.name]  # no .partial left


def test_an_upload_is_kept_for_the_owner_only(tmp_path: Path, usual_umask: None) -> None:
    archive = tmp_path / "study.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("study/series/1.dcm", b"a")
        zipped.writestr("study/2.dcm", b"b")
    uploads = tmp_path / "data" / "uploads"
    kept = receive_upload(archive, uploads, max_bytes=10**6)
    nifti = tmp_path / "scan.nii.gz"
    nifti.write_bytes(b"\x1f\x8b fake")
    stored = receive_upload(nifti, uploads, max_bytes=10**6)
    assert kept.kind == "dicom" and stored.kind == "nifti"
    made = [tmp_path / "data", uploads, *uploads.rglob("*")]
    assert len([p for p in made if p.is_file()]) == 3
    for path in made:
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), path
