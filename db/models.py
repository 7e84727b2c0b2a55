"""The measurement store's tables (SQLAlchemy 2, typed declarative mapping).

::

    users ─────────────┐ (reviewer)
    studies ─< series ─< runs ─< findings ─< measurements ─< reviews
    audit_events (append-only, hash-chained; ``db.audit``)
    audit_head (one row: the chain's end)

- A **run** is one model (name, version, checkpoint hash) applied to one series with one input
  fingerprint; the same four again are the same run (idempotency, a unique constraint). A new model
  version adds a run and keeps the old one.
- A **measurement** keeps what the model said (value, range, coverage, UCUM unit, the image it
  refers to) and its review state (status, reviewed value, reviewer, time). ``version`` counts its
  changes: a reviewer's edit names the version it saw and a stale edit is refused
  (optimistic locking, ``db.review``).
- A **review** is one reviewer action (accept, correct with a value, reject) with its reason.
- Every insert and every review is also an **audit event** whose details record the values, so
  ``radcaliper audit verify`` can tell a row that differs from what the log says.

Timestamps are timezone-aware UTC. Indexes serve the audit queries (patient, study date, model
version, status, reviewer, time).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "AuditEvent",
    "AuditHead",
    "Base",
    "Finding",
    "LoginFailure",
    "Measurement",
    "MeasurementSource",
    "Review",
    "ReviewAction",
    "ReviewStatus",
    "Role",
    "Run",
    "RunStatus",
    "Series",
    "Study",
    "User",
]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
    }


class Role(enum.StrEnum):
    REVIEWER = "reviewer"
    AUDITOR = "auditor"
    ADMIN = "admin"


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class ReviewStatus(enum.StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    CORRECTED = "corrected"
    REJECTED = "rejected"


class ReviewAction(enum.StrEnum):
    ACCEPT = "accept"
    CORRECT = "correct"
    REJECT = "reject"


class MeasurementSource(enum.StrEnum):
    MODEL = "model"
    REVIEWER = "reviewer"


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    return Enum(cls, name=name, values_callable=lambda e: [m.value for m in e], length=16)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[Role] = mapped_column(_enum(Role, "role"))
    password_hash: Mapped[str | None] = mapped_column(String(256))
    active: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime]
    # an administrator set the password: the user must choose a new one at the next login; 0004
    must_change_password: Mapped[bool] = mapped_column(default=False, server_default=false())


class LoginFailure(Base):
    """A failed login: the name tried and the client address (not a user's row: unknown names
    are counted too). The login back-off is computed from these (``db.logins``); unlocking
    deletes them. Not covered by the audit log (locks and unlocks are events). Since 0004."""

    __tablename__ = "login_failures"
    __table_args__ = (
        Index("ix_login_failures_user_name", "user_name", "at"),
        Index("ix_login_failures_address", "address", "at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(64))
    address: Mapped[str] = mapped_column(String(128))
    at: Mapped[datetime]


class Study(Base):
    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_instance_uid: Mapped[str] = mapped_column(String(64), unique=True)
    patient_id: Mapped[str] = mapped_column(String(64), index=True)
    # DICOM PN text of the source (None: not given, NIfTI, or pseudonymised); since 0003
    patient_name: Mapped[str | None] = mapped_column(String(324))
    study_date: Mapped[str | None] = mapped_column(String(8))
    created_at: Mapped[datetime]
    series: Mapped[list[Series]] = relationship(back_populates="study")


class Series(Base):
    __tablename__ = "series"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="RESTRICT"), index=True)
    series_instance_uid: Mapped[str] = mapped_column(String(64), unique=True)
    modality: Mapped[str | None] = mapped_column(String(8))
    description: Mapped[str] = mapped_column(String(256), default="")
    source_format: Mapped[str] = mapped_column(String(16))
    shape: Mapped[dict[str, Any]]  # {"slices", "rows", "columns"}
    spacing_mm: Mapped[dict[str, Any]]  # {"slice", "row", "column"}
    sop_instance_uids: Mapped[dict[str, Any]]  # {"uids": [...], "frames": [...]} per slice
    # {"origin", "row_direction", "column_direction", "slice_direction", "spacing"} as in
    # ingestion.Geometry (LPS mm; spacing in (slice, row, column) order); None before 0002
    geometry: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]
    study: Mapped[Study] = relationship(back_populates="series")
    runs: Mapped[list[Run]] = relationship(back_populates="series")


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint(
            "series_id",
            "model_name",
            "model_version",
            "checkpoint_hash",
            "input_fingerprint",
            name="uq_runs_identity",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id", ondelete="RESTRICT"), index=True)
    model_name: Mapped[str] = mapped_column(String(128))
    model_version: Mapped[str] = mapped_column(String(64), index=True)
    numeric_mode: Mapped[str] = mapped_column(String(32))
    checkpoint_hash: Mapped[str] = mapped_column(String(64))
    not_for_clinical_use: Mapped[bool]
    settings: Mapped[dict[str, Any]]
    input_fingerprint: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    status: Mapped[RunStatus] = mapped_column(_enum(RunStatus, "run_status"))
    warnings: Mapped[dict[str, Any]]  # {"warnings": [...]}
    started_at: Mapped[datetime] = mapped_column(index=True)
    finished_at: Mapped[datetime | None]
    series: Mapped[Series] = relationship(back_populates="runs")
    findings: Mapped[list[Finding]] = relationship(back_populates="run", order_by="Finding.number")


class Finding(Base):
    __tablename__ = "findings"
    __table_args__ = (UniqueConstraint("run_id", "number", name="uq_findings_run_number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="RESTRICT"))
    number: Mapped[int]  # the finding's id in the result (1..n)
    kind: Mapped[str] = mapped_column(String(16))
    center_x_mm: Mapped[float] = mapped_column(Float)
    center_y_mm: Mapped[float] = mapped_column(Float)
    center_z_mm: Mapped[float] = mapped_column(Float)
    slice_index: Mapped[int]
    sop_instance_uid: Mapped[str | None] = mapped_column(String(64))  # the image it refers to
    frame_number: Mapped[int | None]
    axes_lps_mm: Mapped[dict[str, Any] | None]  # {"segments": [[[x, y, z], [x, y, z]], ...]}
    run: Mapped[Run] = relationship(back_populates="findings")
    measurements: Mapped[list[Measurement]] = relationship(
        back_populates="finding", order_by="Measurement.id"
    )


class Measurement(Base):
    __tablename__ = "measurements"
    __table_args__ = (
        Index("ix_measurements_status", "status"),
        Index("ix_measurements_reviewer_id", "reviewer_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    finding_id: Mapped[int] = mapped_column(
        ForeignKey("findings.id", ondelete="RESTRICT"), index=True
    )
    name: Mapped[str] = mapped_column(String(16))
    value_mm: Mapped[float | None] = mapped_column(Float)
    range_low_mm: Mapped[float | None] = mapped_column(Float)
    range_high_mm: Mapped[float | None] = mapped_column(Float)
    coverage: Mapped[float | None] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(8), default="mm")  # UCUM
    qualifier: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text)
    source: Mapped[MeasurementSource] = mapped_column(_enum(MeasurementSource, "source"))
    status: Mapped[ReviewStatus] = mapped_column(_enum(ReviewStatus, "review_status"))
    reviewed_value_mm: Mapped[float | None] = mapped_column(Float)
    reviewer_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="RESTRICT"))
    reviewed_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(default=1)
    finding: Mapped[Finding] = relationship(back_populates="measurements")
    reviewer: Mapped[User | None] = relationship()


class Review(Base):
    __tablename__ = "reviews"

    id: Mapped[int] = mapped_column(primary_key=True)
    measurement_id: Mapped[int] = mapped_column(
        ForeignKey("measurements.id", ondelete="RESTRICT"), index=True
    )
    action: Mapped[ReviewAction] = mapped_column(_enum(ReviewAction, "review_action"))
    value_mm: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text)
    reviewer_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="RESTRICT"))
    created_at: Mapped[datetime]
    reviewer: Mapped[User] = relationship()


class AuditEvent(Base):
    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_at", "at"),
        Index("ix_audit_events_actor", "actor"),
        Index("ix_audit_events_object", "object_type", "object_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    object_type: Mapped[str] = mapped_column(String(32))
    object_id: Mapped[int | None] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))
    details: Mapped[dict[str, Any]]
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)


class AuditHead(Base):
    """One row: the last event's id and hash. Appending locks it, so appends are serial."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(primary_key=True)
    last_id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), default=0)
    last_hash: Mapped[str] = mapped_column(String(64))
