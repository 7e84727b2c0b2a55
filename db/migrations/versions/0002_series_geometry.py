"""Series geometry: where every voxel of the measured series lies in LPS (origin, directions,
spacing), so that stored LPS points (a finding's axes) map back to image coordinates on the
measured slice (the DICOM SR export). NULL for series stored before this revision.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("series") as batch:
        batch.add_column(sa.Column("geometry", sa.JSON(), nullable=True))


def downgrade() -> None:
    _drop_column("series", "geometry")


def _drop_column(table: str, column: str) -> None:
    """``ALTER TABLE ... DROP COLUMN`` where SQLite has it (3.35 and later): Alembic's batch
    mode copies the table and drops the old one, which the foreign keys of other tables'
    rows refuse once it holds data."""
    import sqlite3

    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column)
        return
    op.drop_column(table, column)
