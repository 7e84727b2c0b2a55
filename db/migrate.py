"""Schema migrations (Alembic): ``upgrade``, ``downgrade``, ``current`` and the head revision.

The migration scripts live in ``db/migrations`` (package data); they are driven from Python with
the database URL given, so ``radcaliper db upgrade`` needs no ``alembic.ini``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

__all__ = ["alembic_config", "current", "downgrade", "head_revision", "upgrade"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str, *, actor: str | None = None) -> Config:
    """An Alembic configuration for ``url`` (no ini file); ``actor`` signs off what a migration
    records in the audit log (default ``migration``)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["url"] = url  # read by migrations/env.py (not interpolated like options)
    config.attributes["actor"] = actor or "migration"
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:  # pragma: no cover - the package ships its migrations
        raise RuntimeError(f"no migrations under {MIGRATIONS}")
    return head


def upgrade(url: str, revision: str = "head", *, actor: str | None = None) -> None:
    """Bring the database at ``url`` up to ``revision``; ``actor`` (e.g. ``cli:<OS user>``)
    signs off the audit baseline a migration records."""
    command.upgrade(alembic_config(url, actor=actor), revision)


def downgrade(url: str, revision: str) -> None:
    """Take the database at ``url`` down to ``revision`` (``base``: no tables)."""
    command.downgrade(alembic_config(url), revision)


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
