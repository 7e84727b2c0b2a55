"""Helpers of the store's tests (fixtures are in conftest.py): results as a measurer returns."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select, text

from db.engine import Store
from db.models import Measurement as Row
from db.store import RunIdentity, StoreOutcome, input_fingerprint, store_result
from ingestion.volume import Volume
from model.measurer.results import (
    FindingKind,
    Measurement,
    MeasurementName,
    ModelInfo,
    StudyFinding,
    StudyResult,
)


def make_result(
    volume: Volume, *, version: str = "1.0.0", values: tuple[float, ...] = (30.0, 20.0, 25.0)
) -> StudyResult:
    """A result with one lesion and one vessel (the values as given), as a measurer returns."""
    long_mm, short_mm, diameter = values
    ids = volume.identifiers
    lesion = StudyFinding(
        1,
        FindingKind.LESION,
        (1.0, 2.0, 3.0),
        4,
        (
            Measurement(MeasurementName.LONG_AXIS, long_mm, (long_mm - 2, long_mm + 2), 0.9),
            Measurement(MeasurementName.SHORT_AXIS, short_mm, (short_mm - 1, short_mm + 1), 0.9),
        ),
    )
    vessel = StudyFinding(
        2,
        FindingKind.VESSEL,
        (10.0, -5.0, 3.0),
        5,
        (Measurement(MeasurementName.DIAMETER, diameter, (diameter - 1, diameter + 1), 0.9),),
    )
    return StudyResult(
        ids.study_instance_uid,
        ids.series_instance_uid,
        ids.patient_id or "",
        "phantom-21",
        ModelInfo("radcaliper-test", version, "rned_corr"),
        (lesion, vessel),
    )


def identity(volume: Volume, checkpoint: str = "c" * 64) -> RunIdentity:
    return RunIdentity(checkpoint, input_fingerprint(volume), {"threads": 1})


def store_one(
    store: Store,
    result: StudyResult,
    volume: Volume,
    *,
    checkpoint: str = "c" * 64,
    actor: str = "cli:test",
    started_at: datetime | None = None,
    pseudonym_key: str | None = None,
) -> StoreOutcome:
    """Store ``result`` in its own committed transaction, as ``radcaliper measure`` does."""
    with store.writer() as session:
        outcome = store_result(
            session,
            result,
            volume,
            identity(volume, checkpoint),
            actor=actor,
            started_at=started_at or datetime.now(UTC),
            pseudonym_key=pseudonym_key,
        )
        session.commit()
    return outcome


def first_measurement_id(store: Store) -> int:
    with store.reader() as session:
        return int(session.execute(select(Row.id).order_by(Row.id)).scalars().first() or 0)


def as_attacker(store: Store, *statements: str) -> None:
    """Raw SQL as someone with write access who also drops the append-only triggers."""
    drop = (
        [
            "DROP TRIGGER IF EXISTS audit_events_no_update",
            "DROP TRIGGER IF EXISTS audit_events_no_delete",
        ]
        if store.backend == "sqlite"
        else ["DROP TRIGGER IF EXISTS audit_events_append_only ON audit_events"]
    )
    with store.engine.begin() as connection:
        for statement in (*drop, *statements):
            connection.execute(text(statement))
