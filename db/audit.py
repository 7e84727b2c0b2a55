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
compares every covered row with the last state the log recorded for it (a row changed, added or
deleted outside radcaliper shows). The first problem is reported with its table, row id and
field.

:func:`verify` streams (:mod:`db.audit_verify`, imported when it runs, so that writers of the
log load neither numpy nor multiprocessing), because a log grows without bound while a verify
must not:

- Events and rows are read as plain DB-API rows in batches (a server-side cursor on
  PostgreSQL), never as ORM objects, in one snapshot.
- Each event's hash depends on its own row only (its stored ``prev_hash`` and content), so
  events are hashed independently, batch by batch, and the linkage (consecutive ids, each
  ``prev_hash`` equal to the previous hash) is a separate comparison. The canonical JSON is
  rebuilt with orjson: when that text hashes to the stored hash it *is* the signed text; when
  it does not, the exact :func:`event_hash` decides. The stored formats do not change.
- For each covered row, the last state the log recorded is kept as three 64-bit numbers and a
  field-set number in numpy arrays sorted by row id: the row id, the event id and a keyed
  digest of the state (28 bytes a row). Memory is proportional to the number of covered rows,
  not to the number or size of events (a row logged again keeps one entry): about 55 MB for a
  million measurements with their findings, runs, series and studies.
- Each covered table is then streamed in id order and each row's state digested the same way
  and looked up (a merge by id); a row whose digest differs is compared field by field, read
  again with its column types, against the event that recorded it.
- A full verify of a large log may share the work with a forked second process reading the same
  snapshot (the later half of the events, then the upper half of each table's row ids).

``verify(since_head=HASH)`` checks only what was appended after the event whose hash is HASH
(a head an earlier verify printed): that event's own hash, the chain after it (linkage, hashes,
head) and the rows the later events recorded, each against its last logged state. Earlier
events and the rows only they recorded are not read again, and rows added outside radcaliper
are not looked for: a full verify does both.

Besides the rows, a verify checks the log's own guards: exactly one ``audit_head`` row, the
append-only triggers as schema 0001 created them (:mod:`db.append_only`), and that the schema
revision the events say the database was last migrated to (``schema.upgraded`` /
``schema.downgraded`` events, or for older logs what their content implies) is the one its
version table says: a version set back outside radcaliper, to make a migration record tampered
rows as a new baseline, shows. :func:`db.migrate.upgrade` and ``downgrade`` run this check
first and refuse to migrate a database it does not vouch for.

What cannot be detected from inside the database: someone who rewrites the whole chain from some
event on, head included. Keep the head hash that ``radcaliper audit verify`` prints somewhere else
(a ticket, a signed report) and pass it back with ``--head`` to detect that too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, MetaData, select
from sqlalchemy.orm import Session

from db.coverage import canonical_json, canonical_time, measurement_state, review_state
from db.models import AuditEvent, AuditHead
from ingestion.errors import StorageError

__all__ = [
    "GENESIS",
    "UnknownHeadError",
    "VerifyReport",
    "append_event",
    "append_event_core",
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


def append_event_core(
    connection: Connection,
    *,
    actor: str,
    action: str,
    object_type: str,
    object_id: int | None,
    details: Mapping[str, Any],
) -> int:
    """Append one event through SQLAlchemy Core on tables reflected from the database (what a
    migration writes, whatever the models say); its id."""
    tables = MetaData()
    tables.reflect(connection, only=("audit_events", "audit_head"))
    events, head = tables.tables["audit_events"], tables.tables["audit_head"]
    query = select(head.c.last_id, head.c.last_hash).where(head.c.id == 1)
    if connection.dialect.name == "postgresql":
        query = query.with_for_update()
    last_id, last_hash = connection.execute(query).one()
    at, event_id = datetime.now(UTC), int(last_id) + 1
    digest = event_hash(last_hash, event_id, at, actor, action, object_type, object_id, details)
    connection.execute(
        events.insert().values(
            id=event_id,
            at=at,
            actor=actor,
            action=action,
            object_type=object_type,
            object_id=object_id,
            details=dict(details),
            prev_hash=last_hash,
            hash=digest,
        )
    )
    connection.execute(
        head.update().where(head.c.id == 1).values(last_id=event_id, last_hash=digest)
    )
    return event_id


# --- verification -------------------------------------------------------------------------------


class UnknownHeadError(StorageError):
    """``since_head`` is the hash of no event in the log."""


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


def verify(
    session: Session,
    *,
    expected_head: str | None = None,
    since_head: str | None = None,
    processes: int = 1,
) -> VerifyReport:
    """Check the chain, then every covered row (:mod:`db.coverage`) against the log, then the
    log's own guards: one ``audit_head`` row, the append-only triggers (:mod:`db.append_only`)
    and, on a full verify, that the schema the events say the database is at is the one its
    version table says.

    The rows are compared as the database's schema covers them (:data:`db.coverage.COVERED_SINCE`):
    a database at an earlier schema (the check before a migration) has its covered tables
    compared whole and the others' logged rows one by one; a column it lacks reads as NULL.

    Args:
        session: a session on the store (best a fresh one: on PostgreSQL its transaction is
            then made ``REPEATABLE READ``, one snapshot for the whole check).
        expected_head: a head hash kept from an earlier verify: the log must still end there.
        since_head: check only what was appended after the event with this hash (see the
            module docstring for what that leaves out).
        processes: 2 lets a full verify of a large log (50,000 events and more) share the work
            with a forked second process reading the same snapshot.

    Raises:
        UnknownHeadError: no event has the hash ``since_head``.
    """
    from db.audit_verify import run

    return run(session, expected_head, since_head, processes)
