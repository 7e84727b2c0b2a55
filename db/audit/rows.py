"""The rows, for :mod:`db.audit.verification`: the last state the log recorded for each covered row
(:class:`_Logged`, numpy arrays sorted by row id) and each table streamed in id order and compared
with it (:func:`_compare_tables`), a differing row field by field.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Column, literal, select

from db.audit.coverage import (
    COVERED_SINCE,
    COVERED_TABLES,
    logged_states,
    revision_number,
)
from db.audit.reading import (
    _ROW_ERRORS,
    DbRow,
    _fast_digest,
    _finite_floats,
    _make_row_type,
    _Problem,
    _Source,
    _StateDigest,
    _table,
)

__all__: list[str] = []  # internals of db.audit.verification

_PENDING = 1 << 15  # logged entries gathered before they are sorted into a table's arrays
_IN_LIST = 500  # row ids per "WHERE id IN (...)" of a since-head check


def _revision_key(revision: str | None) -> int:
    """For comparing revisions: None (no schema) first, one that is not radcaliper's last."""
    if revision is None:
        return -1
    try:
        return revision_number(revision)
    except ValueError:
        return 1 << 62


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
    :mod:`db.audit.coverage` state of each plain row, limited to the fields its logged state has."""

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
