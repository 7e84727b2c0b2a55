"""The measurement store: SQLAlchemy models, migrations, storing results, reviews, users, the
hash-chained audit log and the audit queries (SQLite by default, PostgreSQL for sites).

Names are served lazily (PEP 562): importing ``db`` loads neither SQLAlchemy nor Alembic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from db.audit import (
        GENESIS,
        UnknownHeadError,
        VerifyReport,
        append_event,
        canonical_time,
        event_hash,
        measurement_state,
        review_state,
        verify,
    )
    from db.audit.coverage import (
        COVERED_TABLES,
        row_state,
    )
    from db.engine import (
        Store,
        connect,
        current,
        open_store,
        redacted,
        session_scope,
    )
    from db.migrate import (
        alembic_config,
        downgrade,
        head_revision,
        upgrade,
    )
    from db.models import (
        AuditEvent,
        AuditHead,
        Base,
        Finding,
        Measurement,
        MeasurementSource,
        Review,
        ReviewAction,
        ReviewStatus,
        Role,
        Run,
        RunStatus,
        Series,
        Study,
        User,
    )
    from db.queries import (
        LogFilter,
        MeasurementFilter,
        WorklistFilter,
        audit_log_rows,
        measurement_query,
        measurement_rows,
        study_measurements,
        worklist_rows,
    )
    from db.review import (
        CorrectionLimits,
        review_measurement,
    )
    from db.store import (
        RunIdentity,
        StoreOutcome,
        dicom_series_uid,
        find_run,
        input_fingerprint,
        pseudonym,
        store_result,
    )
    from db.training import (
        ReviewedFinding,
        ReviewedMeasurement,
        reviewed_findings,
    )
    from db.users import (
        add_user,
        get_user,
        hash_password,
        verify_password,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "db.audit": (
        "GENESIS",
        "UnknownHeadError",
        "VerifyReport",
        "append_event",
        "canonical_time",
        "event_hash",
        "measurement_state",
        "review_state",
        "verify",
    ),
    "db.audit.coverage": (
        "COVERED_TABLES",
        "row_state",
    ),
    "db.engine": (
        "Store",
        "connect",
        "current",
        "open_store",
        "redacted",
        "session_scope",
    ),
    "db.migrate": (
        "alembic_config",
        "downgrade",
        "head_revision",
        "upgrade",
    ),
    "db.models": (
        "AuditEvent",
        "AuditHead",
        "Base",
        "Finding",
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
    ),
    "db.queries": (
        "LogFilter",
        "MeasurementFilter",
        "WorklistFilter",
        "audit_log_rows",
        "measurement_query",
        "measurement_rows",
        "study_measurements",
        "worklist_rows",
    ),
    "db.review": ("CorrectionLimits", "review_measurement"),
    "db.store": (
        "RunIdentity",
        "StoreOutcome",
        "dicom_series_uid",
        "find_run",
        "input_fingerprint",
        "pseudonym",
        "store_result",
    ),
    "db.training": (
        "ReviewedFinding",
        "ReviewedMeasurement",
        "reviewed_findings",
    ),
    "db.users": (
        "add_user",
        "get_user",
        "hash_password",
        "verify_password",
    ),
}
__all__ = [
    "COVERED_TABLES",
    "GENESIS",
    "AuditEvent",
    "AuditHead",
    "Base",
    "CorrectionLimits",
    "Finding",
    "LogFilter",
    "Measurement",
    "MeasurementFilter",
    "MeasurementSource",
    "Review",
    "ReviewAction",
    "ReviewStatus",
    "ReviewedFinding",
    "ReviewedMeasurement",
    "Role",
    "Run",
    "RunIdentity",
    "RunStatus",
    "Series",
    "Store",
    "StoreOutcome",
    "Study",
    "UnknownHeadError",
    "User",
    "VerifyReport",
    "WorklistFilter",
    "add_user",
    "alembic_config",
    "append_event",
    "audit_log_rows",
    "canonical_time",
    "connect",
    "current",
    "dicom_series_uid",
    "downgrade",
    "event_hash",
    "find_run",
    "get_user",
    "hash_password",
    "head_revision",
    "input_fingerprint",
    "measurement_query",
    "measurement_rows",
    "measurement_state",
    "open_store",
    "pseudonym",
    "redacted",
    "review_measurement",
    "review_state",
    "reviewed_findings",
    "row_state",
    "session_scope",
    "store_result",
    "study_measurements",
    "upgrade",
    "verify",
    "verify_password",
    "worklist_rows",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
