"""What the audit log records about stored rows, so that ``audit verify`` can tell a row that
differs from what the log says.

Every fact that a result, a DICOM SR or an audit answer is built from is *covered*: each row of
the tables below is recorded in an audit event when radcaliper writes it, with the fields
listed here (its *state*), and :func:`db.audit.verify` compares the tables with the last state the
log recorded for each row, naming the first table, row and field that differs.

====================  =====================================================================
table                 fields recorded
====================  =====================================================================
``users``             name, role, active, the password hash (as a digest), created_at, whether
                      the password must be changed at the next login (since 0004)
``studies``           study UID, patient id, patient name, study date, created_at
``series``            study, series UID, modality, description, source format, shape, spacing,
                      geometry, the SOP instance UIDs (as a digest), created_at
``runs``              series, model name / version / numeric mode, checkpoint hash,
                      not-for-clinical-use flag, settings (digest), input fingerprint, source,
                      status, warnings (digest), start and end
``findings``          run, number, kind, centre (x, y, z), slice, SOP instance and frame, axes
``measurements``      finding, name, value, range, coverage, unit, qualifier, reason, source,
                      review status, reviewed value, reviewer, time, version
``reviews``           measurement, action, value, reason, reviewer, time
====================  =====================================================================

Bulky values are recorded as a SHA-256 digest of their canonical JSON (``sha256:<hex>``): a
change is detected and named, the old value is not kept twice.

An event carries states in ``details["rows"]``: ``{table: {row id (text): state}}``. Older events
(schema before 0003) carry one measurement's or review's state in ``details["state"]``, and the
name and role of an added user (``user.added``) or the checkpoint and input of a stored run
(``run.stored``) in their details; all are read by :func:`logged_states`. A state records only
what it names: an older event with fewer fields is compared on those fields.

**Coverage by schema.** :data:`COVERED_SINCE` gives the schema revision from which the log
records every row of a table (before 0003: users, runs, measurements and reviews through the
older events above; from 0003 every covered table). ``audit verify`` and the check before a
migration compare a table whole (a row the log does not know was added outside radcaliper) from
that revision on; before it, only the rows the log records.

**Schema events.** Every migration of a database with an audit log records one event
(:data:`SCHEMA_UPGRADED` / :data:`SCHEMA_DOWNGRADED`, ``details = {"from": revision or None,
"to": revision or None}``), signed off by whoever ran it: the log knows which schema the
database is at, so a version set back outside radcaliper shows (:func:`implied_revision` reads
the same from the content of the events of logs older than these events).

The state functions read attributes, so they take ORM objects and Core rows alike (the 0003
migration records existing rows from reflected tables). Each also takes ``digest_of``, how a
bulky value becomes its ``sha256:`` text (:func:`digest`, the stored format); ``audit verify``
passes a faster function whose result can equal a logged digest only for the logged value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

__all__ = [
    "COVERED_SINCE",
    "COVERED_TABLES",
    "SCHEMA_DOWNGRADED",
    "SCHEMA_UPGRADED",
    "DigestOf",
    "StateFunction",
    "canonical_json",
    "canonical_time",
    "digest",
    "finding_state",
    "implied_revision",
    "logged_states",
    "measurement_state",
    "review_state",
    "revision_number",
    "row_state",
    "run_state",
    "schema_change",
    "series_state",
    "states_detail",
    "study_state",
    "user_state",
]

State = dict[str, Any]
DigestOf = Callable[[Any], str]


class StateFunction(Protocol):
    """A covered table's state function: ``(row, digest_of=digest) -> state``."""

    def __call__(self, row: Any, digest_of: DigestOf = ..., /) -> State: ...


def canonical_time(value: datetime) -> str:
    """UTC, microseconds, ``Z``: the same text whatever the database returned."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(timespec="microseconds") + "Z"


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, no NaN: the text that is hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(value: Any) -> str:
    """``sha256:`` + the hex digest of ``value``'s canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest()


def _time(value: datetime | None) -> str | None:
    return None if value is None else canonical_time(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _text(value: Any) -> str | None:
    """Enum members as their value; None stays None."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


def user_state(u: Any, digest_of: DigestOf = digest) -> State:
    return {
        "name": u.name,
        "role": _text(u.role),
        "active": bool(u.active),
        "password_hash": None if u.password_hash is None else digest_of(u.password_hash),
        "created_at": _time(u.created_at),
        # since 0004 (a row of an earlier schema has no such attribute, or reads it as NULL)
        "must_change_password": bool(getattr(u, "must_change_password", False)),
    }


def study_state(s: Any, digest_of: DigestOf = digest) -> State:
    return {
        "study_instance_uid": s.study_instance_uid,
        "patient_id": s.patient_id,
        "patient_name": s.patient_name,
        "study_date": s.study_date,
        "created_at": _time(s.created_at),
    }


def series_state(s: Any, digest_of: DigestOf = digest) -> State:
    return {
        "study_id": _int(s.study_id),
        "series_instance_uid": s.series_instance_uid,
        "modality": s.modality,
        "description": s.description,
        "source_format": s.source_format,
        "shape": s.shape,
        "spacing_mm": s.spacing_mm,
        "geometry": s.geometry,
        "sop_instance_uids": digest_of(s.sop_instance_uids),
        "created_at": _time(s.created_at),
    }


def run_state(r: Any, digest_of: DigestOf = digest) -> State:
    return {
        "series_id": _int(r.series_id),
        "model_name": r.model_name,
        "model_version": r.model_version,
        "numeric_mode": r.numeric_mode,
        "checkpoint_hash": r.checkpoint_hash,
        "not_for_clinical_use": bool(r.not_for_clinical_use),
        "settings": digest_of(r.settings),
        "input_fingerprint": r.input_fingerprint,
        "source": r.source,
        "status": _text(r.status),
        "warnings": digest_of(r.warnings),
        "started_at": _time(r.started_at),
        "finished_at": _time(r.finished_at),
    }


def finding_state(f: Any, digest_of: DigestOf = digest) -> State:
    return {
        "run_id": _int(f.run_id),
        "number": _int(f.number),
        "kind": f.kind,
        "center_x_mm": _float(f.center_x_mm),
        "center_y_mm": _float(f.center_y_mm),
        "center_z_mm": _float(f.center_z_mm),
        "slice_index": _int(f.slice_index),
        "sop_instance_uid": f.sop_instance_uid,
        "frame_number": _int(f.frame_number),
        "axes_lps_mm": f.axes_lps_mm,
    }


def measurement_state(m: Any, digest_of: DigestOf = digest) -> State:
    """The fields of a measurement row that the log records (and verify compares)."""
    return {
        "finding_id": _int(m.finding_id),
        "name": m.name,
        "value_mm": _float(m.value_mm),
        "range_mm": None
        if m.range_low_mm is None
        else [_float(m.range_low_mm), _float(m.range_high_mm)],
        "coverage": _float(m.coverage),
        "unit": m.unit,
        "qualifier": m.qualifier,
        "reason": m.reason,
        "source": _text(m.source),
        "status": _text(m.status),
        "reviewed_value_mm": _float(m.reviewed_value_mm),
        "reviewer_id": _int(m.reviewer_id),
        "reviewed_at": _time(m.reviewed_at),
        "version": _int(m.version),
    }


def review_state(r: Any, digest_of: DigestOf = digest) -> State:
    """The fields of a review row that the log records."""
    return {
        "measurement_id": _int(r.measurement_id),
        "action": _text(r.action),
        "value_mm": _float(r.value_mm),
        "reason": r.reason,
        "reviewer_id": _int(r.reviewer_id),
        "created_at": _time(r.created_at),
    }


# table name -> its state function, in the order verify compares them
COVERED_TABLES: Mapping[str, StateFunction] = {
    "users": user_state,
    "studies": study_state,
    "series": series_state,
    "runs": run_state,
    "findings": finding_state,
    "measurements": measurement_state,
    "reviews": review_state,
}

# table -> the schema revision from which the log records every row of it
COVERED_SINCE: Mapping[str, str] = {
    "users": "0001",  # user.added: name and role
    "studies": "0003",
    "series": "0003",
    "runs": "0001",  # run.stored: the checkpoint and the input
    "findings": "0003",
    "measurements": "0001",
    "reviews": "0001",
}
ROWS_SINCE = "0003"  # events record states in details["rows"] from this revision on

SCHEMA_UPGRADED = "schema.upgraded"
SCHEMA_DOWNGRADED = "schema.downgraded"

# object types of events before 0003 that carry one row's state in details["state"]
_LEGACY_STATE = {"measurement": "measurements", "review": "reviews"}
# actions of events before 0003 that name some fields of the row they are about
_LEGACY_FIELDS = {
    ("user.added", "user"): ("users", ("name", "role")),
    ("run.stored", "run"): ("runs", ("checkpoint_hash", "input_fingerprint")),
}


def revision_number(revision: str) -> int:
    """A schema revision as a number (radcaliper's revisions are numbered ``0001``, ``0002``,
    ...), for comparing them; ``ValueError`` for one that is not."""
    if not (revision.isascii() and revision.isdigit()):
        raise ValueError(f"schema revision {revision!r} is not one of radcaliper's")
    return int(revision)


def schema_change(action: str, details: Mapping[str, Any]) -> tuple[str | None] | None:
    """The schema an event says the database was migrated to (a 1-tuple: None for no schema),
    or None when the event is not a schema event."""
    if action not in (SCHEMA_UPGRADED, SCHEMA_DOWNGRADED):
        return None
    to = details.get("to")
    return (to if isinstance(to, str) else None,)


def implied_revision(action: str, details: Mapping[str, Any]) -> str | None:
    """The least schema revision that an event's content implies (None: nothing): states in
    ``details["rows"]`` were first written at :data:`ROWS_SINCE`; a baseline names its
    revision."""
    implied = None
    if isinstance(details.get("rows"), dict) and details["rows"]:
        implied = ROWS_SINCE
    if action == "audit.baseline" and isinstance(details.get("revision"), str):
        named = details["revision"]
        try:
            if implied is None or revision_number(named) > revision_number(implied):
                implied = named
        except ValueError:
            implied = named  # not one of ours: the caller reports it
    return implied


def row_state(table: str, row: Any) -> State:
    """The state of ``row`` of the covered ``table``."""
    return COVERED_TABLES[table](row)


def states_detail(rows: Mapping[str, list[Any]]) -> dict[str, dict[str, State]]:
    """``details["rows"]`` for the rows of each covered table (ORM objects with ids)."""
    return {
        table: {str(row.id): row_state(table, row) for row in items}
        for table, items in rows.items()
        if items
    }


def logged_states(
    object_type: str, object_id: int | None, details: Mapping[str, Any], *, action: str
) -> Iterator[tuple[str, int, State]]:
    """(table, row id, state) for every row state an event (``action`` on ``object_type``
    ``object_id``) records in its details."""
    legacy = _LEGACY_STATE.get(object_type)
    if legacy is not None and object_id is not None and isinstance(details.get("state"), dict):
        yield legacy, object_id, details["state"]
    rows = details.get("rows")
    named = _LEGACY_FIELDS.get((action, object_type))
    if named is not None and object_id is not None and rows is None:
        table, fields = named
        yield table, object_id, {field: details[field] for field in fields if field in details}
    if isinstance(rows, dict):
        for table, states in rows.items():
            if table in COVERED_TABLES and isinstance(states, dict):
                for row_id, state in states.items():
                    yield table, int(row_id), state
