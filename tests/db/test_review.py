"""Reviews: accept / correct / reject with their rules, roles, and optimistic locking between
real concurrent sessions on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select

from db.audit import verify
from db.engine import Store
from db.models import AuditEvent, Measurement, Review, ReviewAction, ReviewStatus, User
from db.review import review_measurement
from ingestion.errors import AccessDeniedError, StaleEditError

from db_helpers import first_measurement_id


def _review(store: Store, user: User, seen: int, **kwargs: object) -> Measurement:
    mid = first_measurement_id(store)
    with store.writer() as session:
        out = review_measurement(session, mid, reviewer=user, seen_version=seen, **kwargs)  # type: ignore[arg-type]
        session.commit()
    return out


def test_accept_correct_reject(store: Store, stored: int, users: dict[str, User]) -> None:
    accepted = _review(store, users["alice"], 1, action=ReviewAction.ACCEPT)
    assert (accepted.status, accepted.version, accepted.reviewer_id) == (
        ReviewStatus.ACCEPTED,
        2,
        users["alice"].id,
    )
    corrected = _review(
        store, users["bob"], 2, action="correct", value_mm=31.5, reason="edge was blurred"
    )
    assert corrected.status is ReviewStatus.CORRECTED and corrected.reviewed_value_mm == 31.5
    assert corrected.value_mm == 30.0  # what the model said is kept
    rejected = _review(store, users["alice"], 3, action="reject", reason="not a lesion")
    assert rejected.status is ReviewStatus.REJECTED and rejected.reviewed_value_mm is None
    with store.reader() as session:
        reviews = session.execute(select(Review).order_by(Review.id)).scalars().all()
        assert [(r.action, r.reviewer_id) for r in reviews] == [
            (ReviewAction.ACCEPT, users["alice"].id),
            (ReviewAction.CORRECT, users["bob"].id),
            (ReviewAction.REJECT, users["alice"].id),
        ]
        actors = session.execute(
            select(AuditEvent.actor, AuditEvent.action).where(AuditEvent.action.like("review.%"))
        ).all()
        assert [tuple(a) for a in actors] == [
            ("alice", "review.accept"),
            ("bob", "review.correct"),
            ("alice", "review.reject"),
        ]
        assert verify(session).ok


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action": "correct", "reason": "x"}, "needs a value"),
        ({"action": "correct", "value_mm": 12.0}, "needs a reason"),
        ({"action": "correct", "value_mm": -1.0, "reason": "x"}, "needs a value"),
        ({"action": "reject"}, "needs a reason"),
        ({"action": "accept", "value_mm": 3.0}, "only a correction"),
    ],
)
def test_incomplete_reviews_are_refused(
    store: Store, stored: int, users: dict[str, User], kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _review(store, users["alice"], 1, **kwargs)


def test_an_auditor_cannot_change_a_measurement(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    with pytest.raises(AccessDeniedError, match=r"ida.*auditor.*may not change"):
        _review(store, users["ida"], 1, action="accept")
    with store.reader() as session:
        assert session.execute(select(func.count()).select_from(Review)).scalar_one() == 0


def test_a_stale_edit_is_refused_and_nothing_is_lost(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    _review(store, users["alice"], 1, action="correct", value_mm=29.0, reason="first")
    with pytest.raises(StaleEditError, match=r"changed by alice .* you saw 1.*not saved"):
        _review(store, users["bob"], 1, action="correct", value_mm=35.0, reason="second")
    with store.reader() as session:
        row = session.get(Measurement, first_measurement_id(store))
        assert row is not None and row.reviewed_value_mm == 29.0 and row.version == 2
        assert session.execute(select(func.count()).select_from(Review)).scalar_one() == 1


def test_concurrent_reviewers_one_wins_the_other_is_told(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    """Two sessions open transactions at the same moment on the same measurement, as two
    browsers would; exactly one edit is stored and the other gets StaleEditError."""
    mid = first_measurement_id(store)
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def reviewer(name: str, value: float) -> None:
        with store.writer() as session:
            try:
                barrier.wait()
                review_measurement(
                    session,
                    mid,
                    action="correct",
                    value_mm=value,
                    reason=f"by {name}",
                    reviewer=users[name],
                    seen_version=1,
                )
                session.commit()
                outcomes[name] = "saved"
            except StaleEditError as error:
                session.rollback()
                outcomes[name] = error

    threads = [
        threading.Thread(target=reviewer, args=("alice", 28.0)),
        threading.Thread(target=reviewer, args=("bob", 33.0)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(str(type(v).__name__) for v in outcomes.values()) == ["StaleEditError", "str"]
    winner = next(name for name, v in outcomes.items() if v == "saved")
    with store.reader() as session:
        row = session.get(Measurement, mid)
        assert row is not None and row.version == 2
        assert row.reviewed_value_mm == {"alice": 28.0, "bob": 33.0}[winner]
        assert session.execute(select(func.count()).select_from(Review)).scalar_one() == 1
        assert verify(session).ok


def test_concurrent_writers_keep_one_chain(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    """Eight threads review different measurements at once: every event lands, in one chain."""
    with store.reader() as session:
        ids = session.execute(select(Measurement.id).order_by(Measurement.id)).scalars().all()
    barrier = threading.Barrier(len(ids))
    errors: list[BaseException] = []

    def accept(mid: int) -> None:
        try:
            with store.writer() as session:
                barrier.wait()
                review_measurement(
                    session, mid, action="accept", reviewer=users["alice"], seen_version=1
                )
                session.commit()
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=accept, args=(mid,)) for mid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    with store.reader() as session:
        report = verify(session)
        assert report.ok, report.problem
        accepted = session.execute(
            select(func.count())
            .select_from(Measurement)
            .where(Measurement.status == ReviewStatus.ACCEPTED)
        ).scalar_one()
        assert accepted == len(ids)
