"""DICOM SR export (``app.sr``, ``radcaliper export-sr``): a stored result of a real phantom
volume exported on SQLite and PostgreSQL, checked with dciodvfy and read back with highdicom."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import highdicom as hd
import pytest
from pydicom import Dataset
from sqlalchemy import select, update
from typer.testing import CliRunner

from app.cli import app
from app.sr import export_study_sr
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import Measurement, ReviewAction, ReviewStatus, Series, Study, User
from db.review import review_measurement
from ingestion.errors import NothingToExportError
from ingestion.volume import Volume

from tests.support.db import make_result, store_one
from tests.support.sr import (
    SCT,
    _num,
    _read_back,
    check_against_store,
    dciodvfy,
    sr_values,
    store_study,
)

runner = CliRunner()


def test_export_reads_back_the_stored_values(store: Store, volume: Volume, tmp_path: Path) -> None:
    study_uid = store_study(store, volume)
    with store.reader() as session:
        done = export_study_sr(session, study_uid, tmp_path / "sr")
    assert done.path == tmp_path / "sr" / f"{study_uid}.sr.dcm" and done.groups == 2
    dciodvfy(done.path)
    sr = check_against_store(store, done.path, study_uid)
    assert sr.VerificationFlag == "UNVERIFIED" and "VerifyingObserverSequence" not in sr
    assert sr.SeriesDescription == "radcaliper (radcaliper-test 1.0.0, NOT FOR CLINICAL USE)"


def test_a_reviewed_study_is_verified_by_its_reviewers(
    store: Store, volume: Volume, users: dict[str, User], tmp_path: Path
) -> None:
    study_uid = store_study(store, volume)
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
    dciodvfy(done.path)
    sr = check_against_store(store, done.path, study_uid)
    assert sr.VerificationFlag == "VERIFIED"
    observers = {o.VerifyingObserverName.family_name: o for o in sr.VerifyingObserverSequence}
    assert set(observers) == {"alice", "bob"}
    assert all(o.VerifyingOrganization == "Site X" for o in observers.values())
    for name, item in observers.items():
        at = datetime.strptime(item.VerificationDateTime, "%Y%m%d%H%M%S.%f%z")
        stored = reviewed[name]
        stored = stored if stored.tzinfo else stored.replace(tzinfo=UTC)  # SQLite: naive UTC
        assert abs((at - stored).total_seconds()) < 1e-3


def test_an_axis_that_contradicts_its_value_is_left_out(
    store: Store, volume: Volume, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A measurement is a caliper: a stored long axis 2 mm longer than its line (a model whose
    values and axes disagree) is exported without the line, with a warning; the short axis,
    its line a pixel's fraction off, keeps it."""
    study_uid = store_study(store, volume)
    long_mm, short_mm, _ = sr_values(volume)
    with store.writer() as session:
        long_axis, short_axis, _ = session.execute(
            select(Measurement).order_by(Measurement.id)
        ).scalars()
        long_axis.value_mm = long_mm + 2.0
        short_axis.value_mm = short_mm + 0.25
        session.commit()
    with store.reader() as session, caplog.at_level("WARNING", logger="app.sr"):
        done = export_study_sr(session, study_uid, tmp_path / "sr")
    dciodvfy(done.path)
    check_against_store(store, done.path, study_uid)
    _, groups = _read_back(done.path)
    lesion = next(g for g in groups.values() if g.tracking_identifier == "finding 1")
    by_code = {m.name.value: m for m in lesion.get_measurements()}
    assert _num(by_code[SCT["long_axis"]][0]) == (long_mm + 2.0, "mm")
    assert not by_code[SCT["long_axis"]].referenced_coordinates
    assert by_code[SCT["short_axis"]].referenced_coordinates
    (warned,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"finding 1, measurement {long_axis.id}" in warned
    assert "differ by more than a pixel" in warned and "the axis is left out" in warned


def test_a_series_stored_before_schema_0002_has_no_axis_coordinates(
    store: Store, volume: Volume, tmp_path: Path
) -> None:
    study_uid = store_study(store, volume)
    with store.writer() as session:
        session.execute(update(Series).values(geometry=None))
        session.commit()
        done = export_study_sr(session, study_uid, tmp_path / "sr")
    dciodvfy(done.path)
    _, groups = _read_back(done.path)
    measurements = [m for g in groups.values() for m in g.get_measurements()]
    assert len(measurements) == 3 and not any(m.referenced_coordinates for m in measurements)


def test_a_study_without_findings_gets_no_sr(volume: Volume, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    try:
        study_uid = store_study(store, volume, findings=False)
        with store.reader() as session, pytest.raises(NothingToExportError, match="no SR"):
            export_study_sr(session, study_uid, tmp_path / "sr")
        done = runner.invoke(app, ["export-sr", study_uid, str(tmp_path / "sr"), "--db", url])
    finally:
        store.dispose()
    assert done.exit_code == 2 and "has no measurement to export" in done.output
    assert not (tmp_path / "sr").exists()


def test_export_sr_command(store: Store, volume: Volume, tmp_path: Path) -> None:
    study_uid = store_study(store, volume)
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
    from model.measurer.checkpoint.settings import default_checkpoint

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
    dciodvfy(path)
    store = open_store(url)
    try:
        sr = check_against_store(store, path, study_uid, axes=None)
    finally:
        store.dispose()
    assert "NOT FOR CLINICAL USE" in sr.SeriesDescription


# --- implausible stored values (issue 21) --------------------------------------------------------


def _accept_all(store: Store, users: dict[str, User]) -> list[int]:
    with store.reader() as session:
        ids = list(session.execute(select(Measurement.id).order_by(Measurement.id)).scalars())
    for mid in ids:
        with store.writer() as session:
            review_measurement(
                session, mid, action="accept", reviewer=users["alice"], seen_version=1
            )
            session.commit()
    return ids


def test_implausible_stored_values_are_left_out_and_the_sr_is_not_verified(
    store: Store,
    volume: Volume,
    users: dict[str, User],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 1e308 mm correction and an infinite model value, written with SQL as a database from
    before the checks (or edited by hand) holds them: the SR is still written, without them,
    with a warning each, and is not VERIFIED although every measurement is reviewed."""
    study_uid = store_study(store, volume)
    long_axis, short_axis, diameter = _accept_all(store, users)
    with store.writer() as session:
        session.execute(
            update(Measurement)
            .where(Measurement.id == long_axis)
            .values(status=ReviewStatus.CORRECTED, reviewed_value_mm=1e308)
        )
        session.execute(
            update(Measurement).where(Measurement.id == diameter).values(value_mm=float("inf"))
        )
        session.commit()
    with store.reader() as session, caplog.at_level("WARNING", logger="app.sr"):
        done = export_study_sr(session, study_uid, tmp_path / "sr")
    assert done.groups == 1 and not done.verified  # the vessel had only its diameter
    assert len(done.left_out) == 2
    assert (
        f"measurement {long_axis} (corrected): 1e+308 mm is not a plausible long axis"
        in (done.left_out[0])
    )
    assert (
        f"measurement {diameter} (accepted): inf mm is not a plausible diameter"
        in (done.left_out[1])
    )
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [f"SR: left out {why}" for why in done.left_out]
    dciodvfy(done.path)
    sr, groups = _read_back(done.path)
    assert (sr.VerificationFlag, sr.CompletionFlag) == ("UNVERIFIED", "PARTIAL")
    (group,) = groups.values()
    (read,) = group.get_measurements()
    assert read.name.value == SCT["short_axis"] and _num(read[0]) == (sr_values(volume)[1], "mm")
    with store.reader() as session:
        row = session.get(Measurement, short_axis)
        assert row is not None and row.value_mm == sr_values(volume)[1]
    command = ["export-sr", study_uid, str(tmp_path / "cli"), "--db", str(store.url)]
    done_by_cli = runner.invoke(app, command)
    assert done_by_cli.exit_code == 0, done_by_cli.output
    assert "1 measurement group(s), UNVERIFIED, 2 implausible value(s) left out" in (
        done_by_cli.stdout
    )


def test_an_sr_of_implausible_values_only_is_not_written(
    store: Store, volume: Volume, tmp_path: Path
) -> None:
    study_uid = store_study(store, volume)
    with store.writer() as session:
        session.execute(update(Measurement).values(value_mm=0.0))
        session.commit()
        with pytest.raises(NothingToExportError, match=r"3 left out as implausible"):
            export_study_sr(session, study_uid, tmp_path / "sr")
    assert not (tmp_path / "sr").exists()


# --- non-ASCII identifiers (issue 21) ------------------------------------------------------------

PATIENT_ID = "PAT-Ünïcödé-日本"
PATIENT_NAME = "Ünïcödé^Tarō=山田^太郎"  # alphabetic = ideographic component groups


def _check_identifiers(path: Path, patient_id: str, patient_name: str) -> None:
    dciodvfy(path)
    sr = hd.sr.srread(path)
    assert sr.SpecificCharacterSet == "ISO_IR 192"
    assert sr.PatientID == patient_id
    assert str(sr.PatientName) == patient_name
    raw = path.read_bytes()
    assert patient_id.encode("utf-8") in raw and b"??" not in raw


def test_non_ascii_patient_id_and_name_survive_store_and_sr(
    store_factory: Any, volume: Volume, tmp_path: Path
) -> None:
    """Kept as they are; a pseudonymised patient's SR has the (ASCII) pseudonym and no name."""
    ids = dataclasses.replace(volume.identifiers, patient_id=PATIENT_ID, patient_name=PATIENT_NAME)
    named = dataclasses.replace(volume, identifiers=ids)
    store = store_factory()
    study_uid = store_study(store, named)
    with store.reader() as session:
        study = session.execute(select(Study)).scalar_one()
        assert (study.patient_id, study.patient_name) == (PATIENT_ID, PATIENT_NAME)
        done = export_study_sr(session, study_uid, tmp_path / "sr")
    _check_identifiers(done.path, PATIENT_ID, PATIENT_NAME)
    check_against_store(store, done.path, study_uid)

    pseudonymised = store_factory()
    store_one(pseudonymised, make_result(named), named, pseudonym_key="site secret")
    with pseudonymised.reader() as session:
        hidden = export_study_sr(session, study_uid, tmp_path / "pseudonymised")
    dciodvfy(hidden.path)
    sr = hd.sr.srread(hidden.path)
    assert sr.PatientName == "" and sr.PatientID not in ("", PATIENT_ID)
    assert "SpecificCharacterSet" not in sr  # a pseudonym is ASCII


def test_any_non_ascii_text_makes_the_sr_utf8(
    store: Store, volume: Volume, users: dict[str, User], tmp_path: Path
) -> None:
    """Not only the patient: any text that is not ASCII (here the verifying organization)
    makes the document UTF-8; an all-ASCII document keeps the default repertoire."""
    study_uid = store_study(store, volume)
    with store.reader() as session:
        plain = export_study_sr(session, study_uid, tmp_path / "plain")
    assert "SpecificCharacterSet" not in hd.sr.srread(plain.path)
    _accept_all(store, users)
    with store.reader() as session:
        done = export_study_sr(session, study_uid, tmp_path / "sr", organization="Hôpital 東京")
    dciodvfy(done.path)
    sr = hd.sr.srread(done.path)
    assert sr.SpecificCharacterSet == "ISO_IR 192" and sr.VerificationFlag == "VERIFIED"
    (observer,) = sr.VerifyingObserverSequence
    assert (str(observer.VerifyingObserverName), observer.VerifyingOrganization) == (
        "alice^",
        "Hôpital 東京",
    )


def test_a_utf8_dicom_series_keeps_its_patient_in_the_sr(
    store: Store, write_series: Any, tmp_path: Path
) -> None:
    """The whole way from the source: a DICOM series in ISO_IR 192 with a non-ASCII patient
    id and name, loaded, measured (a hand-made result: this is about identifiers), stored and
    exported."""
    from ingestion.load import load_path

    def utf8_patient(ds: Dataset, index: int) -> None:
        ds.SpecificCharacterSet = "ISO_IR 192"
        ds.PatientID = PATIENT_ID
        ds.PatientName = PATIENT_NAME

    write_series(tmp_path / "dicom", n=6, mutate=utf8_patient)
    (volume,) = load_path(tmp_path / "dicom").volumes
    assert volume.identifiers.patient_id == PATIENT_ID
    assert volume.identifiers.patient_name == PATIENT_NAME
    result = make_result(volume)
    store_one(store, result, volume)
    with store.reader() as session:
        done = export_study_sr(session, result.study_instance_uid, tmp_path / "sr")
    _check_identifiers(done.path, PATIENT_ID, PATIENT_NAME)
    _, groups = _read_back(done.path)
    values = sorted(_num(m[0])[0] for g in groups.values() for m in g.get_measurements())
    assert values == [20.0, 25.0, 30.0]  # make_result's (no axes: a result without them)
