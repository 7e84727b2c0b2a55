"""Users and passwords; the audit queries' filters (bound parameters, both databases)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from db.engine import Store
from db.models import Measurement, ReviewStatus, Role, User
from db.queries import LogFilter, MeasurementFilter, audit_log_rows, measurement_rows
from db.review import review_measurement
from db.users import add_user, get_user, hash_password, verify_password
from ingestion.errors import StorageError
from ingestion.volume import Volume

from tests.support.db import first_measurement_id, make_result, store_one

CONTRACT = {
    "study_instance_uid",
    "patient_id",
    "finding_id",
    "kind",
    "name",
    "value_mm",
    "range_mm",
    "center_lps_mm",
    "model_version",
    "status",
    "reviewed_value_mm",
    "reviewer",
    "reviewed_at",
}


def test_passwords_are_hashed_with_a_salted_kdf() -> None:
    first, second = hash_password("correct horse"), hash_password("correct horse")
    assert first != second and first.startswith("scrypt$")
    assert "correct horse" not in first
    assert verify_password(first, "correct horse") and not verify_password(first, "wrong horse")
    assert not verify_password(None, "x") and not verify_password("garbage", "x")
    with pytest.raises(ValueError, match="at least 8"):
        hash_password("short")


def test_users_are_added_once_with_a_valid_role(store: Store) -> None:
    with store.writer() as session:
        user = add_user(session, "carol", "admin", password=None, actor="cli:test")
        session.commit()
    assert user.role is Role.ADMIN and user.password_hash is None
    with store.writer() as session:
        with pytest.raises(StorageError, match="exists already"):
            add_user(session, "carol", "reviewer", password=None, actor="cli:test")
        with pytest.raises(ValueError, match="use reviewer, auditor or admin"):
            add_user(session, "dave", "boss", password=None, actor="cli:test")
        with pytest.raises(ValueError, match="user name"):
            add_user(session, "drop table users;", "reviewer", password=None, actor="cli:test")
    with store.reader() as session:
        found = get_user(session, "carol")
        assert found is not None and found.role is Role.ADMIN
        assert session.execute(select(func.count()).select_from(User)).scalar_one() == 1


def _second_study(store: Store, volume: Volume, *, version: str) -> None:
    store_one(
        store,
        make_result(volume, version=version, values=(40.0, 22.0, 30.0)),
        volume,
        checkpoint="d" * 64,
        actor="cli:batch",
        started_at=datetime.now(UTC) - timedelta(days=10),
    )


def test_measurement_rows_follow_the_contract_and_filter(
    store: Store, stored: int, users: dict[str, User], volume: Volume
) -> None:
    _second_study(store, volume, version="0.9.0")
    with store.writer() as session:
        review_measurement(
            session,
            first_measurement_id(store),
            action="correct",
            value_mm=29.0,
            reason="edge",
            reviewer=users["alice"],
            seen_version=1,
        )
        session.commit()
    patient = volume.identifiers.patient_id
    with store.reader() as session:
        everything = measurement_rows(session, MeasurementFilter())
        assert len(everything) == 6 and set(everything[0]) >= CONTRACT
        old_first = everything[0]
        assert old_first["model_version"] == "0.9.0"  # ordered by time measured
        by_patient = measurement_rows(session, MeasurementFilter(patient_id=patient))
        assert len(by_patient) == 6
        assert measurement_rows(session, MeasurementFilter(patient_id="someone else")) == []
        recent = measurement_rows(
            session, MeasurementFilter(since=datetime.now(UTC) - timedelta(days=1))
        )
        assert {r["model_version"] for r in recent} == {"1.0.0"}
        older = measurement_rows(
            session, MeasurementFilter(until=datetime.now(UTC) - timedelta(days=1))
        )
        assert {r["model_version"] for r in older} == {"0.9.0"}
        corrected = measurement_rows(session, MeasurementFilter(status=ReviewStatus.CORRECTED))
        (row,) = corrected
        assert (row["reviewer"], row["reviewed_value_mm"], row["value_mm"]) == ("alice", 29.0, 30.0)
        assert measurement_rows(session, MeasurementFilter(reviewer="alice")) == corrected
        assert len(measurement_rows(session, MeasurementFilter(model_version="1.0.0"))) == 3
        study = volume.identifiers.study_instance_uid
        assert len(measurement_rows(session, MeasurementFilter(study_instance_uid=study))) == 6
        assert len(measurement_rows(session, MeasurementFilter(limit=2))) == 2


def test_filters_are_parameters_not_sql(store: Store, stored: int) -> None:
    hostile = "x' OR '1'='1"
    with store.reader() as session:
        assert measurement_rows(session, MeasurementFilter(patient_id=hostile)) == []
        assert measurement_rows(session, MeasurementFilter(model_version=hostile)) == []
        assert audit_log_rows(session, LogFilter(actor="'; DROP TABLE measurements; --")) == []
        assert session.execute(select(func.count()).select_from(Measurement)).scalar_one() == 3


def test_audit_log_rows_filter_by_actor_action_and_time(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    with store.reader() as session:
        everything = audit_log_rows(session, LogFilter())
        assert [e["id"] for e in everything] == list(range(1, len(everything) + 1))
        assert {e["actor"] for e in everything} == {"migration", "cli:test"}
        assert [e["action"] for e in everything if e["actor"] == "migration"] == ["schema.upgraded"]
        stored_events = audit_log_rows(session, LogFilter(action="run.stored"))
        assert len(stored_events) == 1 and stored_events[0]["object_type"] == "run"
        assert audit_log_rows(session, LogFilter(actor="alice")) == []
        later = audit_log_rows(session, LogFilter(since=datetime.now(UTC) + timedelta(hours=1)))
        assert later == []
        assert len(audit_log_rows(session, LogFilter(object_type="user"))) == 3
