"""How :func:`db.audit.verify` streams: events and rows in batches, and a compact record of the
last state the log recorded for each row (the design is in :mod:`db.audit`'s docstring).

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
  :mod:`db.coverage` state of each (bulky values digested through orjson: a result equal to
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

import contextlib
import functools
import gc
import hashlib
import itertools
import json
import logging
import math
import multiprocessing
import os
import re
import sys
import tempfile
from array import array
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

import numpy as np
from sqlalchemy import JSON, Column, DateTime, Table, func, inspect, literal, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from db.append_only import append_only_problem
from db.audit import GENESIS, UnknownHeadError, VerifyReport, event_hash
from db.coverage import (
    COVERED_SINCE,
    COVERED_TABLES,
    canonical_json,
    canonical_time,
    digest,
    implied_revision,
    logged_states,
    revision_number,
    schema_change,
)
from db.engine import in_memory
from db.models import AuditEvent, AuditHead, Base

__all__ = ["run"]

logger = logging.getLogger(__name__)

_BATCH = 1024  # rows fetched (and events hashed) at a time
_IN_LIST = 500  # row ids per "WHERE id IN (...)" of a since-head check
_PENDING = 1 << 15  # logged entries gathered before they are sorted into a table's arrays
_PARALLEL_MIN_EVENTS = 50_000  # a smaller log is verified in one process
_DIGEST_BYTES = 8
_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_ZEROS = b"0" * 19
_SNAPSHOT_ID = re.compile(r"[0-9A-Fa-f-]+")
_SHA256 = hashlib.sha256()  # copied: cheaper than a new one for each event
_ROW_ERRORS = (ValueError, TypeError, AttributeError, LookupError, OverflowError)

DbRow = tuple[Any, ...]
_Problem = tuple[str, str, int | None, str | None]  # message, table, row id, field
_T = TypeVar("_T")


# --- JSON, fast where that is exact --------------------------------------------------------------

_fast_loads: Callable[[str | bytes], Any]
_sorted_json: Callable[[Any], bytes]  # canonical JSON's order and values, maybe other spellings
_plain_json: Callable[[Any], bytes]  # keys in the dict's order


def _stdlib_sorted_json(value: Any) -> bytes:
    return canonical_json(value).encode()


try:
    import orjson
except ImportError:  # pragma: no cover - orjson comes with gradio; verify is slower without it
    _fast_loads, _sorted_json, _plain_json = json.loads, _stdlib_sorted_json, _stdlib_sorted_json
    _READS_FINITE = False
else:
    _fast_loads, _plain_json = orjson.loads, orjson.dumps
    _sorted_json = functools.partial(orjson.dumps, option=orjson.OPT_SORT_KEYS)
    _READS_FINITE = True  # orjson reads no NaN or infinite number


_NOT_READ = object()


def _fast_read(text: str) -> Any:
    """What ``json.loads(text)`` gives, read by orjson where the two agree, else
    :data:`_NOT_READ`: orjson turns integers beyond 64 bits into floats (without 19 digits in a
    row there is no such integer) and refuses NaN, Infinity, numbers beyond a double and lone
    surrogates (``json`` reads those)."""
    data = text.encode()
    if _NINETEEN_ZEROS not in data.translate(_DIGITS_AS_ZEROS):
        try:
            return _fast_loads(data)
        except ValueError:
            pass
    return _NOT_READ


def _load_json(text: str) -> Any:
    """``json.loads(text)`` (what radcaliper reads a JSON column with), faster."""
    value = _fast_read(text)
    return json.loads(text) if value is _NOT_READ else value


def _fast_digest(value: Any) -> str:
    """:func:`db.coverage.digest` through orjson, of a text or a JSON column's value as
    :func:`_finite_json` reads it (no NaN or infinite float, which orjson would write as null).
    Where orjson spells the value differently from ``json.dumps`` (floats under 1e-4, text with
    DEL) the result differs from the stored digest and the row is compared exactly; an equal
    result means the very text the stored digest hashed, so the value is the logged one."""
    try:
        text = _sorted_json(value)
    except (TypeError, ValueError):
        return digest(value)
    if not text.isascii():
        return digest(value)  # orjson writes UTF-8 where json writes \\u escapes
    return "sha256:" + hashlib.sha256(text).hexdigest()


class _StateDigest:
    """A keyed 64-bit digest of a state's JSON in its keys' order (a state from the log and one
    from a row list their fields in the same order), as a signed integer: no row can be
    prepared in advance to collide with a logged state, since the key is secret and random.

    Where Python's hashes are randomized (the default: ``PYTHONHASHSEED`` unset or ``random``),
    its keyed SipHash of the bytes, with the process's random key (a forked second process
    shares it); else BLAKE2b keyed with ``key`` (about 0.7 us slower a state)."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._keyed = hashlib.blake2b(digest_size=_DIGEST_BYTES, key=key)
        self.of_text: Callable[[bytes], int] = hash if _randomized_hashes() else self._blake2b

    def _blake2b(self, text: bytes) -> int:
        hasher = self._keyed.copy()
        hasher.update(text)
        return int.from_bytes(hasher.digest(), "little", signed=True)

    def __call__(self, state: Mapping[str, Any]) -> int:
        try:
            text = _plain_json(state)
        except (TypeError, ValueError):  # orjson: an integer beyond 64 bits
            text = _stdlib_sorted_json(state)
        return self.of_text(text)


def _non_finite(value: Any) -> bool:
    """Whether ``value`` (JSON-like) holds a NaN or an infinite float anywhere."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    return False


def _finite_floats(state: Mapping[str, Any]) -> bool:
    """Whether every float of a row's state (a value, or one in a list such as a range) is
    finite: orjson writes NaN and Infinity as null, so a row with one is compared exactly.
    (The values of JSON columns were checked when they were read: :func:`_finite_json`.)"""
    for value in state.values():
        kind = value.__class__
        if kind is float:
            if value - value != 0.0:
                return False
        elif kind is list:  # a range from float columns (a JSON column's list is checked)
            for item in value:
                if item.__class__ is float and item - item != 0.0:
                    return False
    return True


def _randomized_hashes() -> bool:
    return bool(sys.flags.hash_randomization) and os.environ.get("PYTHONHASHSEED", "random") in (
        "",
        "random",
    )


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Millions of short-lived dicts and no reference cycles: the cyclic collector would only
    rescan them (a fifth of the time); reference counting still frees everything."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- plain rows ----------------------------------------------------------------------------------

_make_row_type: Callable[[str, list[str]], Any] = namedtuple


class _Source:
    """The verify's connection as plain DB-API rows, streamed a batch at a time."""

    def __init__(self, session: Session) -> None:
        connection = session.connection()
        self.session = session
        self.dialect = connection.dialect
        self.postgres = connection.dialect.name == "postgresql"
        self.dbapi: Any = connection.connection.dbapi_connection
        self.mark = "%s" if self.postgres else "?"
        self._cursors = itertools.count()
        self._present: dict[str, frozenset[str]] = {}
        at_type = _table("audit_events").c.at.type
        self._event_time = at_type.dialect_impl(self.dialect).result_processor(self.dialect, None)

    def quote(self, name: str) -> str:
        return str(self.dialect.identifier_preparer.quote(name))

    def present(self, table: str) -> frozenset[str]:
        """The columns ``table`` has in this database (a database at an earlier schema, or
        one whose columns were dropped, lacks some of the model's: they read as NULL)."""
        found = self._present.get(table)
        if found is None:
            columns = inspect(self.session.connection()).get_columns(table)
            found = self._present[table] = frozenset(c["name"] for c in columns)
        return found

    def select_list(self, table: str) -> str:
        """The model's columns of ``table`` for a SELECT, NULL for those the table lacks."""
        present = self.present(table)
        return ", ".join(
            self.quote(c.name) if c.name in present else f"NULL AS {self.quote(c.name)}"
            for c in _table(table).columns
        )

    def marks(self, count: int) -> str:
        return ", ".join([self.mark] * count)

    @contextlib.contextmanager
    def batches(self, sql: str, params: Sequence[Any] = ()) -> Iterator[Iterator[list[DbRow]]]:
        """The rows of ``sql``, ``_BATCH`` at a time (a server-side cursor on PostgreSQL)."""
        if self.postgres:
            cursor = self.dbapi.cursor(name=f"radcaliper_verify_{next(self._cursors)}")
        else:
            cursor = self.dbapi.cursor()
        try:
            cursor.execute(sql, tuple(params))
            yield iter(lambda: list(cursor.fetchmany(_BATCH)), [])
        finally:
            cursor.close()

    def event_time(self, value: Any) -> Any:
        """``at`` as the ORM reads it (a datetime)."""
        return value if self._event_time is None else self._event_time(value)

    def converter(self, column: Column[Any]) -> Callable[[Any], Any] | None:
        """How a stored value becomes what the ORM reads; None: as it is. PostgreSQL's driver
        gives datetimes and parsed JSON already; SQLite gives text: datetimes go through the
        parser SQLAlchemy uses. JSON goes through :func:`_finite_json` on either."""
        if isinstance(column.type, JSON):
            return _finite_json
        if self.postgres:
            return None
        if isinstance(column.type, DateTime):
            processor = column.type.dialect_impl(self.dialect).result_processor(self.dialect, None)
            return processor
        return None


def _finite_json(value: Any) -> Any:
    """A JSON column's value as the ORM reads it (SQLite stores the text), refused
    (``ValueError``: the row is then compared exactly) when it holds a NaN or an infinite float
    anywhere, which orjson would digest as null. What orjson reads has none: it refuses NaN and
    Infinity and numbers beyond a double; anything else is checked."""
    if isinstance(value, str):
        fast = _fast_read(value)
        if fast is not _NOT_READ and _READS_FINITE:
            return fast
        value = json.loads(value) if fast is _NOT_READ else fast
    if value is not None and _non_finite(value):
        raise ValueError("a non-finite float, which the audit log cannot hold")
    return value


def _table(table: str) -> Table:
    return Base.metadata.tables[table]


def _head(session: Session) -> tuple[int, str] | None:
    head = session.execute(
        select(AuditHead.last_id, AuditHead.last_hash).where(AuditHead.id == 1)
    ).one_or_none()
    return None if head is None else (head.last_id, head.last_hash)


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


def _revision_key(revision: str | None) -> int:
    """For comparing revisions: None (no schema) first, one that is not radcaliper's last."""
    if revision is None:
        return -1
    try:
        return revision_number(revision)
    except ValueError:
        return 1 << 62


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


# --- the last logged state of each row -----------------------------------------------------------

_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # ids, events, digests, shapes


class _LoggedRows:
    """One table's last logged states in numpy arrays sorted by row id: the row id, the event
    that recorded the state, its digest and its field-set number. New entries wait in plain
    arrays until :meth:`compact` sorts them in (a later entry replaces an earlier one)."""

    def __init__(self) -> None:
        self.ids = np.empty(0, np.int64)
        self.events = np.empty(0, np.int64)
        self.digests = np.empty(0, np.int64)
        self.shapes = np.empty(0, np.uint32)
        self._clear()

    def _clear(self) -> None:
        self.new_ids, self.new_events, self.new_shapes = array("q"), array("q"), array("I")
        self.new_digests = array("q")

    def compact(self) -> None:
        if not self.new_ids:
            return
        ids = np.frombuffer(self.new_ids, np.int64)
        order = np.argsort(ids, kind="stable")  # equal ids stay in event order: keep the last
        ids = ids[order]
        last = np.ones(len(ids), bool)
        np.not_equal(ids[1:], ids[:-1], out=last[:-1])
        keep = order[last]
        self.merge(
            (
                ids[last],
                np.frombuffer(self.new_events, np.int64)[keep],
                np.frombuffer(self.new_digests, np.int64)[keep],
                np.frombuffer(self.new_shapes, np.uint32)[keep],
            )
        )
        self._clear()

    def merge(self, later: _Arrays) -> None:
        """Entries of later events (sorted by id, one per id) into the arrays: in place where
        the row is known, appended where the ids are past the last one, else by a full sort."""
        if not len(later[0]):
            return
        if len(self.ids) and later[0][0] <= self.ids[-1]:  # some may be known rows
            positions, known = _lookup(self.ids, later[0])
            for mine, theirs in zip(self._arrays()[1:], later[1:], strict=True):
                mine[positions[known]] = theirs[known]
            if known.all():
                return
            later = _subset(later, ~known)
        if len(self.ids) and later[0][0] < self.ids[-1]:
            joined = _joined(self._arrays(), later)
            self._set(_subset(joined, np.argsort(joined[0], kind="stable")))
            return
        # one array at a time: only one old array and its copy are in memory together
        self.ids = np.concatenate((self.ids, later[0]))
        self.events = np.concatenate((self.events, later[1]))
        self.digests = np.concatenate((self.digests, later[2]))
        self.shapes = np.concatenate((self.shapes, later[3]))

    def _arrays(self) -> _Arrays:
        return self.ids, self.events, self.digests, self.shapes

    def _set(self, arrays: _Arrays) -> None:
        self.ids, self.events, self.digests, self.shapes = arrays


def _subset(arrays: _Arrays, index: np.ndarray) -> _Arrays:
    ids, events, digests, shapes = arrays
    return ids[index], events[index], digests[index], shapes[index]


def _joined(first: _Arrays, second: _Arrays) -> _Arrays:
    ids, events, digests, shapes = (
        np.concatenate(pair) for pair in zip(first, second, strict=True)
    )
    return ids, events, digests, shapes


class _Logged:
    """The last state the log recorded for every covered row, and the field sets of states."""

    def __init__(self, key: bytes) -> None:
        self.state_digest = _StateDigest(key)
        self.tables = {table: _LoggedRows() for table in COVERED_TABLES}
        self.fields: list[tuple[str, ...]] = []  # field-set number -> field names
        self._numbers: dict[tuple[str, ...], int] = {}

    def number(self, names: tuple[str, ...]) -> int:
        found = self._numbers.get(names)
        if found is None:
            found = self._numbers[names] = len(self.fields)
            self.fields.append(names)
        return found

    def record(
        self,
        action: str,
        object_type: str,
        object_id: int | None,
        details: Mapping[str, Any],
        event_id: int,
    ) -> None:
        for table, row_id, state in logged_states(object_type, object_id, details, action=action):
            rows = self.tables[table]
            rows.new_ids.append(row_id)
            rows.new_events.append(event_id)
            rows.new_shapes.append(self.number(tuple(state)))
            rows.new_digests.append(self.state_digest(state))
            if len(rows.new_ids) >= _PENDING:
                rows.compact()

    def compact(self) -> None:
        for rows in self.tables.values():
            rows.compact()

    def absorb(self, later: _LoggedParts) -> None:
        """The entries of later events, gathered by another process."""
        numbers = np.array([self.number(names) for names in later.fields] or [0], np.uint32)
        with np.load(later.path) as saved:
            for table, rows in self.tables.items():
                if f"{table}.ids" in saved.files:
                    shapes = numbers[saved[f"{table}.shapes"]]
                    arrays = (saved[f"{table}.{name}"] for name in ("ids", "events", "digests"))
                    rows.merge((*arrays, shapes))

    def save(self, path: str) -> _LoggedParts:
        """The arrays into an ``.npz`` file, for another process."""
        self.compact()
        arrays = {
            f"{table}.{name}": getattr(rows, name)
            for table, rows in self.tables.items()
            if len(rows.ids)
            for name in ("ids", "events", "digests", "shapes")
        }
        np.savez(path, **arrays)
        return _LoggedParts(self.fields, path)


@dataclass(frozen=True)
class _LoggedParts:
    """:class:`_Logged`'s entries as another process hands them over: its field sets, and its
    arrays in an ``.npz`` file."""

    fields: list[tuple[str, ...]]
    path: str


# --- the tables ----------------------------------------------------------------------------------


class _TableDigests:
    """Digests of one table's rows as :meth:`_Logged.record` digests logged states: the
    :mod:`db.coverage` state of each plain row, limited to the fields its logged state has."""

    def __init__(self, source: _Source, table: str, logged: _Logged) -> None:
        columns: list[Column[Any]] = list(_table(table).columns)
        self.sql = f"SELECT {source.select_list(table)} FROM {source.quote(table)}"
        self.row_type = _make_row_type(f"_{table.title()}Row", [c.name for c in columns])
        self.converters = [
            (i, convert) for i, c in enumerate(columns) if (convert := source.converter(c))
        ]
        self.state = COVERED_TABLES[table]
        self.logged = logged
        self._whole: dict[int, bool] = {}  # field-set number -> all of the state's fields?

    def digests(self, rows: Sequence[DbRow], shapes: Sequence[int]) -> tuple[np.ndarray, list[int]]:
        """The rows' digests, and the positions of rows whose state could not even be made."""
        out = array("q")
        failed = []
        state_of, make, fields = self.state, self.row_type._make, self.logged.fields
        digest = self.logged.state_digest
        for i, (row, shape) in enumerate(zip(rows, shapes, strict=True)):
            try:
                full = state_of(make(self._converted(row)), _fast_digest)
                if not _finite_floats(full):
                    raise ValueError("a non-finite float, which the audit log cannot hold")
                whole = self._whole.get(shape)
                if whole is None:
                    whole = self._whole[shape] = fields[shape] == tuple(full)
                out.append(digest(full if whole else {n: full.get(n) for n in fields[shape]}))
            except _ROW_ERRORS:
                out.append(0)
                failed.append(i)
        return np.frombuffer(out, np.int64), failed

    def _converted(self, row: DbRow) -> Sequence[Any]:
        """``row`` with its stored text turned into what the ORM reads (SQLite)."""
        if all(row[i] is None for i, _ in self.converters):
            return row
        values = list(row)
        for i, convert in self.converters:
            if values[i] is not None:
                values[i] = convert(values[i])
        return values


@dataclass(frozen=True)
class _TableOutcome:
    """A table's (or id range's) first row that differs or was added, and its first deleted."""

    changed: _Problem | None = None
    deleted: _Problem | None = None


def _compare_table(
    source: _Source, table: str, logged: _Logged, low: int | None = None, high: int | None = None
) -> _TableOutcome:
    """The rows of ``table`` with ids in [low, high), in id order, against the log: the first
    that differs or is not in it (the scan stops there); else the first logged one missing."""
    rows = logged.tables[table]
    start = 0 if low is None else int(np.searchsorted(rows.ids, low))
    stop = len(rows.ids) if high is None else int(np.searchsorted(rows.ids, high))
    seen = np.zeros(stop - start, bool)
    reader = _TableDigests(source, table, logged)
    q = source.quote
    bounds = [f"{q('id')} >= {low:d}"] if low is not None else []
    bounds += [f"{q('id')} < {high:d}"] if high is not None else []
    where = f" WHERE {' AND '.join(bounds)}" if bounds else ""
    with source.batches(f"{reader.sql}{where} ORDER BY 1") as batches:
        for batch in batches:
            ids = np.fromiter((row[0] for row in batch), np.int64, len(batch))
            positions, found = _lookup(rows.ids, ids)
            added = np.flatnonzero(~found)
            end = int(added[0]) if added.size else len(batch)
            problem = _differing(source, table, reader, rows, batch[:end], positions[:end])
            if problem is not None:
                return _TableOutcome(changed=problem)
            seen[positions[:end] - start] = True
            if added.size:
                row_id = int(ids[end])
                message = f"table {table}, row {row_id}: not in the audit log: it was added "
                return _TableOutcome(changed=(message + "outside radcaliper", table, row_id, None))
    return _TableOutcome(deleted=_deleted(table, rows, seen, start))


def _compare_recorded(source: _Source, table: str, logged: _Logged) -> _TableOutcome:
    """Like :func:`_compare_table` for the rows the checked events recorded (``WHERE id IN``):
    the first that differs, else the first that is not in the table."""
    rows = logged.tables[table]
    seen = np.zeros(len(rows.ids), bool)
    reader = _TableDigests(source, table, logged)
    for start in range(0, len(rows.ids), _IN_LIST):
        wanted = rows.ids[start : start + _IN_LIST].tolist()
        where = f"{source.quote('id')} IN ({source.marks(len(wanted))})"
        with source.batches(f"{reader.sql} WHERE {where} ORDER BY 1", wanted) as batches:
            for batch in batches:
                ids = np.fromiter((row[0] for row in batch), np.int64, len(batch))
                positions, _ = _lookup(rows.ids, ids)
                problem = _differing(source, table, reader, rows, batch, positions)
                if problem is not None:
                    return _TableOutcome(changed=problem)
                seen[positions] = True
    return _TableOutcome(deleted=_deleted(table, rows, seen, 0))


def _lookup(sorted_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``ids`` is in ``sorted_ids`` (clipped), and whether it is there."""
    if not len(sorted_ids):
        return np.zeros(len(ids), np.intp), np.zeros(len(ids), bool)
    positions = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return positions, sorted_ids[positions] == ids


def _differing(
    source: _Source,
    table: str,
    reader: _TableDigests,
    rows: _LoggedRows,
    batch: Sequence[DbRow],
    positions: np.ndarray,
) -> _Problem | None:
    """The first of ``batch`` (logged rows, at ``positions``) that differs from its logged
    state. A row whose digest differs is compared field by field as the ORM reads it."""
    digests, failed = reader.digests(batch, rows.shapes[positions].tolist())
    suspects = set(np.flatnonzero(digests != rows.digests[positions]).tolist()) | set(failed)
    for i in sorted(suspects):
        position = int(positions[i])
        problem = _first_difference(
            source, table, int(rows.ids[position]), int(rows.events[position])
        )
        if problem is not None:
            return problem
    return None


def _deleted(table: str, rows: _LoggedRows, seen: np.ndarray, start: int) -> _Problem | None:
    missing = np.flatnonzero(~seen)
    if not missing.size:
        return None
    position = start + int(missing[0])
    row_id, event_id = int(rows.ids[position]), int(rows.events[position])
    return (
        f"table {table}, row {row_id}: in the audit log (event {event_id}) "
        "but not in the table: it was deleted",
        table,
        row_id,
        None,
    )


def _first_difference(source: _Source, table: str, row_id: int, event_id: int) -> _Problem | None:
    """Field by field, a row against the event that last recorded it, both read with their
    column types (a column the table lacks reads as None). Equal values of another JSON
    spelling (``1`` and ``1.0``) are no difference."""
    session, model, present = source.session, _table(table), source.present(table)
    columns = [
        model.c[c.name] if c.name in present else literal(None).label(c.name) for c in model.columns
    ]
    try:
        row = session.execute(select(*columns).where(model.c.id == row_id)).one_or_none()
        actual = {} if row is None else COVERED_TABLES[table](row)
    except _ROW_ERRORS as error:
        return (
            f"table {table}, row {row_id}: its stored values cannot be read ({error}): the row "
            "was changed outside radcaliper",
            table,
            row_id,
            None,
        )
    events = _table("audit_events")
    event = session.execute(select(events).where(events.c.id == event_id)).one_or_none()
    recorded = {} if event is None else _recorded(event, table, row_id)
    for name in recorded:
        if actual.get(name) != recorded.get(name):
            lacks = "" if name in present or name not in model.c else " (the column is missing)"
            return (
                f"table {table}, row {row_id}, field {name}: {actual.get(name)!r} in the "
                f"table{lacks} but {recorded.get(name)!r} in the audit log (event "
                f"{event_id}): the row was changed outside radcaliper",
                table,
                row_id,
                name,
            )
    return None


def _recorded(event: Any, table: str, row_id: int) -> dict[str, Any]:
    for logged_table, logged_id, state in logged_states(
        event.object_type, event.object_id, event.details, action=event.action
    ):
        if (logged_table, logged_id) == (table, row_id):
            return dict(state)
    return {}


def _compare_tables(
    source: _Source,
    logged: _Logged,
    whole: frozenset[str],
    *,
    low: Mapping[str, int] | None = None,
    high: Mapping[str, int] | None = None,
) -> list[_TableOutcome]:
    """Table by table, up to the first with a problem: :func:`_compare_table` for the tables
    the log covers ``whole`` at the database's schema (ids from ``low``, below ``high``),
    :func:`_compare_recorded` for the others' rows that events recorded (in the process that
    compares the lower ids)."""
    outcomes = []
    for table in COVERED_TABLES:
        if table in whole:
            bounds = (low or {}).get(table), (high or {}).get(table)
            outcome = _compare_table(source, table, logged, *bounds)
        elif low is None and len(logged.tables[table].ids):
            outcome = _compare_recorded(source, table, logged)
        else:
            outcome = _TableOutcome()
        outcomes.append(outcome)
        if outcome != _TableOutcome():
            break
    return outcomes


def _covered_whole(revision: str | None) -> frozenset[str]:
    """The tables whose every row the log records at schema ``revision`` (an unknown revision:
    all, as at the head)."""
    key = _revision_key(revision)
    if revision is None or key == 1 << 62:
        return frozenset(COVERED_TABLES)
    return frozenset(t for t in COVERED_TABLES if revision_number(COVERED_SINCE[t]) <= key)


def _first_problem(outcomes: Iterable[tuple[_TableOutcome, ...]]) -> _Problem | None:
    """Table by table, id range by id range (in id order): the first row that differs or was
    added; else the first deleted."""
    for parts in outcomes:
        for outcome in parts:
            if outcome.changed is not None:
                return outcome.changed
        for outcome in parts:
            if outcome.deleted is not None:
                return outcome.deleted
    return None


# --- a second process ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shared:
    """What a second process needs to read the snapshot this one reads: the URL, PostgreSQL's
    exported snapshot, or (SQLite) the head this snapshot has, to compare with its own."""

    url: str
    snapshot: str | None
    head: tuple[int, str] | None


def _share(session: Session) -> _Shared | None:
    """None where a second process cannot share this session's snapshot."""
    bind = session.get_bind()
    url = bind.engine.url.render_as_string(hide_password=False)
    if bind.dialect.name != "postgresql":
        return None if in_memory(bind.engine.url) else _Shared(url, None, _head(session))
    level = session.connection().get_isolation_level()
    if level not in ("REPEATABLE READ", "SERIALIZABLE"):
        return None
    snapshot = session.execute(text("SELECT pg_export_snapshot()")).scalar_one()
    return _Shared(url, str(snapshot), None)


@contextlib.contextmanager
def _shared_source(shared: _Shared) -> Iterator[_Source | None]:
    """In the second process: a connection on the shared snapshot (None: the SQLite database
    has moved on since the first process's snapshot)."""
    from db.engine import connect

    engine = connect(shared.url)
    try:
        with Session(engine) as session:
            if shared.snapshot is not None and _SNAPSHOT_ID.fullmatch(shared.snapshot):
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                session.execute(text(f"SET TRANSACTION SNAPSHOT '{shared.snapshot}'"))
            elif _head(session) != shared.head:
                yield None
                return
            yield _Source(session)
    finally:
        engine.dispose()


class _Forked(Generic[_T]):
    """``work()`` in a forked process; :meth:`result` is its return value, or None when it
    failed (the caller then does the work itself). The child leaves the connections of the
    parent's ``engine`` to the parent (SQLAlchemy's rule for a forked process) and opens its
    own."""

    def __init__(self, work: Callable[[], _T | None], engine: Engine) -> None:
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_send_result, args=(work, sender, engine), daemon=True
        )
        self._process.start()
        sender.close()

    def result(self) -> _T | None:
        try:
            value: _T | None = self._receiver.recv()
        except (EOFError, OSError):
            value = None
        self._receiver.close()
        self._process.join()
        return value

    def cancel(self) -> None:
        """Stop the process if it still runs (safe after :meth:`result`)."""
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._receiver.close()


def _send_result(work: Callable[[], Any], sender: Connection, engine: Engine) -> None:
    engine.dispose(close=False)  # the parent's pooled connections are not this process's
    try:
        value = work()
    except Exception:  # the first process does the work itself
        logger.warning("audit verify: the second process failed", exc_info=True)
        value = None
    sender.send(value)
    sender.close()


def _can_fork() -> bool:
    """Linux only: elsewhere (macOS) forking a process that loaded system libraries is unsafe."""
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


@dataclass
class _UpperEvents:
    """What the second process found in the events after the split."""

    chain: _Chain
    problem: str | None
    parts: _LoggedParts


def _upper_events(shared: _Shared, key: bytes, split: int, path: str) -> _UpperEvents | None:
    with _shared_source(shared) as source:
        if source is None:
            return None
        logged = _Logged(key)
        chain = _Chain(split, "", first=(0, ""))
        problem = _walk(source, chain, logged)
        return _UpperEvents(chain, problem, logged.save(path))


def _join(lower: _Chain, upper: _UpperEvents) -> str | None:
    """Continue the chain with the second process's part: the linkage at the split, then its
    own first problem (counts and the last event carried over)."""
    if upper.chain.first is None:  # no event after the split
        return upper.problem
    first_id, first_prev = upper.chain.first
    lower.count += 1
    if first_id != lower.last_id + 1:
        return _ids_jump(lower.last_id, first_id)
    if first_prev != lower.last_hash:
        return _does_not_follow(first_id, lower.last_id)
    lower.count += upper.chain.count - 1
    if upper.problem is None or upper.chain.last_id >= first_id:
        lower.last_id, lower.last_hash = upper.chain.last_id, upper.chain.last_hash
    lower.follow(upper.chain)
    return upper.problem


def _upper_tables(
    shared: _Shared, logged: _Logged, whole: frozenset[str], splits: Mapping[str, int]
) -> list[_TableOutcome] | None:
    with _shared_source(shared) as source:
        return None if source is None else _compare_tables(source, logged, whole, low=splits)


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


def _bad(
    count: int,
    head: str,
    problem: str,
    table: str | None = None,
    row_id: int | None = None,
    field: str | None = None,
) -> VerifyReport:
    return VerifyReport(False, count, head, problem, table, row_id, field)
