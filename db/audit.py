"""The audit log: append-only events chained by hashes, and its verification.

Each event's hash is ``sha256(prev_hash || canonical JSON of (id, at, actor, action,
object_type, object_id, details))``; the first event's ``prev_hash`` is :data:`GENESIS`. Event ids
are consecutive from 1: an append locks the one ``audit_head`` row (``SELECT ... FOR UPDATE`` on
PostgreSQL; the write transaction's ``BEGIN IMMEDIATE`` on SQLite), takes ``last_id + 1`` and
moves the head, so concurrent writers queue and the chain never forks.

Measurements and reviews are logged with their values (``details``). :func:`verify` walks the
chain (an edited event no longer matches its hash; a deleted one leaves a gap in the ids; an
inserted or reordered one breaks ``prev_hash``; a truncated tail disagrees with the head), then
replays the log and compares every measurement and review row with what the log recorded (a row
changed, added or deleted outside radcaliper shows). The first problem is reported.

What cannot be detected from inside the database: someone who rewrites the whole chain from some
event on, head included. Keep the head hash that ``radcaliper audit verify`` prints somewhere else
(a ticket, a signed report) and pass it back with ``--head`` to detect that too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import AuditEvent, AuditHead, Measurement, Review

__all__ = [
    "GENESIS",
    "VerifyReport",
    "append_event",
    "canonical_time",
    "event_hash",
    "measurement_state",
    "review_state",
    "verify",
]

GENESIS = "0" * 64


def canonical_time(value: datetime) -> str:
    """UTC, microseconds, ``Z``: the same text whatever the database returned."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(timespec="microseconds") + "Z"


def event_hash(
    prev_hash: str,
    event_id: int,
    at: datetime,
    actor: str,
    action: str,
    object_type: str,
    object_id: int | None,
    details: Mapping[str, Any],
) -> str:
    payload = json.dumps(
        {
            "id": event_id,
            "at": canonical_time(at),
            "actor": actor,
            "action": action,
            "object_type": object_type,
            "object_id": object_id,
            "details": details,
        },
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
    )
    return hashlib.sha256((prev_hash + payload).encode()).hexdigest()


def append_event(
    session: Session,
    *,
    actor: str,
    action: str,
    object_type: str,
    object_id: int | None,
    details: Mapping[str, Any],
    at: datetime | None = None,
) -> AuditEvent:
    """Append one event in the session's transaction (committed with it)."""
    head = session.execute(
        select(AuditHead).where(AuditHead.id == 1).with_for_update()
    ).scalar_one()
    when = at or datetime.now(UTC)
    event_id = head.last_id + 1
    digest = event_hash(
        head.last_hash, event_id, when, actor, action, object_type, object_id, dict(details)
    )
    event = AuditEvent(
        id=event_id,
        at=when,
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=object_id,
        details=dict(details),
        prev_hash=head.last_hash,
        hash=digest,
    )
    session.add(event)
    head.last_id, head.last_hash = event_id, digest
    session.flush()
    return event


# --- what the log records about rows ------------------------------------------------------------


def measurement_state(m: Measurement) -> dict[str, Any]:
    """The fields of a measurement row that the log records (and verify compares)."""
    return {
        "finding_id": m.finding_id,
        "name": m.name,
        "value_mm": m.value_mm,
        "range_mm": None if m.range_low_mm is None else [m.range_low_mm, m.range_high_mm],
        "coverage": m.coverage,
        "unit": m.unit,
        "qualifier": m.qualifier,
        "source": str(m.source),
        "status": str(m.status),
        "reviewed_value_mm": m.reviewed_value_mm,
        "reviewer_id": m.reviewer_id,
        "reviewed_at": None if m.reviewed_at is None else canonical_time(m.reviewed_at),
        "version": m.version,
    }


def review_state(r: Review) -> dict[str, Any]:
    """The fields of a review row that the log records."""
    return {
        "measurement_id": r.measurement_id,
        "action": str(r.action),
        "value_mm": r.value_mm,
        "reason": r.reason,
        "reviewer_id": r.reviewer_id,
        "created_at": canonical_time(r.created_at),
    }


# --- verification -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`."""

    ok: bool
    events: int
    head_hash: str
    problem: str | None = None


def _streamed(session: Session, statement: Any) -> Any:
    """Rows of ``statement`` fetched in batches (a server-side cursor on PostgreSQL); close the
    result when done."""
    return session.execute(statement.execution_options(yield_per=2000)).scalars()


def verify(session: Session, *, expected_head: str | None = None) -> VerifyReport:
    """Check the chain, then every measurement and review row against the log."""
    events = _streamed(session, select(AuditEvent).order_by(AuditEvent.id))
    try:
        return _verify(session, events, expected_head)
    finally:
        events.close()


def _verify(
    session: Session, events: Iterator[AuditEvent], expected_head: str | None
) -> VerifyReport:
    previous_id, previous_hash = 0, GENESIS
    measurements: dict[int, dict[str, Any]] = {}
    reviews: dict[int, dict[str, Any]] = {}
    count = 0
    for event in events:
        count += 1
        if event.id != previous_id + 1:
            return _bad(
                count,
                previous_hash,
                f"audit events {previous_id + 1}..{event.id - 1} are missing "
                f"(the ids jump from {previous_id} to {event.id}): events were deleted",
            )
        if event.prev_hash != previous_hash:
            return _bad(
                count,
                previous_hash,
                f"audit event {event.id} does not follow event {previous_id} "
                "(its prev_hash differs): an event was inserted, replaced or reordered",
            )
        digest = event_hash(
            event.prev_hash, event.id, event.at, event.actor, event.action,
            event.object_type, event.object_id, event.details,
        )  # fmt: skip
        if digest != event.hash:
            return _bad(
                count,
                previous_hash,
                f"audit event {event.id} ({event.action} by {event.actor}) "
                "was edited: its content no longer matches its hash",
            )
        if event.object_type == "measurement" and event.object_id is not None:
            measurements[event.object_id] = dict(event.details["state"])
        elif event.object_type == "review" and event.object_id is not None:
            reviews[event.object_id] = dict(event.details["state"])
        previous_id, previous_hash = event.id, event.hash
    head = session.execute(select(AuditHead).where(AuditHead.id == 1)).scalar_one_or_none()
    if head is None or (head.last_id, head.last_hash) != (previous_id, previous_hash):
        last = "no head" if head is None else f"the head says event {head.last_id}"
        return _bad(
            count,
            previous_hash,
            f"the log ends at event {previous_id} but {last}: events were "
            "deleted from its end, or the head was altered",
        )
    if expected_head is not None and expected_head != previous_hash:
        return _bad(
            count,
            previous_hash,
            f"the log's head hash {previous_hash[:16]}... is not the "
            f"expected {expected_head[:16]}...: the log was rewritten or truncated",
        )
    problem = _compare_rows(session, Measurement, measurement_state, measurements, "measurement")
    problem = problem or _compare_rows(session, Review, review_state, reviews, "review")
    if problem:
        return _bad(count, previous_hash, problem)
    return VerifyReport(True, count, previous_hash)


def _compare_rows(
    session: Session,
    table: type[Measurement] | type[Review],
    state: Any,
    logged: dict[int, dict[str, Any]],
    what: str,
) -> str | None:
    rows = _streamed(session, select(table).order_by(table.id))
    try:
        return _compare(rows, state, logged, what)
    finally:
        rows.close()


def _compare(rows: Any, state: Any, logged: dict[int, dict[str, Any]], what: str) -> str | None:
    for row in rows:
        row_id: int = row.id
        expected = logged.pop(row_id, None)
        if expected is None:
            return f"{what} {row_id} is not in the audit log: it was added outside radcaliper"
        actual = state(row)
        for key, value in expected.items():
            if actual.get(key) != value:
                return (
                    f"{what} {row_id}: {key} is {actual.get(key)!r} in the table but "
                    f"{value!r} in the audit log: the row was changed outside radcaliper"
                )
    if logged:
        first = min(logged)
        return f"{what} {first} is in the audit log but not in the table: it was deleted"
    return None


def _bad(count: int, head: str, problem: str) -> VerifyReport:
    return VerifyReport(False, count, head, problem)
