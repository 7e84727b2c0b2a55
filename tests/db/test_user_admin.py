"""User administration in the store (issue 41, attack 2): disable, enable, roles, passwords,
unlocking; the last enabled admin stays; every change is an audit event the log covers; the
login back-off's state in the database. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from db.audit import verify
from db.engine import Store
from db.logins import LoginLimits, login_locks, login_state, record_failure, record_success
from db.models import AuditEvent, LoginFailure, Role, User
from db.users import (
    add_user,
    change_own_password,
    check_password,
    credential_stamp,
    get_user,
    reset_password,
    set_active,
    set_role,
    unlock_user,
    verify_password,
)
from ingestion.errors import StorageError

PASSWORD = "correct horse"
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


@pytest.fixture
def people(store: Store) -> Store:
    with store.writer() as session:
        add_user(session, "root", Role.ADMIN, password=PASSWORD, actor="cli:test")
        add_user(session, "alice", Role.REVIEWER, password=PASSWORD, actor="cli:test")
        add_user(session, "ida", Role.AUDITOR, password=PASSWORD, actor="cli:test")
        session.commit()
    return store


def _user(store: Store, name: str) -> User:
    with store.reader() as session:
        user = get_user(session, name)
        assert user is not None
        return user


def _actions(store: Store) -> list[tuple[str, str]]:
    with store.reader() as session:
        rows = session.execute(select(AuditEvent.actor, AuditEvent.action).order_by(AuditEvent.id))
        return [(row.actor, row.action) for row in rows]


def _intact(store: Store) -> bool:
    with store.reader() as session:
        return verify(session).ok


def test_disable_enable_role_and_passwords_are_audited_and_covered(people: Store) -> None:
    stamps = [credential_stamp(_user(people, "alice"))]
    with people.writer() as session:
        set_active(session, "alice", False, actor="root")
        session.commit()
    assert not _user(people, "alice").active
    stamps.append(credential_stamp(_user(people, "alice")))
    with people.writer() as session:
        set_active(session, "alice", True, actor="root")
        set_role(session, "alice", Role.AUDITOR, actor="root")
        session.commit()
    assert _user(people, "alice").role is Role.AUDITOR
    stamps.append(credential_stamp(_user(people, "alice")))
    with people.writer() as session:
        reset_password(session, "alice", "a new secret", actor="root")
        session.commit()
    alice = _user(people, "alice")
    assert alice.must_change_password and verify_password(alice.password_hash, "a new secret")
    stamps.append(credential_stamp(alice))
    with people.writer() as session:
        change_own_password(session, "alice", "a new secret", "her own choice")
        session.commit()
    alice = _user(people, "alice")
    assert not alice.must_change_password and verify_password(alice.password_hash, "her own choice")
    stamps.append(credential_stamp(alice))
    assert len(set(stamps)) == len(stamps)  # every change ends her sessions
    assert _actions(people)[-5:] == [
        ("root", "user.disabled"),
        ("root", "user.enabled"),
        ("root", "user.role_changed"),
        ("root", "user.password_reset"),
        ("alice", "user.password_changed"),
    ]
    assert _intact(people)
    # what the events record is what verify compares: a forced change undone by SQL shows
    with people.engine.begin() as connection:
        connection.execute(text("UPDATE users SET must_change_password = true WHERE name = 'ida'"))
    with people.reader() as session:
        report = verify(session)
    assert (report.table, report.field) == ("users", "must_change_password")


def test_no_password_is_stored_in_the_log(people: Store) -> None:
    with people.writer() as session:
        reset_password(session, "ida", "sesame sesame", actor="root")
        session.commit()
    with people.reader() as session:
        details = [str(e.details) for e in session.execute(select(AuditEvent)).scalars()]
    assert not [d for d in details if "sesame" in d or "correct horse" in d]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: set_active(s, "root", False, actor="root"),
            "last enabled admin: cannot disable",
        ),
        (
            lambda s: set_role(s, "root", "reviewer", actor="root"),
            "last enabled admin: cannot demote",
        ),
    ],
)
def test_the_last_enabled_admin_stays(people: Store, change: object, message: str) -> None:
    with people.writer() as session, pytest.raises(StorageError, match=message):
        change(session)  # type: ignore[operator]
    with people.writer() as session:
        set_role(session, "ida", Role.ADMIN, actor="root")
        change(session)  # type: ignore[operator]
        session.commit()
    # now ida is the last one
    with people.writer() as session, pytest.raises(StorageError, match="'ida' is the last"):
        set_active(session, "ida", False, actor="ida")


def test_a_disabled_admin_does_not_count(people: Store) -> None:
    with people.writer() as session:
        add_user(session, "old-admin", Role.ADMIN, password=PASSWORD, actor="cli:test")
        set_active(session, "old-admin", False, actor="root")
        session.commit()
    with people.writer() as session, pytest.raises(StorageError, match="last enabled admin"):
        set_active(session, "root", False, actor="root")


@pytest.mark.parametrize(
    ("name", "password", "message"),
    [
        ("alice", "short", "at least 8 characters"),
        ("alice", "x" * 1025, "at most 1024"),
        ("alice", "my name is Alice!", "must not contain the user name 'alice'"),
        ("alice", "ecila-backwards", "must not contain the user name"),
    ],
)
def test_passwords_have_rules(name: str, password: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_password(name, password)


def test_refused_changes_change_nothing(people: Store) -> None:
    with people.writer() as session:
        with pytest.raises(StorageError, match="no user 'nobody'"):
            set_active(session, "nobody", False, actor="root")
        with pytest.raises(ValueError, match="role 'superuser'"):
            set_role(session, "alice", "superuser", actor="root")
        with pytest.raises(ValueError, match="contain the user name"):
            reset_password(session, "alice", "alice1234", actor="root")
        with pytest.raises(StorageError, match="current password is wrong"):
            change_own_password(session, "alice", "not it at all", "a fine new one")
        with pytest.raises(ValueError, match="differ from the current"):
            change_own_password(session, "alice", PASSWORD, PASSWORD)
        session.rollback()
    assert verify_password(_user(people, "alice").password_hash, PASSWORD)
    assert [a for _, a in _actions(people)].count("user.added") == 3
    assert _intact(people)


def test_failed_logins_back_off_per_name_and_address(people: Store) -> None:
    limits = LoginLimits(free_failures=3, address_failures=0, name_failures=5, name_delay_s=2)
    with people.writer() as session:
        for k in range(3):
            lockouts = record_failure(
                session, "root", "10.6.6.6", limits, NOW + timedelta(seconds=k)
            )
        session.commit()
    assert [(lock.scope, lock.failures, lock.seconds) for lock in lockouts] == [("user", 3, 30.0)]
    with people.reader() as session:
        assert login_state(session, "root", "10.6.6.6", limits, NOW).locked_s == 32.0
        assert login_state(session, "root", "10.0.0.7", limits, NOW).locked_s == 0
        (lock,) = login_locks(session, limits, NOW)
    assert (lock.user, lock.address, lock.failures) == ("root", "10.6.6.6", 3)
    assert lock.until == NOW + timedelta(seconds=32)
    with people.writer() as session:
        for k in range(2):  # from a second address: the name is under attack now
            record_failure(session, "root", f"10.7.7.{k}", limits, NOW)
        session.commit()
    with people.reader() as session:
        assert login_state(session, "root", "10.0.0.7", limits, NOW).delay_s == 2
        assert login_state(session, "alice", "10.0.0.7", limits, NOW).delay_s == 0
    with people.writer() as session:
        record_success(session, "root", "10.6.6.6")
        session.commit()
    with people.reader() as session:
        assert login_state(session, "root", "10.6.6.6", limits, NOW).locked_s == 0


def test_unlock_forgets_failures_and_is_audited(people: Store) -> None:
    limits = LoginLimits(free_failures=2, address_failures=0)
    with people.writer() as session:
        for address in ("10.6.6.6", "10.6.6.6", "10.9.9.9", "10.9.9.9"):
            record_failure(session, "alice", address, limits, NOW)
        record_failure(session, "ghost", "10.6.6.6", limits, NOW)
        session.commit()
    with people.writer() as session:
        assert unlock_user(session, "alice", actor="root", address="10.6.6.6") == 2
        session.commit()
    with people.reader() as session:
        assert [(lock.user, lock.address) for lock in login_locks(session, limits, NOW)] == [
            ("alice", "10.9.9.9")
        ]
    with people.writer() as session:
        assert unlock_user(session, "alice", actor="root") == 2
        assert unlock_user(session, "ghost", actor="root") == 1  # an unknown name too
        session.commit()
    with people.reader() as session:
        assert login_locks(session, limits, NOW) == []
        names = session.execute(select(LoginFailure.user_name)).scalars().all()
        events = session.execute(
            select(AuditEvent).where(AuditEvent.action == "user.unlocked").order_by(AuditEvent.id)
        ).scalars()
        unlocked = [(e.actor, e.details["user"], e.details["address"]) for e in events]
    assert names == []
    assert unlocked == [
        ("root", "alice", "10.6.6.6"),
        ("root", "alice", None),
        ("root", "ghost", None),
    ]


def test_old_failures_are_forgotten(people: Store) -> None:
    limits = LoginLimits(free_failures=2, address_failures=0, memory_s=3600)
    with people.writer() as session:
        record_failure(session, "alice", "10.6.6.6", limits, NOW)
        record_failure(session, "alice", "10.6.6.6", limits, NOW + timedelta(hours=2))
        session.commit()
    with people.reader() as session:
        assert session.execute(select(LoginFailure)).scalars().all().__len__() == 1
        later = NOW + timedelta(hours=2)
        assert login_state(session, "alice", "10.6.6.6", limits, later).locked_s == 0


def test_a_faked_0003_cannot_undo_a_forced_password_change(people: Store) -> None:
    """Dropping users.must_change_password and setting the version back: refused."""
    from db.migrate import upgrade
    from ingestion.errors import MigrationRefusedError

    with people.writer() as session:
        reset_password(session, "alice", "a new secret", actor="root")
        session.commit()
    with people.engine.begin() as connection:
        connection.execute(text("ALTER TABLE users DROP COLUMN must_change_password"))
        connection.execute(text("UPDATE alembic_version SET version_num = '0003'"))
    people.dispose()
    with pytest.raises(MigrationRefusedError, match="field must_change_password"):
        upgrade(people.url)


def test_a_recorded_downgrade_below_0004_keeps_the_log_intact(people: Store) -> None:
    """The forced change a downgrade drops is recorded as gone; the upgrade again verifies."""
    from db.migrate import downgrade, upgrade

    with people.writer() as session:
        reset_password(session, "alice", "a new secret", actor="root")
        session.commit()
    alice_id = str(_user(people, "alice").id)
    people.dispose()
    downgrade(people.url, "0003", actor="cli:admin")
    with people.reader() as session:
        assert verify(session).ok  # at 0003: alice's flag is recorded as gone
        last = session.execute(select(AuditEvent).order_by(AuditEvent.id.desc())).scalars()
        downgraded, dropped = list(last)[:2]
        assert (downgraded.action, dropped.action) == ("schema.downgraded", "schema.data_dropped")
        assert list(dropped.details["rows"]["users"]) == [alice_id]
        assert dropped.details["rows"]["users"][alice_id]["must_change_password"] is False
    people.dispose()
    upgrade(people.url, actor="cli:admin")
    assert not _user(people, "alice").must_change_password
    assert _intact(people)
