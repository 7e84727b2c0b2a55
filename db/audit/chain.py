"""The chain, for :mod:`db.audit.verification`: :func:`_walk` reads events in id order and checks
each against the one before it (id, ``prev_hash``) and against its own hash; :func:`_chain_report`
turns where it stopped into a :class:`~db.audit.report.VerifyReport`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from db.audit.coverage import (
    canonical_time,
    implied_revision,
    schema_change,
)
from db.audit.log import GENESIS, event_hash
from db.audit.reading import _ROW_ERRORS, _SHA256, DbRow, _fast_loads, _sorted_json, _Source
from db.audit.report import UnknownHeadError, VerifyReport, _bad
from db.audit.rows import _Logged, _revision_key

__all__: list[str] = []  # internals of db.audit.verification


# --- the chain -----------------------------------------------------------------------------------


@dataclass
class _Chain:
    """Where the walk along the chain stands: the last event checked and how many; for a walk
    that starts on an unknown event (the second process), that event's id and prev_hash. And
    what the events say of the schema: the last schema event (its id, the revision it migrated
    to), and after it the event whose content implies the latest revision (its id, that
    revision)."""

    last_id: int
    last_hash: str
    count: int = 0
    first: tuple[int, str] | None = None
    schema: tuple[int, str | None] | None = None
    implied: tuple[int, str] | None = None

    def note_schema(self, event_id: int, action: str, details: Mapping[str, Any]) -> None:
        change = schema_change(action, details)
        if change is not None:
            self.schema, self.implied = (event_id, change[0]), None
            return
        revision = implied_revision(action, details)
        if revision is None or (self.implied is not None and self.implied[1] == revision):
            return  # most events: states in details["rows"], implied already
        if self.implied is None or _revision_key(revision) > _revision_key(self.implied[1]):
            self.implied = (event_id, revision)

    def follow(self, later: _Chain) -> None:
        """Take over what ``later`` (the events after this chain's) says of the schema."""
        if later.schema is not None:
            self.schema, self.implied = later.schema, later.implied
        elif later.implied is not None and (
            self.implied is None or _revision_key(later.implied[1]) > _revision_key(self.implied[1])
        ):
            self.implied = later.implied


def _event_sql(source: _Source, where: str) -> str:
    q = source.quote
    details = f"{q('details')}::text" if source.postgres else q("details")
    columns = [q(c) for c in ("id", "at", "actor", "action", "object_type", "object_id")]
    return (
        f"SELECT {', '.join(columns)}, {details}, {q('prev_hash')}, {q('hash')} "
        f"FROM {q('audit_events')} WHERE {where}"
    )


def _fast_time(value: Any) -> str:
    """``at`` as canonical text without parsing it (SQLite's stored text, when it has the form
    SQLAlchemy writes); "" when there is no such shortcut (the exact hash decides then)."""
    if isinstance(value, str):
        return f"{value[:10]}T{value[11:]}Z" if len(value) == 26 and value[10] == " " else ""
    if isinstance(value, datetime):
        return canonical_time(value)
    return ""


def _intact_details(source: _Source, row: DbRow) -> Any:
    """The event's details when its stored content matches its stored hash, else None.

    Fast: the payload rebuilt with orjson; when its SHA-256 is the stored hash, it is the very
    text that was hashed when the event was appended. Otherwise :func:`event_hash` decides."""
    event_id, at, actor, action, object_type, object_id, text, prev_hash, stored = row
    if isinstance(text, str) and isinstance(prev_hash, str):
        try:
            details = _fast_loads(text)
            payload = _sorted_json(
                {
                    "action": action, "actor": actor, "at": _fast_time(at), "details": details,
                    "id": event_id, "object_id": object_id, "object_type": object_type,
                }
            )  # fmt: skip
        except (TypeError, ValueError):
            return _exact_details(source, row)
        hasher = _SHA256.copy()
        hasher.update(prev_hash.encode())
        hasher.update(payload)
        if hasher.hexdigest() == stored:
            return details
    return _exact_details(source, row)


def _exact_details(source: _Source, row: DbRow) -> Any:
    """The event as the ORM reads it, hashed by :func:`event_hash`: its details, or None."""
    event_id, at, actor, action, object_type, object_id, text, prev_hash, stored = row
    try:
        details = json.loads(text) if isinstance(text, str) else text
        expected = event_hash(
            prev_hash, event_id, source.event_time(at), actor, action, object_type, object_id,
            details,
        )  # fmt: skip
    except _ROW_ERRORS:  # not even readable
        return None
    return details if expected == stored else None


def _ids_jump(last_id: int, event_id: int) -> str:
    return (
        f"audit events {last_id + 1}..{event_id - 1} are missing "
        f"(the ids jump from {last_id} to {event_id}): events were deleted"
    )


def _does_not_follow(event_id: int, last_id: int) -> str:
    return (
        f"audit event {event_id} does not follow event {last_id} "
        "(its prev_hash differs): an event was inserted, replaced or reordered"
    )


def _check_events(
    source: _Source, batch: list[DbRow], chain: _Chain, logged: _Logged
) -> str | None:
    """Check one batch of events in id order; the first problem, or None."""
    for row in batch:
        chain.count += 1
        event_id = row[0]
        if event_id != chain.last_id + 1:
            return _ids_jump(chain.last_id, event_id)
        if row[7] != chain.last_hash:
            return _does_not_follow(event_id, chain.last_id)
        details = _intact_details(source, row)
        if details is None:
            return (
                f"audit event {event_id} ({row[3]} by {row[2]}) "
                "was edited: its content no longer matches its hash"
            )
        if isinstance(details, dict):
            logged.record(row[3], row[4], row[5], details, event_id)
            chain.note_schema(event_id, row[3], details)
        chain.last_id, chain.last_hash = event_id, row[8]
    return None


def _walk(
    source: _Source, chain: _Chain, logged: _Logged, *, upto: int | None = None
) -> str | None:
    """Events after ``chain.last_id`` (up to ``upto``); the first problem, or None. A chain
    with ``first`` set to ``(0, "")`` takes its first event's id and prev_hash as given."""
    q = source.quote
    where = f"{q('id')} > {source.mark}" + ("" if upto is None else f" AND {q('id')} <= {upto:d}")
    with source.batches(_event_sql(source, where) + " ORDER BY 1", [chain.last_id]) as batches:
        for batch in batches:
            if chain.first == (0, ""):
                chain.first = (batch[0][0], batch[0][7])
                chain.last_id, chain.last_hash = batch[0][0] - 1, batch[0][7]
            problem = _check_events(source, batch, chain, logged)
            if problem is not None:
                return problem
    return None


def _chain_report(
    chain: _Chain, problem: str | None, head: tuple[int, str] | None, expected_head: str | None
) -> VerifyReport:
    """The chain's verdict: its first problem, else whether it ends at the head (and at the
    expected head)."""
    if problem is not None:
        return _bad(chain.count, chain.last_hash, problem)
    if head != (chain.last_id, chain.last_hash):
        last = "no head" if head is None else f"the head says event {head[0]}"
        return _bad(
            chain.count,
            chain.last_hash,
            f"the log ends at event {chain.last_id} but {last}: events were "
            "deleted from its end, or the head was altered",
        )
    if expected_head is not None and expected_head != chain.last_hash:
        return _bad(
            chain.count,
            chain.last_hash,
            f"the log's head hash {chain.last_hash[:16]}... is not the "
            f"expected {expected_head[:16]}...: the log was rewritten or truncated",
        )
    return VerifyReport(True, chain.count, chain.last_hash)


def _start_after(source: _Source, head_hash: str) -> _Chain | VerifyReport:
    """The chain at the event whose hash is ``head_hash``, checked against its own content;
    :class:`UnknownHeadError` when no event has that hash."""
    if head_hash == GENESIS:
        return _Chain(0, GENESIS)
    sql = _event_sql(source, f"{source.quote('hash')} = {source.mark}")
    with source.batches(sql, [head_hash]) as batches:
        rows = [row for batch in batches for row in batch]
    if not rows:
        raise UnknownHeadError(
            f"no audit event has the hash {head_hash!r}: give a head hash that an earlier "
            "verify printed (if it was one, its event was deleted or changed: run a full verify)"
        )
    row = rows[0]
    if _intact_details(source, row) is None:
        return _bad(
            1,
            head_hash,
            f"audit event {row[0]} ({row[3]} by {row[2]}), the given head, "
            "was edited: its content no longer matches its hash",
        )
    return _Chain(row[0], head_hash)
