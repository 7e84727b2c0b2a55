"""A database as radcaliper wrote it at an earlier schema, for the audit and migration tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import MetaData, select

from db.audit import event_hash
from db.engine import connect
from db.migrate import upgrade

WHEN = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def old_database(url: str) -> None:
    """A database at schema 0002 holding what radcaliper of that schema stored for one study."""
    upgrade(url, "0002")
    engine = connect(url)
    tables = MetaData()
    tables.reflect(engine)
    with engine.begin() as connection:
        for table, row in OLD_ROWS:
            connection.execute(tables.tables[table].insert().values(**row))
        for event in OLD_EVENTS:
            _legacy_append(connection, tables, actor="cli:root", **event)
    engine.dispose()


def _legacy_append(connection: Any, tables: MetaData, **event: Any) -> None:
    """Append an event as radcaliper before 0003 did."""
    head = tables.tables["audit_head"]
    last_id, last_hash = connection.execute(select(head.c.last_id, head.c.last_hash)).one()
    at = WHEN
    digest = event_hash(
        last_hash,
        last_id + 1,
        at,
        event["actor"],
        event["action"],
        event["object_type"],
        event["object_id"],
        event["details"],
    )
    connection.execute(
        tables.tables["audit_events"]
        .insert()
        .values(id=last_id + 1, at=at, prev_hash=last_hash, hash=digest, **event)
    )
    connection.execute(head.update().values(last_id=last_id + 1, last_hash=digest))


# what radcaliper of schema 0002 stored for one study, table by table
OLD_ROWS: list[tuple[str, dict[str, Any]]] = [
    ("users", {"name": "ida", "role": "auditor", "password_hash": None, "active": True,
               "created_at": WHEN}),
    ("studies", {"study_instance_uid": "1.2.826.0.1.1", "patient_id": "PAT-1",
                 "study_date": "20261120", "created_at": WHEN}),
    ("series", {"study_id": 1, "series_instance_uid": "1.2.826.0.1.2", "modality": "CT",
                "description": "", "source_format": "dicom",
                "shape": {"slices": 3, "rows": 4, "columns": 4},
                "spacing_mm": {"slice": 2.0, "row": 0.7, "column": 0.7},
                "sop_instance_uids": {"uids": ["1.1", "1.2", "1.3"], "frames": [None] * 3},
                "geometry": None, "created_at": WHEN}),
    ("runs", {"series_id": 1, "model_name": "radcaliper-demo", "model_version": "0.3.4",
              "numeric_mode": "rned_corr", "checkpoint_hash": "c" * 64,
              "not_for_clinical_use": True, "settings": {"threads": 1},
              "input_fingerprint": "f" * 64, "source": "/data/study", "status": "done",
              "warnings": {"warnings": []}, "started_at": WHEN, "finished_at": WHEN}),
    ("findings", {"run_id": 1, "number": 1, "kind": "lesion", "center_x_mm": 1.5,
                  "center_y_mm": -2.0, "center_z_mm": 3.0, "slice_index": 1,
                  "sop_instance_uid": "1.2", "frame_number": None, "axes_lps_mm": None}),
    ("measurements", {"finding_id": 1, "name": "long_axis", "value_mm": 21.5,
                      "range_low_mm": 19.5, "range_high_mm": 23.5, "coverage": 0.9,
                      "unit": "mm", "qualifier": None, "reason": None, "source": "model",
                      "status": "pending", "reviewed_value_mm": None, "reviewer_id": None,
                      "reviewed_at": None, "version": 1}),
]  # fmt: skip


# and the events it logged (0002's measurement state has no "reason")
OLD_EVENTS: list[dict[str, Any]] = [
    {"action": "user.added", "object_type": "user", "object_id": 1,
     "details": {"name": "ida", "role": "auditor", "password": False}},
    {"action": "run.stored", "object_type": "run", "object_id": 1,
     "details": {"study_instance_uid": "1.2.826.0.1.1", "findings": 1}},
    {"action": "measurement.created", "object_type": "measurement", "object_id": 1,
     "details": {"run_id": 1, "finding": 1, "state": {
         "finding_id": 1, "name": "long_axis", "value_mm": 21.5, "range_mm": [19.5, 23.5],
         "coverage": 0.9, "unit": "mm", "qualifier": None, "source": "model",
         "status": "pending", "reviewed_value_mm": None, "reviewer_id": None,
         "reviewed_at": None, "version": 1}}},
]  # fmt: skip
