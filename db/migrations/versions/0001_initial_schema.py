"""Initial schema: users, studies, series, runs, findings, measurements, reviews, audit log.

The audit log is append-only: the head row is seeded with the genesis hash, and triggers refuse
UPDATE and DELETE of audit events on both SQLite and PostgreSQL (the hash chain still detects an
edit made by someone who drops them).

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

GENESIS = "0" * 64  # prev_hash of the first audit event (db.audit.GENESIS)

APPEND_ONLY = {
    "sqlite": [
        f"CREATE TRIGGER audit_events_no_{verb} BEFORE {verb.upper()} ON audit_events "
        f"BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END"
        for verb in ("update", "delete")
    ],
    "postgresql": [
        "CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'audit events are append-only'; END $$",
        "CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events "
        "FOR EACH ROW EXECUTE FUNCTION audit_events_append_only()",
    ],
}
DROP_APPEND_ONLY = {
    "sqlite": [f"DROP TRIGGER IF EXISTS audit_events_no_{v}" for v in ("update", "delete")],
    "postgresql": [
        "DROP TRIGGER IF EXISTS audit_events_append_only ON audit_events",
        "DROP FUNCTION IF EXISTS audit_events_append_only()",
    ],
}


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("object_type", sa.String(length=32), nullable=False),
        sa.Column("object_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
        sa.UniqueConstraint("hash", name=op.f("uq_audit_events_hash")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index("ix_audit_events_actor", ["actor"], unique=False)
        batch_op.create_index("ix_audit_events_at", ["at"], unique=False)
        batch_op.create_index("ix_audit_events_object", ["object_type", "object_id"], unique=False)

    op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("last_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("last_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_head")),
    )
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_instance_uid", sa.String(length=64), nullable=False),
        sa.Column("patient_id", sa.String(length=64), nullable=False),
        sa.Column("study_date", sa.String(length=8), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_studies")),
        sa.UniqueConstraint("study_instance_uid", name=op.f("uq_studies_study_instance_uid")),
    )
    with op.batch_alter_table("studies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_studies_patient_id"), ["patient_id"], unique=False)

    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column(
            "role", sa.Enum("reviewer", "auditor", "admin", name="role", length=16), nullable=False
        ),
        sa.Column("password_hash", sa.String(length=256), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    op.create_table(
        "series",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("series_instance_uid", sa.String(length=64), nullable=False),
        sa.Column("modality", sa.String(length=8), nullable=True),
        sa.Column("description", sa.String(length=256), nullable=False),
        sa.Column("source_format", sa.String(length=16), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("spacing_mm", sa.JSON(), nullable=False),
        sa.Column("sop_instance_uids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["studies.id"],
            name=op.f("fk_series_study_id_studies"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_series")),
        sa.UniqueConstraint("series_instance_uid", name=op.f("uq_series_series_instance_uid")),
    )
    with op.batch_alter_table("series", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_series_study_id"), ["study_id"], unique=False)

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(length=128), nullable=False),
        sa.Column("model_version", sa.String(length=64), nullable=False),
        sa.Column("numeric_mode", sa.String(length=32), nullable=False),
        sa.Column("checkpoint_hash", sa.String(length=64), nullable=False),
        sa.Column("not_for_clinical_use", sa.Boolean(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("input_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("running", "done", "failed", name="run_status", length=16),
            nullable=False,
        ),
        sa.Column("warnings", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name=op.f("fk_runs_series_id_series"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint(
            "series_id",
            "model_name",
            "model_version",
            "checkpoint_hash",
            "input_fingerprint",
            name="uq_runs_identity",
        ),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_model_version"), ["model_version"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_series_id"), ["series_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_started_at"), ["started_at"], unique=False)

    op.create_table(
        "findings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("center_x_mm", sa.Float(), nullable=False),
        sa.Column("center_y_mm", sa.Float(), nullable=False),
        sa.Column("center_z_mm", sa.Float(), nullable=False),
        sa.Column("slice_index", sa.Integer(), nullable=False),
        sa.Column("sop_instance_uid", sa.String(length=64), nullable=True),
        sa.Column("frame_number", sa.Integer(), nullable=True),
        sa.Column("axes_lps_mm", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_findings_run_id_runs"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_findings")),
        sa.UniqueConstraint("run_id", "number", name="uq_findings_run_number"),
    )
    op.create_table(
        "measurements",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("finding_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=16), nullable=False),
        sa.Column("value_mm", sa.Float(), nullable=True),
        sa.Column("range_low_mm", sa.Float(), nullable=True),
        sa.Column("range_high_mm", sa.Float(), nullable=True),
        sa.Column("coverage", sa.Float(), nullable=True),
        sa.Column("unit", sa.String(length=8), nullable=False),
        sa.Column("qualifier", sa.String(length=32), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("source", sa.Enum("model", "reviewer", name="source", length=16), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "pending", "accepted", "corrected", "rejected", name="review_status", length=16
            ),
            nullable=False,
        ),
        sa.Column("reviewed_value_mm", sa.Float(), nullable=True),
        sa.Column("reviewer_id", sa.Integer(), nullable=True),
        sa.Column("reviewed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["finding_id"],
            ["findings.id"],
            name=op.f("fk_measurements_finding_id_findings"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["reviewer_id"],
            ["users.id"],
            name=op.f("fk_measurements_reviewer_id_users"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurements")),
    )
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_measurements_finding_id"), ["finding_id"], unique=False
        )
        batch_op.create_index("ix_measurements_reviewer_id", ["reviewer_id"], unique=False)
        batch_op.create_index("ix_measurements_status", ["status"], unique=False)

    op.create_table(
        "reviews",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "measurement_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column(
            "action",
            sa.Enum("accept", "correct", "reject", name="review_action", length=16),
            nullable=False,
        ),
        sa.Column("value_mm", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("reviewer_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["measurement_id"],
            ["measurements.id"],
            name=op.f("fk_reviews_measurement_id_measurements"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["reviewer_id"],
            ["users.id"],
            name=op.f("fk_reviews_reviewer_id_users"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reviews")),
    )
    with op.batch_alter_table("reviews", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_reviews_measurement_id"), ["measurement_id"], unique=False
        )

    head = sa.table(
        "audit_head",
        sa.column("id", sa.Integer),
        sa.column("last_id", sa.Integer),
        sa.column("last_hash", sa.String),
    )
    op.bulk_insert(head, [{"id": 1, "last_id": 0, "last_hash": GENESIS}])
    for statement in APPEND_ONLY[op.get_bind().dialect.name]:
        op.execute(statement)


def downgrade() -> None:
    for statement in DROP_APPEND_ONLY[op.get_bind().dialect.name]:
        op.execute(statement)
    with op.batch_alter_table("reviews", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reviews_measurement_id"))

    op.drop_table("reviews")
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_index("ix_measurements_status")
        batch_op.drop_index("ix_measurements_reviewer_id")
        batch_op.drop_index(batch_op.f("ix_measurements_finding_id"))

    op.drop_table("measurements")
    op.drop_table("findings")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_started_at"))
        batch_op.drop_index(batch_op.f("ix_runs_series_id"))
        batch_op.drop_index(batch_op.f("ix_runs_model_version"))

    op.drop_table("runs")
    with op.batch_alter_table("series", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_series_study_id"))

    op.drop_table("series")
    op.drop_table("users")
    with op.batch_alter_table("studies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_studies_patient_id"))

    op.drop_table("studies")
    op.drop_table("audit_head")
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_events_object")
        batch_op.drop_index("ix_audit_events_at")
        batch_op.drop_index("ix_audit_events_actor")

    op.drop_table("audit_events")
    if op.get_bind().dialect.name == "postgresql":
        for name in ("role", "run_status", "source", "review_status", "review_action"):
            sa.Enum(name=name).drop(op.get_bind(), checkfirst=True)
