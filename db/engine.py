"""Connecting to the store: engines for SQLite and PostgreSQL, sessions, the schema check.

- SQLite (the default: a file in the user data dir): WAL journal, foreign keys on, a 30 s busy
  timeout, and ``BEGIN IMMEDIATE`` for write transactions, so that concurrent writers queue for
  the database lock instead of failing half-way (readers are never blocked in WAL mode).
- PostgreSQL: ``postgresql://`` URLs use the psycopg (3) driver.
- ``current(url)`` reads a database's schema revision; ``open_store(url)`` checks that the
  schema is this radcaliper's (Alembic head) and raises
  ``SchemaVersionError`` with what to do (``radcaliper db upgrade``); with ``create_if_empty`` a
  database without any table (a new SQLite file, an empty PostgreSQL database) gets the schema,
  with one log line.
- A new SQLite file is created readable by its owner only (0600), in folders created 0700; a
  file of another user, one that others may write or one in a folder others may write is
  refused (``ConfigurationError``, ``db.private_paths``).

Nothing connects at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from db.audit.coverage import revision_number
from db.migrate import SCHEMA_HEAD, stored_revision, upgrade
from db.private_paths import check_private_path, make_private_dirs
from ingestion.errors import SchemaVersionError, StorageError

__all__ = [
    "Store",
    "connect",
    "current",
    "in_memory",
    "open_store",
    "redacted",
    "session_scope",
]

logger = logging.getLogger(__name__)

_WRITE = "radcaliper_write"
_COMPANIONS = ("-wal", "-shm", "-journal")  # SQLite's files beside a database


def in_memory(url: str | URL) -> bool:
    """Whether ``url`` is an SQLite database in its process's memory: no other process (a
    worker, a forked verify) can open it."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable URL>"


def _normalised(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def connect(url: str) -> Engine:
    """An engine for ``url`` (not yet connected). Raises ``StorageError`` for a bad URL,
    ``ConfigurationError`` for an SQLite file another user owns or may change."""
    url = _normalised(url)
    try:
        parsed = make_url(url)
    except ArgumentError as error:
        raise StorageError(
            f"{url!r} is not a database URL; use e.g. sqlite:///path/radcaliper.sqlite3 or "
            "postgresql://user@host/dbname"
        ) from error
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StorageError(f"database {backend!r} is not supported; use SQLite or PostgreSQL")
    if backend == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            _owner_only_file(Path(database).expanduser())
        engine = create_engine(parsed, connect_args={"timeout": 30, "check_same_thread": False})
        _sqlite_pragmas(engine)
    else:
        try:
            engine = create_engine(parsed, pool_pre_ping=True)
        except (ImportError, ArgumentError) as error:
            raise StorageError(f"cannot use {redacted(url)}: {error}") from error
    return engine


def _owner_only_file(path: Path) -> None:
    """Create an SQLite database file readable by its owner only (0600; SQLite gives its WAL
    and shared-memory files the same mode), and the folders leading to it (0700). An existing
    own file that others may read loses those permissions, with a warning. A file (or a
    journal beside it) of another user or that others may write, or one in a folder others may
    write, is refused (``db.private_paths``)."""
    check_private_path(path, "database file")
    for suffix in _COMPANIONS:  # a journal SQLite would read back into the database
        companion = path.with_name(path.name + suffix)
        if companion.exists() or companion.is_symlink():
            check_private_path(companion, "database file")
    make_private_dirs(path.parent)
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return
        check_private_path(path, "database file")  # made by someone else meanwhile
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o007:
        os.chmod(path, mode & ~0o007)
        logger.warning(
            "the database file %s was readable by other users (mode %o); they no longer have "
            "access (mode %o)",
            path,
            mode,
            mode & ~0o007,
        )


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA busy_timeout = 30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        write = connection.get_execution_options().get(_WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


@dataclass(frozen=True)
class Store:
    """An open, schema-checked database: ``reader()`` and ``writer()`` make sessions."""

    engine: Engine
    url: str

    @property
    def backend(self) -> str:
        return self.engine.url.get_backend_name()

    def reader(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def writer(self) -> Session:
        """A session whose transactions take the write lock at BEGIN on SQLite."""
        bind = self.engine.execution_options(**{_WRITE: True})
        return Session(bind, expire_on_commit=False)

    def dispose(self) -> None:
        self.engine.dispose()


@contextlib.contextmanager
def session_scope(session: Session) -> Iterator[Session]:
    """Commit on success, roll back on error, always close."""
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return stored_revision(connection)


def _earlier(revision: str, head: str) -> bool:
    try:
        return revision_number(revision) < revision_number(head)
    except ValueError:
        return False


def open_store(url: str, *, create_if_empty: bool = False, earlier_schema: bool = False) -> Store:
    """Connect and check the schema.

    Args:
        url: SQLAlchemy URL (``sqlite:///...`` or ``postgresql://...``).
        create_if_empty: upgrade a database that has no tables at all to the current schema
            (the default SQLite file on first use).
        earlier_schema: accept a database at an earlier radcaliper schema too (what ``audit
            verify`` reads: it compares rows as that schema's log covers them); nothing may
            be written to it.

    Raises:
        StorageError: the database cannot be reached (the message says which and why).
        SchemaVersionError: no radcaliper schema, or another version of it.
        ConfigurationError: an SQLite file that another user owns or may change.
    """
    engine = connect(url)
    try:
        current = _current_revision(engine)
        if current is None and create_if_empty and not inspect(engine).get_table_names():
            upgrade(url)
            current = _current_revision(engine)
            logger.warning(
                "%s was a new, empty database: created the radcaliper schema %s in it",
                redacted(url),
                current,
            )
    except OperationalError as error:
        engine.dispose()
        reason = str(error.orig).strip().splitlines()[0] if error.orig else str(error)
        raise StorageError(
            f"cannot reach the database {redacted(url)}: {reason}; check --db / "
            "RADCALIPER_DATABASE_URL and that the server is running"
        ) from error
    except SQLAlchemyError as error:
        engine.dispose()
        raise StorageError(f"database {redacted(url)}: {error}") from error
    head = SCHEMA_HEAD
    if earlier_schema and current is not None and _earlier(current, head):
        return Store(engine, url)
    if current != head:
        engine.dispose()
        found = "no radcaliper schema" if current is None else f"schema version {current}"
        raise SchemaVersionError(
            f"the database {redacted(url)} has {found}; this radcaliper needs {head}: run "
            f"'radcaliper db upgrade --db {redacted(url)}'"
        )
    return Store(engine, url)


def current(url: str) -> str | None:
    """The database's revision, or None when it has no radcaliper schema."""
    from alembic.runtime.migration import MigrationContext

    engine = connect(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
