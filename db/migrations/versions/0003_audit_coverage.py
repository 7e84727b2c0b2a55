"""Audit coverage of every stored fact, and the patient name on studies.

- ``studies.patient_name``: the source's DICOM patient name, kept for the DICOM SR when the
  source had one (never with pseudonyms).
- From this revision on, the audit log records the state of every row that a result, an SR or
  an audit answer is built from (users, studies, series, runs, findings, besides measurements and
  reviews: ``db.audit.coverage``), and ``radcaliper audit verify`` compares them. Rows stored before
  have no such record, so this upgrade records their current state as **baseline events**
  (action ``audit.baseline``, at most 2,000 rows each), signed off by whoever runs the upgrade
  (the event's actor), each saying which tables it covers and why (what the log recorded of
  them before). A row changed before the upgrade cannot be told from the log; every change after
  it can. The upgrade logs how many rows the baseline holds. Before it runs, the migration
  environment checks that the log vouches for what it already covered (``db.migrate``): a
  database whose version was set back to 0002 outside radcaliper is refused, not baselined; and
  a table whose rows the log records already gets no baseline.
- The downgrade records the studies whose patient names it drops, as they are without them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

import logging
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
# why each table needs a baseline: what the log recorded of its rows before this revision
WHY = {
    "users": "the log recorded each user's name and role (checked before this upgrade), not "
    "whether the user is active nor the password hash",
    "studies": "the log recorded no study rows",
    "series": "the log recorded no series rows",
    "runs": "the log recorded each run's checkpoint and input (checked before this upgrade), "
    "not its other fields",
    "findings": "the log recorded no finding rows",
}


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("patient_name", sa.String(324), nullable=True))
    _record_baseline(op.get_bind())


def downgrade() -> None:
    # the log is append-only: baseline events stay; the patient names dropped with the column
    # are recorded as gone, so that the log still says what the rows hold
    from db.migration_ops import drop_column, record_dropped

    record_dropped(
        "studies",
        "patient_name",
        where=None,
        reset=None,
        revision=revision,
        statement="a downgrade below schema 0003 drops studies.patient_name: these studies' "
        "patient names are gone",
    )
    drop_column("studies", "patient_name")


def _actor() -> str:
    return str(context.config.attributes.get("actor") or "migration:0003")[:64]


def _logged_in_full(bind: sa.Connection) -> set[str]:
    """The tables of which some event records states in ``details["rows"]`` (a database that
    was at this schema before, and was taken down again by a recorded downgrade: the check
    before this migration refuses one whose version was set back outside radcaliper)."""
    events = sa.table("audit_events", sa.column("id"), sa.column("details", sa.JSON()))
    found: set[str] = set()
    for (details,) in bind.execute(sa.select(events.c.details).order_by(events.c.id)):
        rows = details.get("rows") if isinstance(details, dict) else None
        if isinstance(rows, dict):
            found.update(name for name in rows if name in BASELINE_TABLES)
    return found


def _record_baseline(bind: sa.Connection) -> None:
    # The chain's own append and the coverage's state functions, on rows of the tables as they
    # are at this revision (reflected). A later revision that covers a column added after 0003
    # must keep these functions working on rows without it (or freeze 0003's here).
    from db.audit import append_event_core
    from db.audit.coverage import row_state

    metadata = sa.MetaData()
    metadata.reflect(bind, only=BASELINE_TABLES)
    covered = _logged_in_full(bind)
    tables = [name for name in BASELINE_TABLES if name not in covered]
    counts: dict[str, int] = {}
    parts: list[tuple[str, dict[str, Any]]] = []
    for name in tables:
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
    if covered:
        logger.warning(
            "audit coverage: no baseline for %s: the audit log records their rows already",
            ", ".join(sorted(covered)),
        )
    if not parts:
        return  # a new database: nothing stored before the coverage
    actor, first_id, last_id = _actor(), 0, 0
    why = {name: WHY[name] for name in counts}
    for number, (name, states) in enumerate(parts, start=1):
        details = {
            "revision": revision,
            "signed_off_by": actor,
            "statement": "the current state of rows stored before audit coverage (schema "
            "0003), accepted as the baseline: changes made before this event cannot be "
            "detected, changes after it can",
            "tables": why,
            "part": number,
            "parts": len(parts),
            "rows": {name: states},
        }
        last_id = append_event_core(
            bind,
            actor=actor,
            action="audit.baseline",
            object_type="table",
            object_id=None,
            details=details,
        )
        first_id = first_id or last_id
    held = ", ".join(f"{count} {name}" for name, count in counts.items())
    logger.warning(
        "audit coverage: recorded the current state of %s as baseline audit events %d..%d, "
        "signed off by %s; changes made before this upgrade cannot be detected (%s)",
        held,
        first_id,
        last_id,
        actor,
        "; ".join(f"{name}: {reason}" for name, reason in why.items()),
    )
