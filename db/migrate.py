"""Schema migrations (Alembic): ``upgrade``, ``downgrade``, the head revision and the revision a
database stores (``db.engine.current`` opens a database and reads it).

The migration scripts live in ``db/migrations`` (package data); they are driven from Python with
the database URL given, so ``radcaliper db upgrade`` needs no ``alembic.ini``.

**A migration never launders.** Before it migrates a database that has a schema, the
migration environment (``db/migrations/env.py``) checks in the migration's own transaction
that the audit log vouches for what the database holds
(:func:`db.migration_ops.check_before_migrating`: the
chain, every row the log covers at the database's schema, the log's guards, and that the
schema the log says the database is at is the one its version table says), and refuses with
:class:`MigrationRefusedError` naming the first difference when it does not: otherwise a
migration that records existing rows as a baseline (0003) would turn rows changed outside
radcaliper into trusted ones. After migrating it records a ``schema.upgraded`` or
``schema.downgraded`` event (from, to), signed off by the actor
(:func:`db.migration_ops.record_schema_change`).

This module imports no other radcaliper module: :mod:`db.engine` (which opens a store and
checks its schema against :data:`SCHEMA_HEAD`) builds on it.

Alembic is imported by the functions that migrate, not by this module: opening a store checks
the schema against :data:`SCHEMA_HEAD` and reads the stored revision with one query
(:func:`stored_revision`), so the commands that only read (``radcaliper audit ...``) do not pay
for importing Alembic.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy import Connection

__all__ = [
    "SCHEMA_HEAD",
    "VERSION_TABLE",
    "alembic_config",
    "downgrade",
    "head_revision",
    "stored_revision",
    "upgrade",
]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

# The newest revision under db/migrations/versions: what :func:`head_revision` reads from the
# scripts (tests/db/test_migrations.py checks that they agree). A new migration moves it.
SCHEMA_HEAD = "0004"

VERSION_TABLE = "alembic_version"


def alembic_config(url: str, *, actor: str | None = None) -> Config:
    """An Alembic configuration for ``url`` (no ini file); ``actor`` signs off what a migration
    records in the audit log (default ``migration``)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["url"] = url  # read by migrations/env.py (not interpolated like options)
    config.attributes["actor"] = actor or "migration"
    return config


def head_revision() -> str:
    """The head revision of the migration scripts, as Alembic reads them."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:  # pragma: no cover - the package ships its migrations
        raise RuntimeError(f"no migrations under {MIGRATIONS}")
    return head


def upgrade(url: str, revision: str = "head", *, actor: str | None = None) -> None:
    """Bring the database at ``url`` up to ``revision``; ``actor`` (e.g. ``cli:<OS user>``)
    signs off the schema event and the audit baseline a migration records.

    Raises:
        MigrationRefusedError: the audit log does not vouch for the database (nothing is
            migrated; the message names the first difference).
    """
    from alembic import command

    command.upgrade(alembic_config(url, actor=actor), revision)


def downgrade(url: str, revision: str, *, actor: str | None = None) -> None:
    """Take the database at ``url`` down to ``revision`` (``base``: no tables); ``actor``
    signs off the schema event (and what a migration's downgrade records)."""
    from alembic import command

    command.downgrade(alembic_config(url, actor=actor), revision)


def stored_revision(connection: Connection) -> str | None:
    """The revision stored in the database (Alembic's version table), None without one: what
    Alembic's ``MigrationContext.get_current_revision`` answers, in one query without importing
    Alembic. A table with several revisions (branches, which radcaliper's linear history never
    makes) is left to Alembic, which refuses it."""
    from sqlalchemy import inspect, text

    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        from alembic.runtime.migration import MigrationContext

        return MigrationContext.configure(connection).get_current_revision()
    return rows[0] if rows else None
