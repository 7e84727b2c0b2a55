"""Audit queries: stored measurements and audit events with filters, as flat rows.

Every filter is a bound parameter (no SQL is built from user text). Measurement rows follow the
contract of ``audit measurements --format json`` (architecture.md): study_instance_uid,
patient_id, finding_id, kind, name, value_mm, range_mm, center_lps_mm, model_version, status,
reviewed_value_mm, reviewer, reviewed_at; plus model_name, measured_at and measurement_id.

The date range of ``measurement_rows`` is when the run was measured (``runs.started_at``);
of ``audit_log_rows``, when the event happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session, aliased

from db.audit.coverage import canonical_time
from db.models import AuditEvent, Finding, Measurement, ReviewStatus, Run, Series, Study, User

__all__ = [
    "CLICKED",
    "LogFilter",
    "MeasurementFilter",
    "WorklistFilter",
    "audit_log_rows",
    "measurement_query",
    "measurement_rows",
    "shown_run_order",
    "study_measurements",
    "worklist_rows",
]


@dataclass(frozen=True)
class MeasurementFilter:
    patient_id: str | None = None
    study_instance_uid: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    model_version: str | None = None
    status: ReviewStatus | None = None
    reviewer: str | None = None
    limit: int | None = None


@dataclass(frozen=True)
class LogFilter:
    actor: str | None = None
    action: str | None = None
    object_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int | None = None


def measurement_query(filters: MeasurementFilter, pseudonym_key: str | None = None) -> Select[Any]:
    """The SELECT behind :func:`measurement_rows` (for EXPLAIN in the benchmark)."""
    reviewer = aliased(User)
    query: Any = (
        select(
            Measurement.id,
            Study.study_instance_uid,
            Study.patient_id,
            Finding.number,
            Finding.kind,
            Measurement.name,
            Measurement.value_mm,
            Measurement.range_low_mm,
            Measurement.range_high_mm,
            Finding.center_x_mm,
            Finding.center_y_mm,
            Finding.center_z_mm,
            Run.model_name,
            Run.model_version,
            Run.started_at,
            Measurement.status,
            Measurement.reviewed_value_mm,
            reviewer.name,
            Measurement.reviewed_at,
        )
        .join(Finding, Measurement.finding_id == Finding.id)
        .join(Run, Finding.run_id == Run.id)
        .join(Series, Run.series_id == Series.id)
        .join(Study, Series.study_id == Study.id)
        .outerjoin(reviewer, Measurement.reviewer_id == reviewer.id)
    )
    if filters.patient_id is not None:
        from db.store import pseudonym  # db.store imports the audit log's writer (numpy)

        query = query.where(Study.patient_id == pseudonym(filters.patient_id, pseudonym_key))
    if filters.study_instance_uid is not None:
        query = query.where(Study.study_instance_uid == filters.study_instance_uid)
    if filters.since is not None:
        query = query.where(Run.started_at >= filters.since)
    if filters.until is not None:
        query = query.where(Run.started_at < filters.until)
    if filters.model_version is not None:
        query = query.where(Run.model_version == filters.model_version)
    if filters.status is not None:
        query = query.where(Measurement.status == filters.status)
    if filters.reviewer is not None:
        query = query.where(reviewer.name == filters.reviewer)
    query = query.order_by(Run.started_at, Measurement.id)
    if filters.limit is not None:
        query = query.limit(filters.limit)
    out: Select[Any] = query
    return out


def measurement_rows(
    session: Session, filters: MeasurementFilter, *, pseudonym_key: str | None = None
) -> list[dict[str, Any]]:
    out = []
    for row in session.execute(measurement_query(filters, pseudonym_key)):
        (mid, study, patient, number, kind, name, value, low, high, x, y, z, model_name,
         version, measured_at, status, reviewed, reviewer, reviewed_at) = row  # fmt: skip
        out.append(
            {
                "study_instance_uid": study,
                "patient_id": patient,
                "finding_id": number,
                "kind": kind,
                "name": name,
                "value_mm": value,
                "range_mm": None if low is None else [low, high],
                "center_lps_mm": [x, y, z],
                "model_name": model_name,
                "model_version": version,
                "status": str(status),
                "reviewed_value_mm": reviewed,
                "reviewer": reviewer,
                "reviewed_at": None if reviewed_at is None else canonical_time(reviewed_at),
                "measured_at": canonical_time(measured_at),
                "measurement_id": mid,
            }
        )
    return out


def audit_log_rows(session: Session, filters: LogFilter) -> list[dict[str, Any]]:
    query = select(AuditEvent)
    if filters.actor is not None:
        query = query.where(AuditEvent.actor == filters.actor)
    if filters.action is not None:
        query = query.where(AuditEvent.action == filters.action)
    if filters.object_type is not None:
        query = query.where(AuditEvent.object_type == filters.object_type)
    if filters.since is not None:
        query = query.where(AuditEvent.at >= filters.since)
    if filters.until is not None:
        query = query.where(AuditEvent.at < filters.until)
    query = query.order_by(AuditEvent.id)
    if filters.limit is not None:
        query = query.limit(filters.limit)
    return [
        {
            "id": e.id,
            "at": canonical_time(e.at),
            "actor": e.actor,
            "action": e.action,
            "object_type": e.object_type,
            "object_id": e.object_id,
            "details": e.details,
            "hash": e.hash,
        }
        for e in session.execute(query).scalars()
    ]


@dataclass(frozen=True)
class WorklistFilter:
    patient_id: str | None = None
    status: str | None = None  # "pending": studies with unreviewed measurements; "reviewed"
    limit: int = 500


CLICKED = "at"
"""``Run.settings["inference"]`` of a run of clicked points (``measure --at``): measured only at
those points, so it never stands for the whole study."""


def _whole_study() -> Any:
    """True for a run that measured the whole study (not only clicked points)."""
    return func.coalesce(Run.settings["inference"].as_string(), "") != CLICKED


def shown_run_order() -> tuple[Any, Any]:
    """ORDER BY for the run a study is shown, reviewed and exported by: its latest run of the
    whole study, else (a study only clicked) its latest run of points."""
    return case((_whole_study(), 1), else_=0).desc(), Run.id.desc()


def worklist_rows(
    session: Session, filters: WorklistFilter, *, pseudonym_key: str | None = None
) -> list[dict[str, Any]]:
    """One row per study: patient, date, latest model version, findings and review progress."""
    latest = (
        select(
            Series.study_id,
            func.coalesce(func.max(case((_whole_study(), Run.id))), func.max(Run.id)).label(
                "run_id"
            ),
        )
        .join(Run, Run.series_id == Series.id)
        .group_by(Series.study_id)
        .subquery()
    )
    counts = (
        select(
            Finding.run_id,
            func.count(func.distinct(Finding.id)).label("findings"),
            func.count(Measurement.id).label("measurements"),
            func.sum(case((Measurement.status == ReviewStatus.PENDING, 1), else_=0)).label(
                "pending"
            ),
        )
        .join(Measurement, Measurement.finding_id == Finding.id)
        .group_by(Finding.run_id)
        .subquery()
    )
    query = (
        select(
            Study.study_instance_uid,
            Study.patient_id,
            Study.study_date,
            Run.model_name,
            Run.model_version,
            Run.started_at,
            func.coalesce(counts.c.findings, 0),
            func.coalesce(counts.c.measurements, 0),
            func.coalesce(counts.c.pending, 0),
        )
        .join(latest, latest.c.study_id == Study.id)
        .join(Run, Run.id == latest.c.run_id)
        .outerjoin(counts, counts.c.run_id == Run.id)
        .order_by(Run.started_at.desc())
        .limit(filters.limit)
    )
    if filters.patient_id:
        from db.store import pseudonym  # db.store imports the audit log's writer (numpy)

        query = query.where(Study.patient_id == pseudonym(filters.patient_id, pseudonym_key))
    rows = []
    for study, patient, date, name, version, at, findings, total, pending in session.execute(query):
        status = "pending" if pending else "reviewed"
        if filters.status and filters.status != status:
            continue
        rows.append(
            {
                "study_instance_uid": study,
                "patient_id": patient,
                "study_date": date,
                "model": f"{name} {version}",
                "measured_at": canonical_time(at),
                "findings": int(findings),
                "to_review": f"{int(pending)} of {int(total)}",
                "status": status,
            }
        )
    return rows


def study_measurements(session: Session, study_instance_uid: str) -> dict[str, Any] | None:
    """The run a study is shown by (:func:`shown_run_order`) with its findings and measurements
    (for the study view), or None when the study is not stored."""
    run = session.execute(
        select(Run)
        .join(Series, Run.series_id == Series.id)
        .join(Study, Series.study_id == Study.id)
        .where(Study.study_instance_uid == study_instance_uid)
        .order_by(*shown_run_order())
        .limit(1)
    ).scalar_one_or_none()
    if run is None:
        return None
    findings = []
    for finding in run.findings:
        findings.append(
            {
                "number": finding.number,
                "kind": finding.kind,
                "slice_index": finding.slice_index,
                "center_lps_mm": (finding.center_x_mm, finding.center_y_mm, finding.center_z_mm),
                "axes_lps_mm": None
                if finding.axes_lps_mm is None
                else tuple(
                    tuple(tuple(p) for p in segment) for segment in finding.axes_lps_mm["segments"]
                ),
                "measurements": [
                    {
                        "id": m.id,
                        "name": m.name,
                        "value_mm": m.value_mm,
                        "range_mm": None
                        if m.range_low_mm is None
                        else (m.range_low_mm, m.range_high_mm),
                        "status": str(m.status),
                        "reviewed_value_mm": m.reviewed_value_mm,
                        "reviewer": None if m.reviewer is None else m.reviewer.name,
                        "version": m.version,
                    }
                    for m in finding.measurements
                ],
            }
        )
    return {
        "run_id": run.id,
        "series_instance_uid": run.series.series_instance_uid,
        "source": run.source,
        "model": f"{run.model_name} {run.model_version}",
        "not_for_clinical_use": run.not_for_clinical_use,
        "findings": findings,
    }
