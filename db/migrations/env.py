"""Alembic environment: runs migrations on the URL that ``db.migrate`` passes in."""

from __future__ import annotations

from alembic import context

from db.engine import connect
from db.models import Base

config = context.config
url = config.attributes["url"]
engine = connect(url)
try:
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
finally:
    engine.dispose()
