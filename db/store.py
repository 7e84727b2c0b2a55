"""Storing what the measurer said: one study result as study, series, run, findings and
measurements, with their audit events, in one transaction.

Idempotent: a run is identified by (series, model name, model version, checkpoint hash, input
fingerprint); storing the same again returns the stored run and adds nothing. A new model
version (or checkpoint, or changed input) adds a new run and keeps the old ones.

A series row is one stack of images: one geometry, one list of SOP instances. It is keyed by the
volume's ``Identifiers.series_key`` (in the ``series_instance_uid`` column): the
SeriesInstanceUID, or, where one SeriesInstanceUID holds several stacks (axial and coronal
reconstructions, ...), a key per stack made of the UID and a digest of its images
(``ingestion.volume.stack_key``); such a row also records the DICOM SeriesInstanceUID in its
``sop_instance_uids`` (``"series_instance_uid"``), which the SR references. Rows stored before
(a split series' stacks under one UID row) are left as they are.

Patient identifiers are stored as given, or as a keyed pseudonym (:func:`pseudonym`) when the
site sets a secret (``RADCALIPER_PSEUDONYM_KEY``).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from db.audit import append_event
from db.audit.coverage import measurement_state, states_detail
from db.models import (
    Finding,
    Measurement,
    MeasurementSource,
    ReviewStatus,
    Run,
    RunStatus,
    Series,
    Study,
)

if TYPE_CHECKING:
    from ingestion.volume import Volume
    from model.measurer.results import StudyResult

__all__ = [
    "RunIdentity",
    "StoreOutcome",
    "dicom_series_uid",
    "find_run",
    "input_fingerprint",
    "pseudonym",
    "store_result",
]


def pseudonym(patient_id: str, key: str | None) -> str:
    """``patient_id`` itself without a key; else ``PSN-`` + 32 hex of HMAC-SHA256(key, id)."""
    if not key:
        return patient_id
    digest = hmac.new(key.encode(), patient_id.encode(), hashlib.sha256).hexdigest()
    return "PSN-" + digest[:32]


def input_fingerprint(volume: Volume) -> str:
    """sha256 of the voxels, their shape and the geometry: the same input gives the same value."""
    digest = hashlib.sha256()
    digest.update(repr(volume.voxels.shape).encode())
    digest.update(volume.geometry.affine.tobytes())
    digest.update(volume.voxels.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class RunIdentity:
    """What makes two runs the same run."""

    checkpoint_hash: str
    input_fingerprint: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class StoreOutcome:
    run_id: int
    created: bool  # False: this run was already stored; nothing was added


def dicom_series_uid(series: Series) -> str:
    """The DICOM SeriesInstanceUID of a stored series (module doc: a stack's row keys it
    otherwise)."""
    recorded = series.sop_instance_uids.get("series_instance_uid")
    return recorded if isinstance(recorded, str) and recorded else series.series_instance_uid


def find_run(
    session: Session, series_key: str, name: str, version: str, identity: RunIdentity
) -> Run | None:
    """The stored run with this identity in the series row keyed ``series_key`` (a volume's
    ``Identifiers.series_key``: module doc), or None."""
    return session.execute(
        select(Run)
        .join(Series)
        .where(
            Series.series_instance_uid == series_key,
            Run.model_name == name,
            Run.model_version == version,
            Run.checkpoint_hash == identity.checkpoint_hash,
            Run.input_fingerprint == identity.input_fingerprint,
        )
    ).scalar_one_or_none()


def _study(
    session: Session, result: StudyResult, volume: Volume, key: str | None
) -> tuple[Study, bool]:
    """The study row, and whether it was added now."""
    study = session.execute(
        select(Study).where(Study.study_instance_uid == result.study_instance_uid)
    ).scalar_one_or_none()
    if study is not None:
        return study, False
    study = Study(
        study_instance_uid=result.study_instance_uid,
        patient_id=pseudonym(result.patient_id, key),
        patient_name=None if key else volume.identifiers.patient_name,
        study_date=volume.identifiers.study_date,
        created_at=datetime.now(UTC),
    )
    session.add(study)
    session.flush()
    return study, True


def _series(session: Session, study: Study, volume: Volume) -> tuple[Series, bool]:
    """The series row of ``volume``'s stack (keyed by its ``series_key``), and whether it was
    added now."""
    ids = volume.identifiers
    key = ids.series_key
    series = session.execute(
        select(Series).where(Series.series_instance_uid == key)
    ).scalar_one_or_none()
    if series is not None:
        return series, False
    geometry = volume.geometry
    slices, rows, columns = volume.shape
    images: dict[str, Any] = {
        "uids": list(ids.sop_instance_uids),
        "frames": list(ids.frame_numbers),
    }
    if key != ids.series_instance_uid:  # a stack of a split series: the UID it carries
        images["series_instance_uid"] = ids.series_instance_uid
    series = Series(
        study_id=study.id,
        series_instance_uid=key,
        modality=None if volume.modality is None else str(volume.modality),
        description=volume.identifiers.series_description[:256],
        source_format=str(volume.source_format),
        shape={"slices": slices, "rows": rows, "columns": columns},
        spacing_mm={
            "slice": geometry.slice_spacing,
            "row": geometry.row_spacing,
            "column": geometry.column_spacing,
        },
        sop_instance_uids=images,
        geometry={
            "origin": list(geometry.origin),
            "row_direction": list(geometry.row_direction),
            "column_direction": list(geometry.column_direction),
            "slice_direction": list(geometry.slice_direction),
            "spacing": list(geometry.spacing),
        },
        created_at=datetime.now(UTC),
    )
    session.add(series)
    session.flush()
    return series, True


def store_result(
    session: Session,
    result: StudyResult,
    volume: Volume,
    identity: RunIdentity,
    *,
    actor: str,
    started_at: datetime,
    pseudonym_key: str | None = None,
) -> StoreOutcome:
    """Store ``result`` (measured on ``volume``) unless this run is stored already.

    The caller commits (one transaction per study). Concurrent stores of the same run: the
    unique constraint lets one win; the other finds it and adds nothing.
    """
    model = result.model
    key = volume.identifiers.series_key
    existing = find_run(session, key, model.name, model.version, identity)
    if existing is not None:
        return StoreOutcome(existing.id, False)
    try:
        with session.begin_nested():
            run = _insert(session, result, volume, identity, actor, started_at, pseudonym_key)
    except IntegrityError:
        again = find_run(session, key, model.name, model.version, identity)
        if again is None:
            raise
        return StoreOutcome(again.id, False)
    return StoreOutcome(run.id, True)


def _insert(
    session: Session,
    result: StudyResult,
    volume: Volume,
    identity: RunIdentity,
    actor: str,
    started_at: datetime,
    key: str | None,
) -> Run:
    study, new_study = _study(session, result, volume, key)
    series, new_series = _series(session, study, volume)
    model = result.model
    run = Run(
        series_id=series.id,
        model_name=model.name,
        model_version=model.version,
        numeric_mode=model.numeric_mode,
        checkpoint_hash=identity.checkpoint_hash,
        not_for_clinical_use=model.not_for_clinical_use,
        settings=identity.settings,
        input_fingerprint=identity.input_fingerprint,
        source=result.source,
        status=RunStatus.DONE,
        warnings={"warnings": list(result.warnings)},
        started_at=started_at,
        finished_at=datetime.now(UTC),
    )
    session.add(run)
    session.flush()
    uids, frames = volume.identifiers.sop_instance_uids, volume.identifiers.frame_numbers
    findings = []
    for found in result.findings:
        finding = Finding(
            run_id=run.id,
            number=found.id,
            kind=found.kind.value,
            center_x_mm=float(found.center_lps_mm[0]),
            center_y_mm=float(found.center_lps_mm[1]),
            center_z_mm=float(found.center_lps_mm[2]),
            slice_index=int(found.slice_index),
            sop_instance_uid=uids[found.slice_index] if found.slice_index < len(uids) else None,
            frame_number=frames[found.slice_index] if found.slice_index < len(frames) else None,
            axes_lps_mm=None
            if found.axes_lps_mm is None
            else {
                "segments": [
                    [[float(c) for c in point] for point in segment]
                    for segment in found.axes_lps_mm
                ]
            },
        )
        session.add(finding)
        findings.append(finding)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="run.stored",
        object_type="run",
        object_id=run.id,
        details={
            "study_instance_uid": result.study_instance_uid,
            "series_instance_uid": result.series_instance_uid,
            "model": model.to_json(),
            "checkpoint_hash": identity.checkpoint_hash,
            "input_fingerprint": identity.input_fingerprint,
            "findings": len(result.findings),
            "rows": states_detail(
                {
                    "studies": [study] if new_study else [],
                    "series": [series] if new_series else [],
                    "runs": [run],
                    "findings": findings,
                }
            ),
        },
    )
    for found, finding in zip(result.findings, findings, strict=True):
        for m in found.measurements:
            row = Measurement(
                finding_id=finding.id,
                name=m.name.value,
                value_mm=m.value_mm,
                range_low_mm=None if m.range_mm is None else m.range_mm[0],
                range_high_mm=None if m.range_mm is None else m.range_mm[1],
                coverage=m.coverage,
                unit="mm",
                qualifier=m.qualifier,
                reason=m.reason,
                source=MeasurementSource.MODEL,
                status=ReviewStatus.PENDING,
                version=1,
            )
            session.add(row)
            session.flush()
            append_event(
                session,
                actor=actor,
                action="measurement.created",
                object_type="measurement",
                object_id=row.id,
                details={"run_id": run.id, "finding": found.id, "state": measurement_state(row)},
            )
    return run
