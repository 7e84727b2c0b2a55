"""Reviewers' actions on measurements: accept, correct (a value and a reason), reject (a reason).

Optimistic locking: the caller passes the ``version`` of the measurement it showed the reviewer.
The update is ``... WHERE id = :id AND version = :seen`` and bumps the version; when another edit
came first, nothing is written and ``StaleEditError`` says who changed it and when, so the
reviewer reloads and decides again. Nothing is lost: the first edit stands, with its review row
and audit event, and the second is refused whole.

Only reviewers and admins may review; an auditor (or an inactive user) gets ``AccessDeniedError``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db.audit import append_event, measurement_state, review_state
from db.models import Measurement, Review, ReviewAction, ReviewStatus, Role, User
from ingestion.errors import AccessDeniedError, StaleEditError, StorageError

__all__ = ["review_measurement"]

_STATUS = {
    ReviewAction.ACCEPT: ReviewStatus.ACCEPTED,
    ReviewAction.CORRECT: ReviewStatus.CORRECTED,
    ReviewAction.REJECT: ReviewStatus.REJECTED,
}


def _check(action: ReviewAction, value_mm: float | None, reason: str | None) -> None:
    if action is ReviewAction.CORRECT:
        if value_mm is None or not math.isfinite(value_mm) or value_mm < 0:
            raise ValueError(f"a correction needs a value in mm >= 0, got {value_mm!r}")
        if not (reason and reason.strip()):
            raise ValueError("a correction needs a reason")
    elif value_mm is not None:
        raise ValueError(f"only a correction carries a value ({action.value} got {value_mm})")
    if action is ReviewAction.REJECT and not (reason and reason.strip()):
        raise ValueError("a rejection needs a reason")


def review_measurement(
    session: Session,
    measurement_id: int,
    *,
    action: ReviewAction | str,
    reviewer: User,
    seen_version: int,
    value_mm: float | None = None,
    reason: str | None = None,
) -> Measurement:
    """Record one review (in the session's transaction; the caller commits).

    Raises:
        AccessDeniedError: the reviewer's role may not review, or the user is inactive.
        StaleEditError: the measurement changed since ``seen_version``.
        ValueError: a correction without value or reason, a rejection without reason.
        StorageError: no such measurement.
    """
    action = ReviewAction(action)
    if not reviewer.active or reviewer.role not in (Role.REVIEWER, Role.ADMIN):
        raise AccessDeniedError(
            f"user {reviewer.name!r} ({reviewer.role.value}) may not change measurements; "
            "reviewing needs the reviewer or admin role"
        )
    _check(action, value_mm, reason)
    now = datetime.now(UTC)
    done = session.execute(
        update(Measurement)
        .where(Measurement.id == measurement_id, Measurement.version == seen_version)
        .values(
            status=_STATUS[action],
            reviewed_value_mm=value_mm,
            reviewer_id=reviewer.id,
            reviewed_at=now,
            version=Measurement.version + 1,
        )
        .execution_options(synchronize_session=False)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        current = session.get(Measurement, measurement_id, populate_existing=True)
        if current is None:
            raise StorageError(f"there is no measurement {measurement_id}")
        who = current.reviewer.name if current.reviewer is not None else "someone"
        when = current.reviewed_at.isoformat(timespec="seconds") if current.reviewed_at else "?"
        raise StaleEditError(
            f"measurement {measurement_id} was changed by {who} at {when} (now version "
            f"{current.version}, you saw {seen_version}); reload it and review again — your "
            "change was not saved"
        )
    row = Review(
        measurement_id=measurement_id,
        action=action,
        value_mm=value_mm,
        reason=reason,
        reviewer_id=reviewer.id,
        created_at=now,
    )
    session.add(row)
    session.flush()
    measurement = session.execute(
        select(Measurement)
        .where(Measurement.id == measurement_id)
        .execution_options(populate_existing=True)
    ).scalar_one()
    append_event(
        session,
        actor=reviewer.name,
        action=f"review.{action.value}",
        object_type="review",
        object_id=row.id,
        details={"state": review_state(row)},
        at=now,
    )
    append_event(
        session,
        actor=reviewer.name,
        action=f"measurement.{_STATUS[action].value}",
        object_type="measurement",
        object_id=measurement_id,
        details={"review_id": row.id, "state": measurement_state(measurement)},
        at=now,
    )
    return measurement
