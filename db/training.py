"""Reviewed findings: what reviewers said of the model's findings, as typed rows (read only).

Training, calibration and evaluation learn from reviews (``radcaliper dataset import`` of a
store, ``app.dataset_store``): a reviewer's accept says the model's value is true, a correction
gives the true value, a rejection says there is no such finding there. This module is the one
query that reads them; it writes nothing.

- Only findings with at least one reviewed (accepted, corrected or rejected) measurement.
- ``latest_run_only`` (the default): of each series, only the latest run (highest run id) that
  has a review, so that a series measured by two model versions and reviewed twice gives each
  finding once, and the reviews of an earlier run stay available while a newer run awaits
  review.
- No patient identifier is read: a row carries study and series UIDs, the measured path and
  the model, never the (possibly pseudonymised) patient id or name.

Times are timezone-aware UTC (SQLite returns naive datetimes; they are stored as UTC).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import cast

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from db.models import Finding, Measurement, ReviewStatus, Run, Series, Study, User

__all__ = ["ReviewedFinding", "ReviewedMeasurement", "reviewed_findings"]

logger = logging.getLogger(__name__)

Point = tuple[float, float, float]
Segment = tuple[Point, Point]


@dataclass(frozen=True)
class ReviewedMeasurement:
    """One measurement of a reviewed finding.

    Args:
        name: long_axis, short_axis or diameter.
        value_mm: what the model said (None: "not measurable").
        status: pending, accepted, corrected or rejected.
        reviewed_value_mm: the reviewer's value (a correction), else None.
        reviewer: who reviewed it last (None while pending).
        reviewed_at: when (UTC), None while pending.
    """

    name: str
    value_mm: float | None
    status: ReviewStatus
    reviewed_value_mm: float | None
    reviewer: str | None
    reviewed_at: datetime | None

    @property
    def reviewed(self) -> bool:
        return self.status is not ReviewStatus.PENDING


@dataclass(frozen=True)
class ReviewedFinding:
    """A stored finding with at least one reviewed measurement.

    Args:
        run_id, finding_number: the run and the finding's number in it ("run 3 finding 2").
        study_instance_uid, series_instance_uid: the measured series.
        source: the path the run measured (as the measuring command was given it).
        source_format: dicom, nifti, nrrd or synthetic (a volume built in memory: no file).
        modality: CT or MR where known.
        kind: lesion or vessel.
        center_lps_mm, slice_index: where the model put it (LPS mm; 0-based slice).
        axes_lps_mm: the model's axes as end points (lesion: long, short; vessel: diameter),
            None where the model did not locate them.
        model_name, model_version: the model that reported it.
        measurements: in stored order (lesion: long axis, short axis; vessel: diameter).
    """

    run_id: int
    finding_number: int
    study_instance_uid: str
    series_instance_uid: str
    source: str
    source_format: str
    modality: str | None
    kind: str
    center_lps_mm: Point
    slice_index: int
    axes_lps_mm: tuple[Segment, ...] | None
    model_name: str
    model_version: str
    measurements: tuple[ReviewedMeasurement, ...]


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _point(value: object) -> Point:
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError(f"not an (x, y, z) point: {value!r}")
    x, y, z = (float(cast(float, v)) for v in value)
    return (x, y, z)


def _axes(stored: Mapping[str, object] | None, where: str) -> tuple[Segment, ...] | None:
    """The stored ``{"segments": [[[x, y, z], [x, y, z]], ...]}``; None (with a warning) when
    it is not that shape: axes that cannot be read are not known."""
    if stored is None:
        return None
    try:
        segments = stored["segments"]
        if not isinstance(segments, list):
            raise ValueError("segments is not a list")
        out = []
        for segment in segments:
            if not isinstance(segment, list | tuple) or len(segment) != 2:
                raise ValueError(f"not a pair of points: {segment!r}")
            out.append((_point(segment[0]), _point(segment[1])))
    except (KeyError, TypeError, ValueError) as error:
        logger.warning("%s: stored axes cannot be read (%s); left out", where, error)
        return None
    return tuple(out)


def reviewed_findings(session: Session, *, latest_run_only: bool = True) -> list[ReviewedFinding]:
    """Every stored finding with at least one reviewed measurement, ordered by run and
    finding number (module doc: which runs)."""
    reviewer = aliased(User)
    reviewed = select(Measurement.finding_id).where(Measurement.status != ReviewStatus.PENDING)
    query = (
        select(Measurement, Finding, Run, Series, Study.study_instance_uid, reviewer.name)
        .join(Finding, Measurement.finding_id == Finding.id)
        .join(Run, Finding.run_id == Run.id)
        .join(Series, Run.series_id == Series.id)
        .join(Study, Series.study_id == Study.id)
        .outerjoin(reviewer, Measurement.reviewer_id == reviewer.id)
        .where(Finding.id.in_(reviewed))
        .order_by(Run.id, Finding.number, Measurement.id)
    )
    if latest_run_only:
        reviewed_runs = select(Finding.run_id).where(Finding.id.in_(reviewed))
        latest = select(func.max(Run.id)).where(Run.id.in_(reviewed_runs)).group_by(Run.series_id)
        query = query.where(Run.id.in_(latest))
    findings: list[ReviewedFinding] = []
    current: int | None = None  # the id of the finding being collected
    for measurement, finding, run, series, study_uid, reviewer_name in session.execute(query):
        row = ReviewedMeasurement(
            name=measurement.name,
            value_mm=measurement.value_mm,
            status=ReviewStatus(measurement.status),
            reviewed_value_mm=measurement.reviewed_value_mm,
            reviewer=reviewer_name,
            reviewed_at=_utc(measurement.reviewed_at),
        )
        if finding.id == current:
            last = findings[-1]
            findings[-1] = replace(last, measurements=(*last.measurements, row))
            continue
        current = finding.id
        findings.append(
            ReviewedFinding(
                run_id=run.id,
                finding_number=finding.number,
                study_instance_uid=study_uid,
                series_instance_uid=series.series_instance_uid,
                source=run.source,
                source_format=series.source_format,
                modality=series.modality,
                kind=finding.kind,
                center_lps_mm=(finding.center_x_mm, finding.center_y_mm, finding.center_z_mm),
                slice_index=finding.slice_index,
                axes_lps_mm=_axes(finding.axes_lps_mm, f"run {run.id} finding {finding.number}"),
                model_name=run.model_name,
                model_version=run.model_version,
                measurements=(row,),
            )
        )
    return findings
