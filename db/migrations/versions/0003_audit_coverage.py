"""Audit coverage of every stored fact, and the patient name on studies.

- ``studies.patient_name``: the source's DICOM patient name, kept for the DICOM SR when the
  source had one (never with pseudonyms).
- From this revision on, the audit log records the state of every row that a result, an SR or
  an audit answer is built from (users, studies, series, runs, findings, besides measurements and
  reviews: ``db.coverage``), and ``radcaliper audit verify`` compares them. Rows stored before
  have no such record, so this upgrade records their current state as **baseline events**
  (action ``audit.baseline``, at most 2,000 rows each), signed off by whoever runs the upgrade
  (the event's actor). A row changed before the upgrade cannot be told from the log; every change
  after it can. The upgrade logs how many rows the baseline holds.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

logger = logging.getLogger("alembic.runtime.migration")

BASELINE_TABLES = ("users", "studies", "series", "runs", "findings")  # not covered before 0003
ROWS_PER_EVENT = 2000


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("patient_name", sa.String(324), nullable=True))
    _record_baseline(op.get_bind())


def downgrade() -> None:
    # baseline events stay: the log is append-only
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("patient_name")


def _record_baseline(bind: sa.Connection) -> None:
    # The chain's own hash and the coverage's state functions, on rows of the tables as they are
    # at this revision (reflected). A later revision that covers a column added after 0003 must
    # keep these functions working on rows without it (or freeze 0003's here).
    from db.audit import event_hash
    from db.coverage import row_state

    metadata = sa.MetaData()
    metadata.reflect(bind, only=(*BASELINE_TABLES, "audit_events", "audit_head"))
    events, head = metadata.tables["audit_events"], metadata.tables["audit_head"]
    actor = str(context.config.attributes.get("actor") or "migration:0003")[:64]
    counts: dict[str, int] = {}
    parts: list[tuple[str, dict[str, Any]]] = []
    for name in BASELINE_TABLES:
        table = metadata.tables[name]
        states: dict[str, Any] = {}
        counts[name] = 0
        for row in bind.execute(sa.select(table).order_by(table.c.id)):
            states[str(row.id)] = row_state(name, row)
            counts[name] += 1
            if len(states) == ROWS_PER_EVENT:
                parts.append((name, states))
                states = {}
        if states:
            parts.append((name, states))
    if not parts:
        return  # a new database: nothing stored before the coverage
    query = sa.select(head.c.last_id, head.c.last_hash).where(head.c.id == 1)
    if bind.dialect.name == "postgresql":
        query = query.with_for_update()
    last_id, last_hash = bind.execute(query).one()
    first_id = last_id + 1
    for number, (name, states) in enumerate(parts, start=1):
        details = {
            "revision": revision,
            "signed_off_by": actor,
            "statement": "the current state of rows stored before audit coverage (schema "
            "0003), accepted as the baseline: changes made before this event cannot be "
            "detected, changes after it can",
            "part": number,
            "parts": len(parts),
            "rows": {name: states},
        }
        at = datetime.now(UTC)
        event_id = last_id + 1
        digest = event_hash(
            last_hash, event_id, at, actor, "audit.baseline", "table", None, details
        )
        bind.execute(
            events.insert().values(
                id=event_id,
                at=at,
                actor=actor,
                action="audit.baseline",
                object_type="table",
                object_id=None,
                details=details,
                prev_hash=last_hash,
                hash=digest,
            )
        )
        last_id, last_hash = event_id, digest
    bind.execute(head.update().where(head.c.id == 1).values(last_id=last_id, last_hash=last_hash))
    held = ", ".join(f"{count} {name}" for name, count in counts.items())
    logger.warning(
        "audit coverage: recorded the current state of %s as baseline audit events %d..%d, "
        "signed off by %s; changes made before this upgrade cannot be detected",
        held,
        first_id,
        last_id,
        actor,
    )
