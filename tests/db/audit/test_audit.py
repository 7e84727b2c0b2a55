"""The hash-chained audit log: an intact log verifies; every kind of tampering is named."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text, update

from db.audit import GENESIS, event_hash, verify
from db.engine import Store
from db.models import AuditEvent, Measurement, Review, ReviewAction, User
from db.review import review_measurement

from tests.support.db import as_attacker as _as_attacker
from tests.support.db import first_measurement_id


def _verify(store: Store, head: str | None = None):  # type: ignore[no-untyped-def]
    with store.reader() as session:
        return verify(session, expected_head=head)


def _reviewed(store: Store, users: dict[str, User]) -> int:
    mid = first_measurement_id(store)
    with store.writer() as session:
        review_measurement(
            session, mid, action=ReviewAction.ACCEPT, reviewer=users["alice"], seen_version=1
        )
        session.commit()
    return mid


def test_an_intact_log_verifies(store: Store, stored: int, users: dict[str, User]) -> None:
    _reviewed(store, users)
    report = _verify(store)
    assert report.ok and report.problem is None
    # the schema's creation, run + 3 measurements, 3 users, review + measurement
    assert report.events == 1 + 4 + 3 + 2
    assert report.head_hash != GENESIS
    assert _verify(store, report.head_hash).ok


def test_the_log_refuses_updates_and_deletes(store: Store, stored: int) -> None:
    for statement in ("UPDATE audit_events SET actor = 'x'", "DELETE FROM audit_events"):
        with pytest.raises(Exception, match="append-only"), store.engine.begin() as connection:
            connection.execute(text(statement))
    assert _verify(store).ok


@pytest.mark.parametrize(
    ("statements", "problem"),
    [
        (["UPDATE audit_events SET actor = 'mallory' WHERE id = 2"], "audit event 2 .* was edited"),
        (["DELETE FROM audit_events WHERE id = 2"], r"audit events 2\.\.2 are missing"),
        (["DELETE FROM audit_events WHERE id = 5"], "the log ends at event 4 but the head says"),
        (
            ["UPDATE audit_events SET prev_hash = '" + "1" * 64 + "' WHERE id = 3"],
            "audit event 3 does not follow event 2",
        ),
    ],
)
def test_tampering_with_the_log_is_named(
    store: Store, stored: int, statements: list[str], problem: str
) -> None:
    _as_attacker(store, *statements)
    report = _verify(store)
    assert not report.ok and report.problem is not None
    assert pytest.approx(0) == 0 and __import__("re").search(problem, report.problem), (
        report.problem
    )


def test_rows_changed_behind_the_log_are_named(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    mid = _reviewed(store, users)
    with store.engine.begin() as connection:
        connection.execute(update(Measurement).where(Measurement.id == mid).values(value_mm=99.0))
    report = _verify(store)
    assert not report.ok
    assert (report.table, report.row_id, report.field) == ("measurements", mid, "value_mm")
    assert f"table measurements, row {mid}, field value_mm: 99.0 in the table" in (
        report.problem or ""
    )


def test_a_review_added_or_removed_behind_the_log_is_named(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    mid = _reviewed(store, users)
    with store.engine.begin() as connection:
        connection.execute(update(Review).values(reason="changed my mind"))
    report = _verify(store)
    assert not report.ok and "table reviews, row 1, field reason" in (report.problem or "")
    with store.engine.begin() as connection:
        connection.execute(text("DELETE FROM reviews"))
    report = _verify(store)
    assert not report.ok and "table reviews, row 1: in the audit log (event" in (
        report.problem or ""
    )
    assert "but not in the table: it was deleted" in (report.problem or "")
    assert mid > 0


def test_a_rewritten_log_is_caught_by_the_head_kept_elsewhere(store: Store, stored: int) -> None:
    kept = _verify(store).head_hash
    _as_attacker(
        store,
        "DELETE FROM audit_events WHERE id = 5",
        "UPDATE audit_head SET last_id = 4, "
        "last_hash = (SELECT hash FROM audit_events WHERE id = 4)",
        "DELETE FROM measurements WHERE id = (SELECT max(id) FROM measurements)",
    )
    report = _verify(store, kept)
    assert not report.ok and "is not the expected" in (report.problem or "")
    # the chain and rows are consistent inside the database: besides the kept head, only the
    # triggers the attacker had to drop tell
    alone = _verify(store)
    assert not alone.ok and "append-only trigger" in (alone.problem or "")
    assert "is missing" in (alone.problem or "")


def _forged(previous: AuditEvent, event_id: int) -> AuditEvent:
    """An event a knowledgeable attacker writes: it follows ``previous`` and its hash is right."""
    at = previous.at
    details = {"state": {"note": "forged"}}
    return AuditEvent(
        id=event_id,
        at=at,
        actor="mallory",
        action="measurement.correct",
        object_type="note",
        object_id=None,
        details=details,
        prev_hash=previous.hash,
        hash=event_hash(
            previous.hash, event_id, at, "mallory", "measurement.correct", "note", None, details
        ),
    )


def test_an_event_appended_behind_the_head_is_named(store: Store, stored: int) -> None:
    """A well-formed event added after the last one (INSERT is not blocked by the triggers):
    the head, which appending through the API moves, still names the old end."""
    with store.writer() as session:
        last = session.execute(select(AuditEvent).order_by(AuditEvent.id.desc())).scalars().first()
        assert last is not None
        session.add(_forged(last, last.id + 1))
        session.commit()
    report = _verify(store)
    assert not report.ok
    assert f"the log ends at event {last.id + 1} but the head says event {last.id}" in (
        report.problem or ""
    )


def test_an_event_inserted_in_the_middle_is_named(store: Store, stored: int) -> None:
    """Renumbering the later events to make room for a forged event 3 breaks their hashes
    (an event's id is part of what it hashes)."""
    with store.reader() as session:
        second = session.get(AuditEvent, 2)
        assert second is not None
        forged = _forged(second, 3)
        last_id = session.execute(select(func.max(AuditEvent.id))).scalar_one()
    # make room from the end backwards (ids are unique), as an attacker with raw SQL would
    _as_attacker(
        store,
        *(f"UPDATE audit_events SET id = {i + 1} WHERE id = {i}" for i in range(last_id, 2, -1)),
    )
    with store.writer() as session:
        session.add(forged)
        session.commit()
    report = _verify(store)
    assert not report.ok
    assert "audit event 4" in (report.problem or "")
    assert "an event was inserted" in (report.problem or "") or "was edited" in (
        report.problem or ""
    )
