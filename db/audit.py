"""The audit log: append-only events chained by hashes, and its verification.

Each event's hash is ``sha256(prev_hash || canonical JSON of (id, at, actor, action,
object_type, object_id, details))``; the first event's ``prev_hash`` is :data:`GENESIS`. Event ids
are consecutive from 1: an append locks the one ``audit_head`` row (``SELECT ... FOR UPDATE`` on
PostgreSQL; the write transaction's ``BEGIN IMMEDIATE`` on SQLite), takes ``last_id + 1`` and
moves the head, so concurrent writers queue and the chain never forks.

Every stored fact a reader relies on is logged with its values: users, studies, series, runs,
findings, measurements and reviews (:mod:`db.coverage` lists the fields). :func:`verify` walks
the chain (an edited event no longer matches its hash; a deleted one leaves a gap in the ids; an
inserted or reordered one breaks ``prev_hash``; a truncated tail disagrees with the head), then
replays the log and compares every covered row with the last state the log recorded for it (a
row changed, added or deleted outside radcaliper shows). The first problem is reported with its
table, row id and field.

Memory: per covered row, a digest of its logged state and the id of the event that recorded it;
a row whose digest differs is compared field by field against that event.

What cannot be detected from inside the database: someone who rewrites the whole chain from some
event on, head included. Keep the head hash that ``radcaliper audit verify`` prints somewhere else
(a ticket, a signed report) and pass it back with ``--head`` to detect that too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.coverage import (
    COVERED_TABLES,
    canonical_json,
    canonical_time,
    logged_states,
    measurement_state,
    review_state,
)
from db.models import (
    AuditEvent,
    AuditHead,
    Base,
    Finding,
    Measurement,
    Review,
    Run,
    Series,
    Study,
    User,
)

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
    payload = canonical_json(
        {
            "id": event_id,
            "at": canonical_time(at),
            "actor": actor,
            "action": action,
            "object_type": object_type,
            "object_id": object_id,
            "details": details,
        }
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


# --- verification -------------------------------------------------------------------------------

_MODELS: Mapping[str, type[Base]] = {
    "users": User,
    "studies": Study,
    "series": Series,
    "runs": Run,
    "findings": Finding,
    "measurements": Measurement,
    "reviews": Review,
}


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`; for a row that differs from the log, its table, row id and
    field (None when the whole row was added or deleted)."""

    ok: bool
    events: int
    head_hash: str
    problem: str | None = None
    table: str | None = None
    row_id: int | None = None
    field: str | None = None


@dataclass(frozen=True)
class _Logged:
    """The last state the log recorded for one row, kept small: the digest of its canonical
    JSON, the event that recorded it and the (shared) tuple of its field names."""

    digest: bytes
    event_id: int
    fields: tuple[str, ...]


def _state_digest(state: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(canonical_json(state).encode()).digest()


def _streamed(session: Session, statement: Any) -> Any:
    """Rows of ``statement`` fetched in batches (a server-side cursor on PostgreSQL); close the
    result when done."""
    return session.execute(statement.execution_options(yield_per=2000)).scalars()


def verify(session: Session, *, expected_head: str | None = None) -> VerifyReport:
    """Check the chain, then every covered row (:mod:`db.coverage`) against the log."""
    events = _streamed(session, select(AuditEvent).order_by(AuditEvent.id))
    logged: dict[str, dict[int, _Logged]] = {table: {} for table in COVERED_TABLES}
    try:
        report = _verify_chain(session, events, expected_head, logged)
    finally:
        events.close()
    if report.ok:
        for table in COVERED_TABLES:
            problem = _compare_table(session, table, logged[table])
            if problem is not None:
                return _bad(report.events, report.head_hash, *problem)
    return report


def _verify_chain(
    session: Session,
    events: Iterator[AuditEvent],
    expected_head: str | None,
    logged: dict[str, dict[int, _Logged]],
) -> VerifyReport:
    previous_id, previous_hash = 0, GENESIS
    field_names: dict[tuple[str, ...], tuple[str, ...]] = {}  # one tuple per distinct field set
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
        for table, row_id, state in logged_states(
            event.object_type, event.object_id, event.details
        ):
            names = tuple(state)
            names = field_names.setdefault(names, names)
            logged[table][row_id] = _Logged(_state_digest(state), event.id, names)
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
    return VerifyReport(True, count, previous_hash)


_Problem = tuple[str, str, int | None, str | None]  # message, table, row id, field


def _compare_table(session: Session, table: str, logged: dict[int, _Logged]) -> _Problem | None:
    """The first row of ``table`` that differs from ``logged`` (which it empties of the rows it
    finds). Rows are streamed; the log's events of rows whose digest differs are read after
    the stream is closed."""
    model = _MODELS[table]
    state = COVERED_TABLES[table]
    suspects: list[tuple[int, dict[str, Any], _Logged]] = []  # digest differs: compare later
    added: int | None = None
    rows = _streamed(session, select(model).order_by(model.id))  # type: ignore[attr-defined]
    try:
        for row in rows:
            expected = logged.pop(row.id, None)
            if expected is None:
                added = row.id
                break
            full = state(row)
            actual = {name: full.get(name) for name in expected.fields}
            if _state_digest(actual) != expected.digest:
                suspects.append((row.id, actual, expected))
    finally:
        rows.close()
    problem = _first_difference(session, table, suspects)
    if problem is not None:
        return problem
    if added is not None:
        return (
            f"table {table}, row {added}: not in the audit log: it was added outside radcaliper",
            table,
            added,
            None,
        )
    if logged:
        first = min(logged)
        return (
            f"table {table}, row {first}: in the audit log (event {logged[first].event_id}) "
            "but not in the table: it was deleted",
            table,
            first,
            None,
        )
    return None


def _first_difference(
    session: Session, table: str, suspects: list[tuple[int, dict[str, Any], _Logged]]
) -> _Problem | None:
    """Field by field, for rows whose digest differs from the logged one (the log's own event is
    read again). Equal values of another JSON spelling (``1`` and ``1.0``) are no difference."""
    for row_id, actual, expected in suspects:
        event = session.get(AuditEvent, expected.event_id)
        recorded = {} if event is None else _recorded(event, table, row_id)
        for name in expected.fields:
            if actual.get(name) != recorded.get(name):
                return (
                    f"table {table}, row {row_id}, field {name}: {actual.get(name)!r} in the "
                    f"table but {recorded.get(name)!r} in the audit log (event "
                    f"{expected.event_id}): the row was changed outside radcaliper",
                    table,
                    row_id,
                    name,
                )
    return None


def _recorded(event: AuditEvent, table: str, row_id: int) -> dict[str, Any]:
    for logged_table, logged_id, state in logged_states(
        event.object_type, event.object_id, event.details
    ):
        if (logged_table, logged_id) == (table, row_id):
            return dict(state)
    return {}


def _bad(
    count: int,
    head: str,
    problem: str,
    table: str | None = None,
    row_id: int | None = None,
    field: str | None = None,
) -> VerifyReport:
    return VerifyReport(False, count, head, problem, table, row_id, field)
