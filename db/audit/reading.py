"""How a verify reads (:mod:`db.audit.verification`): the events and rows as plain DB-API rows,
streamed ``_BATCH`` at a time (:class:`_Source`), JSON read and digested fast where that is exact,
and the keyed digest of a row's state (:class:`_StateDigest`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import itertools
import json
import math
import os
import re
import sys
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Table, inspect, select
from sqlalchemy.orm import Session

from db.audit.coverage import (
    canonical_json,
    digest,
)
from db.models import AuditHead, Base

__all__: list[str] = []  # internals of db.audit.verification

_BATCH = 1024  # rows fetched (and events hashed) at a time
_DIGEST_BYTES = 8
_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_ZEROS = b"0" * 19
_SNAPSHOT_ID = re.compile(r"[0-9A-Fa-f-]+")
_SHA256 = hashlib.sha256()  # copied: cheaper than a new one for each event
_ROW_ERRORS = (ValueError, TypeError, AttributeError, LookupError, OverflowError)

DbRow = tuple[Any, ...]
_Problem = tuple[str, str, int | None, str | None]  # message, table, row id, field


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
    """:func:`db.audit.coverage.digest` through orjson, of a text or a JSON column's value as
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
