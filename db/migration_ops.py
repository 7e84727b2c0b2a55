"""What runs inside a migration: the guard and record of the migration environment
(``db/migrations/env.py``) and what several migration scripts (``db/migrations/versions``) do
alike.

- :func:`check_before_migrating`: refuse to migrate a database the audit log does not vouch for
  (the full verify at the database's schema).
- :func:`record_schema_change`: the ``schema.upgraded`` / ``schema.downgraded`` event.
- :func:`drop_column`: ``ALTER TABLE ... DROP COLUMN`` where SQLite has it (3.35 and later):
  Alembic's batch mode copies the table and drops the old one, which the foreign keys of other
  tables' rows refuse once it holds data; older SQLite gets the batch mode.
- :func:`record_dropped`: before a downgrade drops a covered column, the rows whose value in it
  goes are recorded in the audit log as they will be (the column's value reset), so that the
  log still says what the rows hold, and the next migration's check finds them as logged.

Alembic is imported by the functions (a migration runs them), not by this module.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from db.audit.log import append_event_core

if TYPE_CHECKING:
    from sqlalchemy import Connection

__all__ = ["check_before_migrating", "drop_column", "record_dropped", "record_schema_change"]

ROWS_PER_EVENT = 2000


def check_before_migrating(connection: Connection, revision: str | None) -> None:
    """Refuse (:class:`MigrationRefusedError`) to migrate the database of ``connection`` (at
    schema ``revision``, in the migration's transaction) unless its audit log vouches for it:
    the full :func:`db.audit.verify` at that schema. A database without a version but with
    radcaliper's tables (its version was removed) is refused too; one without any is new."""
    from sqlalchemy import inspect
    from sqlalchemy.orm import Session

    from db.audit.verification import run
    from db.migrate import VERSION_TABLE
    from ingestion.errors import MigrationRefusedError

    if revision is None:
        if inspect(connection).has_table("audit_events"):
            raise MigrationRefusedError(
                "refused to migrate: the database has radcaliper's tables but no schema "
                f"version (the {VERSION_TABLE} table is missing or empty): it was removed "
                "outside radcaliper. Restore the database from a backup"
            )
        return
    with Session(bind=connection) as session:
        report = run(session, None, None, 1)
    if not report.ok:
        raise MigrationRefusedError(
            f"refused to migrate from schema {revision}: the audit log does not vouch for the "
            f"database: {report.problem}. Migrating would record what the database holds "
            "as trusted: find out what changed ('radcaliper audit verify', 'radcaliper audit "
            "log') and restore the database from a backup taken before it"
        )


def record_schema_change(
    connection: Connection, before: str | None, after: str | None, *, actor: str
) -> None:
    """Record in the audit log that the schema went from ``before`` to ``after`` (nothing when
    it did not change, or when no audit log is left: a downgrade to base)."""
    from sqlalchemy import inspect

    from db.audit.coverage import SCHEMA_DOWNGRADED, SCHEMA_UPGRADED, revision_number

    if before == after or not inspect(connection).has_table("audit_events"):
        return
    up = before is None or (after is not None and revision_number(after) > revision_number(before))
    append_event_core(
        connection,
        actor=actor[:64],
        action=SCHEMA_UPGRADED if up else SCHEMA_DOWNGRADED,
        object_type="schema",
        object_id=None,
        details={"from": before, "to": after},
    )


def drop_column(table: str, column: str) -> None:
    """Drop ``table.column`` in the running migration."""
    import sqlite3

    from alembic import op

    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column)
        return
    op.drop_column(table, column)


def record_dropped(
    table: str, column: str, *, where: sa.ColumnElement[bool] | None, reset: Any, revision: str,
    statement: str,
) -> int:  # fmt: skip
    """Record, in the running migration, the state of every row of ``table`` that ``where``
    selects (a condition on the reflected table's ``column``; None: those not NULL) with
    ``column`` set to ``reset``, as ``schema.data_dropped`` events; how many rows."""
    from alembic import context, op

    from db.audit.coverage import row_state

    bind = op.get_bind()
    metadata = sa.MetaData()
    metadata.reflect(bind, only=(table,))
    reflected = metadata.tables[table]
    chosen = reflected.c[column].is_not(None) if where is None else where
    rows = bind.execute(sa.select(reflected).where(chosen).order_by(reflected.c.id))
    states = {
        str(row.id): row_state(table, SimpleNamespace(**{**dict(row._mapping), column: reset}))
        for row in rows
    }
    actor = str(context.config.attributes.get("actor") or f"migration:{revision}")[:64]
    items = list(states.items())
    for start in range(0, len(items), ROWS_PER_EVENT):
        append_event_core(
            bind,
            actor=actor,
            action="schema.data_dropped",
            object_type="table",
            object_id=None,
            details={
                "revision": revision,
                "statement": statement,
                "rows": {table: dict(items[start : start + ROWS_PER_EVENT])},
            },
        )
    return len(states)
