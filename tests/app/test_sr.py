"""DICOM SR export (``app.sr``, ``radcaliper export-sr``): a stored result of a real phantom
volume exported on SQLite and PostgreSQL, checked with dciodvfy and read back with highdicom."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pytest
from pydicom import Dataset
from sqlalchemy import select, update
from typer.testing import CliRunner

from app.cli import app
from app.sr import SOP_CLASSES, export_study_sr, tracking_uid
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import Measurement, ReviewAction, ReviewStatus, Run, Series, Study, User
from db.review import review_measurement
from ingestion.errors import NothingToExportError
from ingestion.geometry import Geometry
from ingestion.volume import Volume

from db_helpers import make_result, store_one

runner = CliRunner()
AXES = (((10.0, 12.0), (20.25, 30.5)), ((14.0, 25.0), (18.0, 17.0)))  # (row, column) pairs
SCT = {"long_axis": "103339001", "short_axis": "103340004", "diameter": "81827009"}
# awkward floats: the SR must carry them exactly, not rounded to 16 DS characters
VALUES = (31.234567890123456, 19.87654321098765, 24.681357913579246)


def _dciodvfy(path: Path) -> None:
    """dciodvfy reports no error (warnings are allowed); skipped without it, except in CI."""
    exe = shutil.which("dciodvfy")
    if exe is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("dciodvfy is missing in CI: deploy/ensure_dicom3tools.sh installs it")
        pytest.skip("dciodvfy (Debian package dicom3tools) is not installed")
    done = subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=60)
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("Error")]
    assert not errors, "\n".join(errors)


def _store(store: Store, volume: Volume, findings: bool = True) -> str:
    result = make_result(volume, values=VALUES)
    on_slice = [  # axes on each finding's slice, from (row, column) index pairs
        dataclasses.replace(
            f,
            axes_lps_mm=tuple(
                tuple(
                    tuple(volume.geometry.index_to_lps([f.slice_index, r, c]).tolist())
                    for r, c in pair
                )
                for pair in AXES[: len(f.measurements)]
            ),
        )
        for f in result.findings
    ]
    result = dataclasses.replace(result, findings=tuple(on_slice) if findings else ())
    store_one(store, result, volume)
    return result.study_instance_uid


def _items(node: Dataset) -> dict[str, list[Dataset]]:
    """Direct content items of an SR content item by concept name meaning."""
    out: dict[str, list[Dataset]] = {}
    for item in node.get("ContentSequence", []):
        out.setdefault(item.ConceptNameCodeSequence[0].CodeMeaning, []).append(item)
    return out


def _num(item: Dataset) -> tuple[float, str]:
    measured = item.MeasuredValueSequence[0]
    return float(measured.FloatingPointValue), measured.MeasurementUnitsCodeSequence[0].CodeValue


def _read_back(path: Path) -> tuple[Any, dict[str, Any]]:
    sr = hd.sr.srread(path)
    assert isinstance(sr, hd.sr.Comprehensive3DSR)
    groups = {str(g.tracking_uid): g for g in sr.content.get_image_measurement_groups()}
    return sr, groups


def _check_against_store(store: Store, path: Path, study_uid: str, axes: Any = AXES) -> Any:
    """Every exported value, unit, range, tracking UID and image reference equals the store's."""
    sr, groups = _read_back(path)
    with store.reader() as session:
        latest = (
            select(Run)
            .join(Run.series)
            .join(Series.study)
            .where(Study.study_instance_uid == study_uid)
            .order_by(Run.id.desc())
        )
        run = session.execute(latest).scalars().first()
        assert run is not None
        study = run.series.study
        assert sr.StudyInstanceUID == study_uid == study.study_instance_uid
        assert sr.PatientID == study.patient_id
        exported = 0
        for finding in run.findings:
            kept = [m for m in finding.measurements if m.status is not ReviewStatus.REJECTED]
            uid = tracking_uid(run, finding)
            if not kept:
                assert uid not in groups
                continue
            exported += 1
            group = groups[uid]
            assert group.tracking_identifier == f"finding {finding.number}"
            assert (
                group.finding_type.value
                == {"lesion": "52988006", "vessel": "59820001"}[finding.kind]
            )
            (image,) = group.source_images
            ref = image.ReferencedSOPSequence[0]
            assert ref.ReferencedSOPInstanceUID == finding.sop_instance_uid
            assert ref.ReferencedSOPClassUID == SOP_CLASSES[("CT", False)]
            algorithm = _items(group[0])
            suffix = " (NOT FOR CLINICAL USE)" if run.not_for_clinical_use else ""
            assert algorithm["Algorithm Name"][0].TextValue == run.model_name + suffix
            assert algorithm["Algorithm Version"][0].TextValue == run.model_version
            by_code = {m.name.value: m for m in group.get_measurements()}
            assert len(by_code) == len(kept)
            for row in kept:
                read = by_code[SCT[row.name]]
                value, unit = _num(read[0])
                corrected = row.status is ReviewStatus.CORRECTED
                if corrected:  # range, algorithm and axes are the model's, the value is not
                    assert not _items(read[0]) and not read.referenced_coordinates
                    assert value == row.reviewed_value_mm and unit == "mm"
                    continue
                assert value == row.value_mm
                assert unit == "mm" == row.unit
                (coordinates,) = read.referenced_coordinates
                assert coordinates.GraphicType == "POLYLINE"
                on_image = coordinates.ContentSequence[0].ReferencedSOPSequence[0]
                assert on_image.ReferencedSOPInstanceUID == finding.sop_instance_uid
                column_row = np.asarray(coordinates.GraphicData, dtype=np.float64).reshape(2, 2)
                k = [n.name for n in finding.measurements].index(row.name)
                if axes is not None:  # the (row, column) pairs the axes were made from
                    expected = np.asarray(axes[k], dtype=np.float64)[:, ::-1] + 0.5
                    np.testing.assert_allclose(column_row, expected, atol=1e-4)
                g = Geometry(**{n: tuple(v) for n, v in run.series.geometry.items()})
                index = g.lps_to_index(finding.axes_lps_mm["segments"][k])  # (slice, row, col)
                assert np.all(np.abs(index[:, 0] - finding.slice_index) <= 0.5)
                np.testing.assert_allclose(column_row, index[:, [2, 1]] + 0.5, atol=1e-3)
                props = _items(read[0])
                low, low_unit = _num(props["-, range of lower measurement uncertainty"][0])
                high, high_unit = _num(props["+, range of upper measurement uncertainty"][0])
                assert low_unit == high_unit == "mm"
                assert value - low == pytest.approx(row.range_low_mm, rel=1e-12)
                assert value + high == pytest.approx(row.range_high_mm, rel=1e-12)
            statuses = {
                q.name.meaning: q.value.meaning for q in group.get_qualitative_evaluations()
            }
            assert statuses == {
                f"Review status of {m.name.replace('_', ' ')}": str(m.status) for m in kept
            }
        assert len(groups) == exported
    return sr


def test_export_reads_back_the_stored_values(store: Store, volume: Volume, tmp_path: Path) -> None:
    study_uid = _store(store, volume)
    with store.reader() as session:
        done = export_study_sr(session, study_uid, tmp_path / "sr")
    assert done.path == tmp_path / "sr" / f"{study_uid}.sr.dcm" and done.groups == 2
    _dciodvfy(done.path)
    sr = _check_against_store(store, done.path, study_uid)
    assert sr.VerificationFlag == "UNVERIFIED" and "VerifyingObserverSequence" not in sr
    assert sr.SeriesDescription == "radcaliper (radcaliper-test 1.0.0, NOT FOR CLINICAL USE)"


def test_a_reviewed_study_is_verified_by_its_reviewers(
    store: Store, volume: Volume, users: dict[str, User], tmp_path: Path
) -> None:
    study_uid = _store(store, volume)
    with store.writer() as session:
        rows = session.execute(select(Measurement).order_by(Measurement.id)).scalars().all()
        ids = [m.id for m in rows]
    actions: list[tuple[str, dict[str, Any]]] = [
        ("alice", {"action": ReviewAction.ACCEPT}),
        ("bob", {"action": ReviewAction.CORRECT, "value_mm": 18.25, "reason": "edge"}),
        ("alice", {"action": ReviewAction.REJECT, "reason": "not a vessel"}),
    ]
    with store.reader() as session:
        partly = export_study_sr(session, study_uid, tmp_path / "partly")
    assert not partly.verified
    for mid, (name, kwargs) in zip(ids, actions, strict=True):
        with store.writer() as session:
            review_measurement(session, mid, reviewer=users[name], seen_version=1, **kwargs)
            session.commit()
    with store.reader() as session:
        done = export_study_sr(session, study_uid, tmp_path / "sr", organization="Site X")
        reviewed = {
            m.reviewer.name: m.reviewed_at
            for m in session.execute(select(Measurement)).scalars()
            if m.reviewer is not None
        }
    assert done.verified and done.groups == 1  # the vessel's only measurement was rejected
    _dciodvfy(done.path)
    sr = _check_against_store(store, done.path, study_uid)
    assert sr.VerificationFlag == "VERIFIED"
    observers = {o.VerifyingObserverName.family_name: o for o in sr.VerifyingObserverSequence}
    assert set(observers) == {"alice", "bob"}
    assert all(o.VerifyingOrganization == "Site X" for o in observers.values())
    for name, item in observers.items():
        at = datetime.strptime(item.VerificationDateTime, "%Y%m%d%H%M%S.%f%z")
        stored = reviewed[name]
        stored = stored if stored.tzinfo else stored.replace(tzinfo=UTC)  # SQLite: naive UTC
        assert abs((at - stored).total_seconds()) < 1e-3


def test_a_series_stored_before_schema_0002_has_no_axis_coordinates(
    store: Store, volume: Volume, tmp_path: Path
) -> None:
    study_uid = _store(store, volume)
    with store.writer() as session:
        session.execute(update(Series).values(geometry=None))
        session.commit()
        done = export_study_sr(session, study_uid, tmp_path / "sr")
    _dciodvfy(done.path)
    _, groups = _read_back(done.path)
    measurements = [m for g in groups.values() for m in g.get_measurements()]
    assert len(measurements) == 3 and not any(m.referenced_coordinates for m in measurements)


def test_a_study_without_findings_gets_no_sr(volume: Volume, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    try:
        study_uid = _store(store, volume, findings=False)
        with store.reader() as session, pytest.raises(NothingToExportError, match="no SR"):
            export_study_sr(session, study_uid, tmp_path / "sr")
        done = runner.invoke(app, ["export-sr", study_uid, str(tmp_path / "sr"), "--db", url])
    finally:
        store.dispose()
    assert done.exit_code == 2 and "has no measurement to export" in done.output
    assert not (tmp_path / "sr").exists()


def test_export_sr_command(store: Store, volume: Volume, tmp_path: Path) -> None:
    study_uid = _store(store, volume)
    url = str(store.url)
    done = runner.invoke(app, ["export-sr", study_uid, str(tmp_path / "out"), "--db", url])
    assert done.exit_code == 0, done.output
    assert "2 measurement group(s), UNVERIFIED" in done.stdout
    assert (tmp_path / "out" / f"{study_uid}.sr.dcm").is_file()
    unknown = runner.invoke(app, ["export-sr", "1.2.3.999", str(tmp_path / "x"), "--db", url])
    assert unknown.exit_code == 2
    assert "there is no study 1.2.3.999" in unknown.output
    assert "Traceback" not in unknown.output and not (tmp_path / "x").exists()
    helped = runner.invoke(app, ["export-sr", "--help"])
    assert helped.exit_code == 0 and "TID 1500" in helped.stdout and "--db" in helped.stdout


@pytest.mark.slow
def test_a_demo_model_measurement_exports(tmp_path: Path) -> None:
    """The demo model's real result on a phantom DICOM study, measured and stored by the CLI."""
    from ingestion.phantoms import write_phantoms
    from model.measurer.checkpoint import default_checkpoint

    assert default_checkpoint().is_dir(), f"the demo checkpoint is missing ({default_checkpoint()})"
    (study,) = write_phantoms(tmp_path / "ph", n=1, seed=4711)
    url = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    upgrade(url)
    measured = runner.invoke(app, ["measure", str(study / "dicom"), "--json", "--db", url])
    assert measured.exit_code == 0, measured.output
    study_uid = json.loads(measured.stdout)["study_instance_uid"]
    done = runner.invoke(app, ["export-sr", study_uid, str(tmp_path / "sr"), "--db", url])
    assert done.exit_code == 0, done.output
    path = tmp_path / "sr" / f"{study_uid}.sr.dcm"
    _dciodvfy(path)
    store = open_store(url)
    try:
        sr = _check_against_store(store, path, study_uid, axes=None)
    finally:
        store.dispose()
    assert "NOT FOR CLINICAL USE" in sr.SeriesDescription
