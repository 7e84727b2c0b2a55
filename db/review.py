"""Reviewers' actions on measurements: accept, correct (a value and a reason), reject (a reason).

Optimistic locking: the caller passes the ``version`` of the measurement it showed the reviewer.
The update is ``... WHERE id = :id AND version = :seen`` and bumps the version; when another edit
came first, nothing is written and ``StaleEditError`` says who changed it and when, so the
reviewer reloads and decides again. Nothing is lost: the first edit stands, with its review row
and audit event, and the second is refused whole.

Only reviewers and admins may review; an auditor (or an inactive user) gets ``AccessDeniedError``.

Plausible corrections: a corrected value must be a finite number of mm, at least :data:`MIN_MM`
(0.1) and at most the limit of its measurement (:class:`CorrectionLimits`: long and short axis
500 mm, diameter 100 mm by default, ``RADCALIPER_MAX_LONG_AXIS_MM`` and friends in the
settings). Anything else (1e308, 1e-320, 0, -1, NaN) is refused with one message naming the
value and the limit, before anything is written.
The same rule tells the exports and plots which stored values (from a database written before
the rule, or edited by hand) are implausible (:meth:`CorrectionLimits.problem`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db.audit import append_event
from db.audit.coverage import measurement_state, review_state
from db.models import Measurement, Review, ReviewAction, ReviewStatus, Role, User
from ingestion.errors import AccessDeniedError, StaleEditError, StorageError
from model.measurer.results import MeasurementName

__all__ = ["CorrectionLimits", "review_measurement"]

_STATUS = {
    ReviewAction.ACCEPT: ReviewStatus.ACCEPTED,
    ReviewAction.CORRECT: ReviewStatus.CORRECTED,
    ReviewAction.REJECT: ReviewStatus.REJECTED,
}
_NAMES = tuple(name.value for name in MeasurementName)
#: no limit may exceed this (10 m, beyond any body): plausible values stay small enough for
#: any statistic of them (the audit tab's agreement figure) to be computed and drawn
MAX_LIMIT_MM = 10_000.0
#: the least plausible value of any measurement: a tenth of a mm, the grid of the model's
#: numbers and well below a CT pixel; a smaller one is a slip (1e-320 showed as 0.0)
MIN_MM = 0.1


@dataclass(frozen=True)
class CorrectionLimits:
    """The largest plausible value, in mm, of each measurement (a correction above it is
    refused; exports and plots leave stored values above it out, with a warning).

    The defaults are generous bounds of anatomy, meant to catch slips (a missing decimal point,
    a pasted number), not to judge a reading: a lesion's long or short axis cannot exceed the
    body's cross-section, which a CT field of view (at most about 500 mm) holds; a vessel's
    diameter stays below 100 mm (the aorta, the largest vessel, is about 30 mm, and an aneurysm
    is treated from 55 mm). A site that measures beyond them raises the limit in the settings
    (``RADCALIPER_MAX_LONG_AXIS_MM``, ``RADCALIPER_MAX_SHORT_AXIS_MM``,
    ``RADCALIPER_MAX_DIAMETER_MM``), up to :data:`MAX_LIMIT_MM` (10 m).
    """

    long_axis_mm: float = 500.0
    short_axis_mm: float = 500.0
    diameter_mm: float = 100.0

    def __post_init__(self) -> None:
        for name in ("long_axis_mm", "short_axis_mm", "diameter_mm"):
            limit = getattr(self, name)
            if isinstance(limit, bool) or not isinstance(limit, int | float):
                raise ValueError(f"{name} must be a number of mm, got {limit!r}")
            if not (math.isfinite(limit) and 0 < limit <= MAX_LIMIT_MM):
                raise ValueError(
                    f"{name} must be a number of mm > 0 and at most {MAX_LIMIT_MM:g}, got {limit!r}"
                )

    def limit(self, name: str) -> float:
        """The limit of measurement ``name`` (long_axis, short_axis or diameter)."""
        if name not in _NAMES:
            raise ValueError(f"there is no measurement {name!r}; use one of {', '.join(_NAMES)}")
        return float(getattr(self, f"{name}_mm"))

    def problem(self, name: str, value_mm: float | None) -> str | None:
        """Why ``value_mm`` is not a plausible value of measurement ``name``, or None."""
        label = name.replace("_", " ")
        if name not in _NAMES:
            return f"there is no measurement {name!r} (use one of {', '.join(_NAMES)})"
        if isinstance(value_mm, bool) or not isinstance(value_mm, int | float):
            return f"the {label} needs a number of mm, got {value_mm!r}"
        limit = self.limit(name)
        if math.isfinite(value_mm) and MIN_MM <= value_mm <= limit:
            return None
        return (
            f"{value_mm:g} mm is not a plausible {label} (a {label} must be a finite number of "
            f"mm of at least {MIN_MM:g} and at most {limit:g} mm, the limit set by "
            f"RADCALIPER_MAX_{name.upper()}_MM)"
        )


def _check(
    action: ReviewAction,
    value_mm: float | None,
    reason: str | None,
    name: str,
    limits: CorrectionLimits,
) -> None:
    if action is ReviewAction.CORRECT:
        if value_mm is None:
            raise ValueError(f"a correction needs a value in mm (the corrected {name})")
        problem = limits.problem(name, value_mm)
        if problem is not None:
            raise ValueError(f"correction refused: {problem}; enter the value in mm")
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
    limits: CorrectionLimits | None = None,
) -> Measurement:
    """Record one review (in the session's transaction; the caller commits).

    ``limits``: the plausible range of a corrected value (default :class:`CorrectionLimits()`).

    Raises:
        AccessDeniedError: the reviewer's role may not review, or the user is inactive.
        StaleEditError: the measurement changed since ``seen_version``.
        ValueError: a correction without value or reason, or with a value that is not finite,
            not > 0 or over its limit; a rejection without reason.
        StorageError: no such measurement.
    """
    action = ReviewAction(action)
    if not reviewer.active or reviewer.role not in (Role.REVIEWER, Role.ADMIN):
        raise AccessDeniedError(
            f"user {reviewer.name!r} ({reviewer.role.value}) may not change measurements; "
            "reviewing needs the reviewer or admin role"
        )
    name = session.execute(
        select(Measurement.name).where(Measurement.id == measurement_id)
    ).scalar_one_or_none()
    if name is None:
        raise StorageError(f"there is no measurement {measurement_id}")
    _check(action, value_mm, reason, name, limits or CorrectionLimits())
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
