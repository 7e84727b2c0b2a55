"""Schema migrations (Alembic): ``upgrade``, ``downgrade``, ``current`` and the head revision.

The migration scripts live in ``db/migrations`` (package data); they are driven from Python with
the database URL given, so ``radcaliper db upgrade`` needs no ``alembic.ini``.

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
    "alembic_config",
    "current",
    "downgrade",
    "head_revision",
    "stored_revision",
    "upgrade",
]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

# The newest revision under db/migrations/versions: what :func:`head_revision` reads from the
# scripts (tests/db/test_migrations.py checks that they agree). A new migration moves it.
SCHEMA_HEAD = "0003"

_VERSION_TABLE = "alembic_version"


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
    signs off the audit baseline a migration records."""
    from alembic import command

    command.upgrade(alembic_config(url, actor=actor), revision)


def downgrade(url: str, revision: str) -> None:
    """Take the database at ``url`` down to ``revision`` (``base``: no tables)."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def stored_revision(connection: Connection) -> str | None:
    """The revision stored in the database (Alembic's version table), None without one: what
    Alembic's ``MigrationContext.get_current_revision`` answers, in one query without importing
    Alembic. A table with several revisions (branches, which radcaliper's linear history never
    makes) is left to Alembic, which refuses it."""
    from sqlalchemy import inspect, text

    if not inspect(connection).has_table(_VERSION_TABLE):
        return None
    rows = connection.execute(text(f"SELECT version_num FROM {_VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        from alembic.runtime.migration import MigrationContext

        return MigrationContext.configure(connection).get_current_revision()
    return rows[0] if rows else None


def current(url: str) -> str | None:
    """The database's revision, or None when it has no radcaliper schema."""
    from alembic.runtime.migration import MigrationContext

    from db.engine import connect

    engine = connect(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
