"""Alembic environment: runs migrations on the URL that ``db.migrate`` passes in.

In one transaction: the check that the audit log vouches for the database
(:func:`db.migration_ops.check_before_migrating`, unless there is nothing to migrate), the
migrations, and the schema event that records them
(:func:`db.migration_ops.record_schema_change`).
"""

from __future__ import annotations

from alembic import context

from db.engine import connect
from db.migrate import stored_revision
from db.migration_ops import check_before_migrating, record_schema_change
from db.models import Base

config = context.config
url = config.attributes["url"]
actor = str(config.attributes.get("actor") or "migration")


def _target() -> str | object | None:
    """The revision asked for (None: base); a relative one is not resolved (always checked)."""
    argument = context.get_revision_argument()
    if argument in ("head", "heads"):
        return context.script.get_current_head()
    if argument == "base":
        return None
    return argument if isinstance(argument, str) else object()


engine = connect(url)
try:
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            transactional_ddl=True,  # SQLite too: the check, migrations and event at once
        )
        with context.begin_transaction():
            before = stored_revision(connection)
            if _target() != before:
                check_before_migrating(connection, before)
            context.run_migrations()
            record_schema_change(connection, before, stored_revision(connection), actor=actor)
finally:
    engine.dispose()
