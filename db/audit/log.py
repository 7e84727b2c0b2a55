"""The audit log's writer: events appended to the hash chain (:func:`append_event` in an ORM
session, :func:`append_event_core` in a migration), and :func:`event_hash`, the hash that chains
them (the design of the log and of its verification is in :mod:`db.audit`'s docstring).

Each event's hash is ``sha256(prev_hash || canonical JSON of (id, at, actor, action,
object_type, object_id, details))``; the first event's ``prev_hash`` is :data:`GENESIS`. This
module loads neither numpy nor multiprocessing: only :func:`db.audit.verify` does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, MetaData, select
from sqlalchemy.orm import Session

from db.audit.coverage import canonical_json, canonical_time
from db.models import AuditEvent, AuditHead

__all__ = ["GENESIS", "append_event", "append_event_core", "event_hash"]

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
