"""User administration: forced password changes and the login back-off's failures.

- ``users.must_change_password``: an administrator set the password (``users passwd``, the
  admin page); the user must choose a new one at the next login. False for every existing user.
  The audit log records it with the user's state from this revision on; older events, which do
  not name it, are compared on the fields they name.
- ``login_failures``: one row per failed login (the name tried, the client address, when), from
  which ``db.logins`` computes the exponential back-off per name and address; ``users unlock``
  deletes them. Operational state, not covered by the audit log (locks and unlocks are events).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(
            sa.Column(
                "must_change_password", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
    op.create_table(
        "login_failures",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("address", sa.String(length=128), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_failures")),
    )
    op.create_index("ix_login_failures_user_name", "login_failures", ["user_name", "at"])
    op.create_index("ix_login_failures_address", "login_failures", ["address", "at"])


def downgrade() -> None:
    from db.migration_ops import drop_column, record_dropped

    flagged = sa.column("must_change_password", sa.Boolean()).is_(True)
    record_dropped(
        "users",
        "must_change_password",
        where=flagged,
        reset=False,
        revision=revision,
        statement="a downgrade below schema 0004 drops users.must_change_password: these "
        "users no longer have to change their password",
    )
    op.drop_index("ix_login_failures_address", table_name="login_failures")
    op.drop_index("ix_login_failures_user_name", table_name="login_failures")
    op.drop_table("login_failures")
    drop_column("users", "must_change_password")
