"""How :func:`verify` (:func:`db.audit.verify`) streams: events and rows in batches, and a compact
record of the last state the log recorded for each row (the design is in :mod:`db.audit`'s
docstring). This module runs a verify; its parts are :mod:`db.audit.reading` (plain rows, fast
JSON, digests), :mod:`db.audit.chain`, :mod:`db.audit.rows` (the logged states and the tables)
and :mod:`db.audit.fork` (the second process).

- **The chain.** :func:`_walk` reads events in id order, ``_BATCH`` at a time, and checks each
  against the one before it (id, ``prev_hash``) and against its own hash. The payload is rebuilt
  with orjson (sorted keys): where its SHA-256 is the stored hash it is the very text that was
  hashed when the event was appended, so the event is intact; where it is not (orjson spells
  floats under 1e-4 and non-ASCII text differently from ``json.dumps``), the exact
  :func:`db.audit.event_hash` of the event as the ORM reads it decides.
- **The last logged states** (:class:`_Logged`): per table, numpy arrays sorted by row id of the
  event that recorded the row's last state, a 64-bit BLAKE2b digest of that state's JSON keyed
  with a random key per verify (no row can be prepared to collide with a logged state), and
  the number of the state's set of field names (an older event records fewer fields; only
  those are compared). New entries wait in plain arrays; every ``_PENDING`` of them are sorted
  in, replacing the entries of rows logged again, in place.
- **The tables** (:func:`_compare_table`): each table in id order, as plain rows; the
  :mod:`db.audit.coverage` state of each (bulky values digested through orjson: a result equal to
  the logged digest can only come from the logged value) digested like the logged ones and
  looked up by binary search. A row whose digest differs is read again with its column types
  and compared field by field with its event, exactly as before (values of another JSON
  spelling, ``1`` and ``1.0``, are no difference); the first row in id order that differs or
  is not in the log is named; else the first logged row that is not in the table.
- **Two processes** (:func:`_verify_in_two`, a full verify of ``_PARALLEL_MIN_EVENTS`` events
  or more, where ``fork`` exists): a forked process walks the later half of the events while
  this one walks the earlier half (the linkage at the split is checked when they join; its
  arrays come back in an ``.npz`` file), then it compares the upper half of each table's row
  ids while this one compares the lower half. It reads the same snapshot: PostgreSQL's
  exported snapshot, or on SQLite a fresh read transaction whose head must be this one's (if
  not, or if it fails, this process does its part itself). The arrays it needs in the second
  step it shares with this process through ``fork``.

Memory: 28 bytes per covered row (and one byte per row of the table being compared), one batch
of events or rows, and the arrays of rows logged since the last sort; not the number of events.
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from db.audit.append_only import append_only_problem
from db.audit.chain import _Chain, _chain_report, _start_after, _walk
from db.audit.coverage import (
    COVERED_TABLES,
)
from db.audit.fork import _can_fork, _Forked, _join, _share, _Shared, _upper_events, _upper_tables
from db.audit.log import GENESIS
from db.audit.reading import _head, _no_cyclic_gc, _Problem, _Source
from db.audit.report import VerifyReport, _bad
from db.audit.rows import (
    _compare_recorded,
    _compare_tables,
    _covered_whole,
    _first_problem,
    _Logged,
    _revision_key,
)
from db.models import AuditEvent, AuditHead

__all__ = ["run", "verify"]

logger = logging.getLogger(__name__)

_PARALLEL_MIN_EVENTS = 50_000  # a smaller log is verified in one process


# --- verify --------------------------------------------------------------------------------------


def _fresh_snapshot(session: Session) -> None:
    """One snapshot for the whole verify: PostgreSQL's ``REPEATABLE READ`` when the session
    has not begun yet on an engine of its own (SQLite's read transaction is one snapshot
    already; a session on a connection in a transaction, a migration's, reads in that one)."""
    bind = session.get_bind()
    if not isinstance(bind, Engine) or session.in_transaction():
        return
    if bind.dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def verify(
    session: Session,
    *,
    expected_head: str | None = None,
    since_head: str | None = None,
    processes: int = 1,
) -> VerifyReport:
    """Check the chain, then every covered row (:mod:`db.audit.coverage`) against the log, then
    the log's own guards: one ``audit_head`` row, the append-only triggers
    (:mod:`db.audit.append_only`) and, on a full verify, that the schema the events say the
    database is at is the one its version table says.

    The rows are compared as the database's schema covers them
    (:data:`db.audit.coverage.COVERED_SINCE`): a database at an earlier schema (the check before
    a migration) has its covered tables compared whole and the others' logged rows one by one;
    a column it lacks reads as NULL.

    Args:
        session: a session on the store (best a fresh one: on PostgreSQL its transaction is
            then made ``REPEATABLE READ``, one snapshot for the whole check).
        expected_head: a head hash kept from an earlier verify: the log must still end there.
        since_head: check only what was appended after the event with this hash (see
            :mod:`db.audit`'s docstring for what that leaves out).
        processes: 2 lets a full verify of a large log (50,000 events and more) share the work
            with a forked second process reading the same snapshot.

    Raises:
        UnknownHeadError: no event has the hash ``since_head``.
    """
    return run(session, expected_head, since_head, processes)


def run(
    session: Session, expected_head: str | None, since_head: str | None, processes: int
) -> VerifyReport:
    """:func:`db.audit.verify`."""
    from db.migrate import stored_revision

    _fresh_snapshot(session)
    with _no_cyclic_gc():
        source = _Source(session)
        logged = _Logged(os.urandom(16))
        revision = stored_revision(session.connection())
        if since_head is not None:
            return _verify_since(source, logged, since_head, expected_head, revision)
        whole = _covered_whole(revision)
        last = session.execute(select(func.max(AuditEvent.id))).scalar() or 0
        large = processes > 1 and last >= _PARALLEL_MIN_EVENTS and _can_fork()
        shared = _share(session) if large else None
        if shared is not None:
            return _verify_in_two(source, logged, shared, last // 2, expected_head, revision)
        chain = _Chain(0, GENESIS)
        report = _chain_report(chain, _walk(source, chain, logged), _head(session), expected_head)
        if not report.ok:
            return report
        logged.compact()
        outcomes = ((outcome,) for outcome in _compare_tables(source, logged, whole))
        return _finish(report, source, _first_problem(outcomes), chain, revision)


def _verify_since(
    source: _Source,
    logged: _Logged,
    since_head: str,
    expected_head: str | None,
    revision: str | None,
) -> VerifyReport:
    start = _start_after(source, since_head)
    if isinstance(start, VerifyReport):
        return start
    problem = _walk(source, start, logged)
    report = _chain_report(start, problem, _head(source.session), expected_head)
    if not report.ok:
        return report
    logged.compact()
    outcomes = ((_compare_recorded(source, t, logged),) for t in COVERED_TABLES)
    return _finish(report, source, _first_problem(outcomes), None, revision)


def _verify_in_two(
    source: _Source,
    logged: _Logged,
    shared: _Shared,
    split: int,
    expected_head: str | None,
    revision: str | None,
) -> VerifyReport:
    """The events after ``split`` in a second process while this one walks those before; then
    each table's upper half of row ids there while this one compares the lower half."""
    key = logged.state_digest.key
    with tempfile.TemporaryDirectory(prefix="radcaliper-verify-") as folder:
        path = os.path.join(folder, "upper.npz")
        engine = source.session.get_bind().engine
        upper = _Forked(lambda: _upper_events(shared, key, split, path), engine)
        chain = _Chain(0, GENESIS)
        try:
            problem = _walk(source, chain, logged, upto=split)
            found = None if problem is not None else upper.result()
        finally:
            upper.cancel()  # stopped, whatever happened here (nothing to do after a result)
        if problem is None:
            if found is None:
                _alone("the events after the split")
                problem = _walk(source, chain, logged)
            else:
                problem = _join(chain, found)
                if problem is None:
                    logged.absorb(found.parts)
    report = _chain_report(chain, problem, _head(source.session), expected_head)
    if not report.ok:
        return report
    logged.compact()
    whole = _covered_whole(revision)
    splits = {t: _median(logged.tables[t].ids) for t in COVERED_TABLES}
    second = _Forked(lambda: _upper_tables(shared, logged, whole, splits), engine)
    try:
        lower = _compare_tables(source, logged, whole, high=splits)
        higher = second.result()
    finally:
        second.cancel()
    if higher is None:
        _alone("the upper half of each table")
        higher = _compare_tables(source, logged, whole, low=splits)
    rows = _first_problem(zip(lower, higher, strict=False))
    return _finish(report, source, rows, chain, revision)


def _finish(
    report: VerifyReport,
    source: _Source,
    rows: _Problem | None,
    chain: _Chain | None,
    revision: str | None,
) -> VerifyReport:
    """After an intact chain: the first row that differs, else the guards of the log itself
    (one head row, the append-only triggers), else (``chain``: a full walk) whether what the
    events say of the schema is what the database says."""
    if rows is not None:
        return _bad(report.events, report.head_hash, *rows)
    problem = _head_rows(source) or append_only_problem(source.session.connection())
    if problem is None and chain is not None:
        problem = _schema_problem(chain, revision)
    return report if problem is None else _bad(report.events, report.head_hash, problem)


def _head_rows(source: _Source) -> str | None:
    count = source.session.execute(select(func.count()).select_from(AuditHead)).scalar_one()
    if count != 1:
        return (
            f"the audit_head table has {count} rows instead of one: it was changed outside "
            "radcaliper"
        )
    return None


def _schema_problem(chain: _Chain, revision: str | None) -> str | None:
    """Whether the schema the events say the database is at is the one its version table says:
    the last schema event's revision, and no later event written at a later schema."""
    says = "no schema version" if revision is None else f"schema {revision}"
    if chain.schema is not None:
        event_id, to = chain.schema
        if to != revision:
            return (
                f"the audit log says the database was migrated to schema {to or 'none'} (event "
                f"{event_id}) but the database says {says}: its schema version was changed "
                "outside radcaliper"
            )
    if chain.implied is not None:
        event_id, implied = chain.implied
        if revision is None or _revision_key(implied) > _revision_key(revision):
            return (
                f"audit event {event_id} was written at schema {implied} or later, but the "
                f"database says {says}: its schema version was set back outside radcaliper"
            )
    return None


def _alone(part: str) -> None:
    """The second process could not do its part (the SQLite database moved on since this
    process's snapshot, or it failed): this process does it."""
    logger.info("audit verify: the second process could not check %s: checking it here", part)


def _median(ids: np.ndarray) -> int:
    return int(ids[len(ids) // 2]) if len(ids) else 0
