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
    from db.migration_ops import drop_column

    drop_column("series", "geometry")
