"""The audit log: append-only events chained by hashes, and its verification.

The modules: :mod:`db.audit.log` (the writer and the event hash), :mod:`db.audit.coverage` (the
stored facts the log records and their states), :mod:`db.audit.append_only` (the triggers'
check), :mod:`db.audit.report` (what a verify answers) and :mod:`db.audit.verification` (the
verify, with its parts :mod:`db.audit.reading`, :mod:`db.audit.chain`, :mod:`db.audit.rows` and
:mod:`db.audit.fork`). Names are served lazily (PEP 562).

Each event's hash is ``sha256(prev_hash || canonical JSON of (id, at, actor, action,
object_type, object_id, details))``; the first event's ``prev_hash`` is :data:`GENESIS`. Event ids
are consecutive from 1: an append locks the one ``audit_head`` row (``SELECT ... FOR UPDATE`` on
PostgreSQL; the write transaction's ``BEGIN IMMEDIATE`` on SQLite), takes ``last_id + 1`` and
moves the head, so concurrent writers queue and the chain never forks.

Every stored fact a reader relies on is logged with its values: users, studies, series, runs,
findings, measurements and reviews (:mod:`db.audit.coverage` lists the fields). :func:`verify` walks
the chain (an edited event no longer matches its hash; a deleted one leaves a gap in the ids; an
inserted or reordered one breaks ``prev_hash``; a truncated tail disagrees with the head), then
compares every covered row with the last state the log recorded for it (a row changed, added or
deleted outside radcaliper shows). The first problem is reported with its table, row id and
field.

:func:`verify` streams (:mod:`db.audit.verification`, imported when it is first used, so that
writers of the log load neither numpy nor multiprocessing), because a log grows without bound
while a verify must not:

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
append-only triggers as schema 0001 created them (:mod:`db.audit.append_only`), and that the schema
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

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from db.audit.coverage import canonical_time, measurement_state, review_state
    from db.audit.log import GENESIS, append_event, append_event_core, event_hash
    from db.audit.report import UnknownHeadError, VerifyReport
    from db.audit.verification import verify

_SOURCES: dict[str, tuple[str, ...]] = {
    "db.audit.coverage": ("canonical_time", "measurement_state", "review_state"),
    "db.audit.log": ("GENESIS", "append_event", "append_event_core", "event_hash"),
    "db.audit.report": ("UnknownHeadError", "VerifyReport"),
    "db.audit.verification": ("verify",),
}
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

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
