"""What several migrations do alike, shared by their scripts (``db/migrations/versions``).

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
from typing import Any

import sqlalchemy as sa

__all__ = ["drop_column", "record_dropped"]

ROWS_PER_EVENT = 2000


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

    from db.audit import append_event_core
    from db.coverage import row_state

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
