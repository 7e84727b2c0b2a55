"""Reviews: accept / correct / reject with their rules, roles, and optimistic locking between
real concurrent sessions on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import threading

import pytest
from sqlalchemy import func, select

from db.audit import verify
from db.engine import Store
from db.models import AuditEvent, Measurement, Review, ReviewAction, ReviewStatus, User
from db.review import CorrectionLimits, review_measurement
from ingestion.errors import AccessDeniedError, StaleEditError

from tests.support.db import first_measurement_id


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
        ({"action": "correct", "value_mm": -1.0, "reason": "x"}, "not a plausible long axis"),
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


def _measurement_id(store: Store, name: str) -> int:
    with store.reader() as session:
        return int(
            session.execute(select(Measurement.id).where(Measurement.name == name)).scalar_one()
        )


def _counts(store: Store) -> tuple[int, int]:
    with store.reader() as session:
        return (
            session.execute(select(func.count()).select_from(Review)).scalar_one(),
            session.execute(select(func.count()).select_from(AuditEvent)).scalar_one(),
        )


@pytest.mark.parametrize(
    ("name", "value", "shown", "limit"),
    [
        ("long_axis", 1e308, "1e+308 mm", "500 mm"),
        ("long_axis", 0.0, "0 mm", "500 mm"),
        ("long_axis", 1e-320, "9.99989e-321 mm", "500 mm"),  # a denormal: it showed as 0.0
        ("short_axis", 0.09, "0.09 mm", "500 mm"),
        ("short_axis", -1.0, "-1 mm", "500 mm"),
        ("short_axis", math.nan, "nan mm", "500 mm"),
        ("long_axis", math.inf, "inf mm", "500 mm"),
        ("long_axis", 500.5, "500.5 mm", "500 mm"),
        ("diameter", 100.01, "100.01 mm", "100 mm"),
    ],
)
def test_implausible_corrections_are_refused_and_nothing_is_written(
    store: Store,
    stored: int,
    users: dict[str, User],
    name: str,
    value: float,
    shown: str,
    limit: str,
) -> None:
    mid = _measurement_id(store, name)
    before = _counts(store)
    label = name.replace("_", " ")
    with store.writer() as session, pytest.raises(ValueError) as refused:
        review_measurement(
            session, mid, action="correct", value_mm=value, reason="typo", reviewer=users["alice"],
            seen_version=1,
        )  # fmt: skip
    message = str(refused.value)
    assert message.startswith(f"correction refused: {shown} is not a plausible {label}")
    assert f"at most {limit}" in message and f"RADCALIPER_MAX_{name.upper()}_MM" in message
    assert _counts(store) == before
    with store.reader() as session:
        row = session.get(Measurement, mid)
        assert row is not None and row.version == 1 and row.status is ReviewStatus.PENDING
        assert row.reviewed_value_mm is None
        assert verify(session).ok


def test_plausible_corrections_at_the_limits(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    """The limits are inclusive, and configurable: 120 mm is a diameter once the site allows it."""
    cases = [("long_axis", 500.0, None), ("short_axis", 0.1, None), ("diameter", 120.0, 150.0)]
    for name, value, diameter_limit in cases:
        mid = _measurement_id(store, name)
        limits = None if diameter_limit is None else CorrectionLimits(diameter_mm=diameter_limit)
        with store.writer() as session:
            row = review_measurement(
                session, mid, action="correct", value_mm=value, reason="measured again",
                reviewer=users["bob"], seen_version=1, limits=limits,
            )  # fmt: skip
            session.commit()
        assert row.reviewed_value_mm == value and row.status is ReviewStatus.CORRECTED
    with store.reader() as session:
        assert verify(session).ok


def test_the_default_diameter_limit_refuses_what_a_site_may_allow(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    mid = _measurement_id(store, "diameter")
    with store.writer() as session, pytest.raises(ValueError, match=r"120 mm .* at most 100 mm"):
        review_measurement(
            session, mid, action="correct", value_mm=120.0, reason="aneurysm",
            reviewer=users["bob"], seen_version=1,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"diameter_mm": 0.0}, "diameter_mm must be a number of mm > 0 and at most 10000, got 0.0"),
        ({"long_axis_mm": math.inf}, "long_axis_mm must be a number of mm > 0 and at most 10000"),
        ({"long_axis_mm": 1e308}, "at most 10000, got 1e[+]308"),
        ({"short_axis_mm": "500"}, "short_axis_mm must be a number of mm, got '500'"),
    ],
)
def test_limits_are_checked_when_made(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CorrectionLimits(**kwargs)
