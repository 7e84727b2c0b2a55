"""Storing results: what lands in each table, idempotency, new model versions, pseudonyms."""

from __future__ import annotations

import dataclasses

from sqlalchemy import func, select

from db.engine import Store, in_memory
from db.models import AuditEvent, Finding, Measurement, ReviewStatus, Run, Series, Study
from db.store import input_fingerprint, pseudonym
from ingestion.volume import Volume

from tests.support.db import make_result, store_one


def _count(store: Store, table: type) -> int:
    with store.reader() as session:
        return int(session.execute(select(func.count()).select_from(table)).scalar_one())


def _store(store: Store, volume: Volume, **kwargs: object) -> tuple[int, bool]:
    outcome = store_one(store, make_result(volume, **kwargs), volume)  # type: ignore[arg-type]
    return outcome.run_id, outcome.created


def test_a_result_lands_in_every_table(store: Store, volume: Volume) -> None:
    run_id, created = _store(store, volume)
    assert created
    with store.reader() as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert (run.model_name, run.model_version, run.numeric_mode) == (
            "radcaliper-test",
            "1.0.0",
            "rned_corr",
        )
        assert run.not_for_clinical_use and run.input_fingerprint == input_fingerprint(volume)
        series = session.get(Series, run.series_id)
        assert series is not None
        assert series.series_instance_uid == volume.identifiers.series_instance_uid
        assert series.shape == dict(zip(("slices", "rows", "columns"), volume.shape, strict=True))
        study = session.get(Study, series.study_id)
        assert study is not None and study.patient_id == volume.identifiers.patient_id
        findings = session.execute(select(Finding).order_by(Finding.number)).scalars().all()
        assert [(f.number, f.kind) for f in findings] == [(1, "lesion"), (2, "vessel")]
        assert findings[0].sop_instance_uid == volume.identifiers.sop_instance_uids[4]
        rows = session.execute(select(Measurement).order_by(Measurement.id)).scalars().all()
        assert [(m.name, m.value_mm, m.unit) for m in rows] == [
            ("long_axis", 30.0, "mm"),
            ("short_axis", 20.0, "mm"),
            ("diameter", 25.0, "mm"),
        ]
        assert rows[0].range_low_mm == 28.0 and rows[0].coverage == 0.9
        assert all(m.status is ReviewStatus.PENDING and m.version == 1 for m in rows)
        actions = session.execute(select(AuditEvent.action).order_by(AuditEvent.id)).scalars()
        assert list(actions) == ["schema.upgraded", "run.stored"] + ["measurement.created"] * 3


def test_the_same_run_is_stored_once(store: Store, volume: Volume) -> None:
    first, _ = _store(store, volume)
    counts = {t: _count(store, t) for t in (Run, Measurement, AuditEvent)}
    again, created = _store(store, volume)
    assert (again, created) == (first, False)
    assert {t: _count(store, t) for t in counts} == counts


def test_a_new_model_version_adds_a_run_and_keeps_the_old(store: Store, volume: Volume) -> None:
    old, _ = _store(store, volume)
    new, created = _store(store, volume, version="1.1.0", values=(31.0, 19.0, 24.0))
    assert created and new != old
    assert _count(store, Run) == 2 and _count(store, Measurement) == 6
    assert _count(store, Study) == 1 and _count(store, Series) == 1


def test_patient_ids_can_be_pseudonymised(store: Store, volume: Volume) -> None:
    key = "site-secret"
    store_one(store, make_result(volume), volume, pseudonym_key=key)
    with store.reader() as session:
        stored = session.execute(select(Study.patient_id)).scalar_one()
    patient = volume.identifiers.patient_id or ""
    assert stored == pseudonym(patient, key) and stored.startswith("PSN-")
    assert patient not in stored and pseudonym(patient, "other") != stored
    assert pseudonym(patient, None) == patient


def test_a_changed_input_is_a_new_run(store: Store, volume: Volume) -> None:
    _store(store, volume)
    changed = dataclasses.replace(volume, voxels=volume.voxels + 1.0)
    assert input_fingerprint(changed) != input_fingerprint(volume)
    _store(store, changed)
    assert _count(store, Run) == 2


def test_only_an_sqlite_database_without_a_file_is_in_memory() -> None:
    assert in_memory("sqlite://") and in_memory("sqlite:///:memory:")
    assert not in_memory("sqlite:///store.sqlite3")
    assert not in_memory("postgresql://radcaliper@db.example/radcaliper")
