"""Logging in resists guessing: failed logins lock a user name or an address for a while (one
audit event per lock), and an unknown user is answered as slowly as a known one."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.settings import Settings
from app.ui.context import UiContext
from app.ui.server import create_app
from app.ui.sessions import COOKIE
from app.ui.throttle import LoginLimits, LoginThrottle
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import AuditEvent, Role
from db.users import add_user

pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)

PASSWORD = "correct horse"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'ui.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    with store.writer() as session:
        add_user(session, "alice", Role.REVIEWER, password=PASSWORD, actor="test")
        add_user(session, "bob", Role.REVIEWER, password=PASSWORD, actor="test")
        add_user(session, "carol", Role.REVIEWER, password=None, actor="test")
        session.commit()
    yield store
    store.dispose()


def _app(store: Store, tmp_path: Path, limits: LoginLimits | None = None) -> FastAPI:
    context = UiContext(
        store=store,
        model_dir=None,
        nifti_modality=None,
        upload_dir=tmp_path / "uploads",
        temp_dir=tmp_path / "ui-temp",
    )
    return create_app(context, login_limits=limits)


def _log_in(client: TestClient, user: str, password: str) -> str:
    """Where the login sends the browser."""
    answer = client.post("/login", data={"username": user, "password": password})
    assert answer.status_code == 303
    return str(answer.headers["location"])


def _events(store: Store, action: str) -> list[AuditEvent]:
    with store.reader() as session:
        query = select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id)
        return list(session.execute(query).scalars())


def test_twenty_wrong_passwords_lock_the_account(store: Store, tmp_path: Path) -> None:
    with TestClient(_app(store, tmp_path), follow_redirects=False) as client:
        answers = [_log_in(client, "alice", f"guess {k:02d}") for k in range(20)]
        assert answers[-1].startswith("/login?error=locked")
        assert answers[0] == "/login?error=wrong"
        # the right password is refused too, with the same message: nothing tells it was right
        assert _log_in(client, "alice", PASSWORD) == answers[-1]
        assert client.cookies.get(COOKIE) is None
        page = client.get(answers[-1]).text
        assert "Too many failed logins" in page and "15 more minute(s)" in page
        # another user is not affected (20 failures from this address: under its limit, 30)
        assert _log_in(client, "bob", PASSWORD) == "/app/"
    locked = _events(store, "login.locked")
    assert len(locked) == 1  # one event per lock, not one per refused attempt
    assert locked[0].actor == "alice"
    assert locked[0].details["scope"] == "user" and locked[0].details["failures"] == 10
    assert locked[0].details["locked_minutes"] == 15
    refused = [e for e in _events(store, "login.refused") if e.actor == "alice"]
    assert len(refused) == 10  # attempts during the lock are not written, the lock is


def test_an_address_guessing_many_names_is_locked(store: Store, tmp_path: Path) -> None:
    limits = LoginLimits(user_failures=10, address_failures=5)
    with TestClient(_app(store, tmp_path, limits), follow_redirects=False) as client:
        for name in ("nobody", "root", "admin", "alice", "ghost"):  # one guess each
            _log_in(client, name, "password1")
        # the address is locked now, for every name, the right password too
        assert _log_in(client, "bob", PASSWORD).startswith("/login?error=locked")
    (locked,) = _events(store, "login.locked")
    assert locked.details["scope"] == "address" and locked.details["address"] == "testclient"


def test_a_lock_ends_after_its_window() -> None:
    now = [1000.0]
    throttle = LoginThrottle(
        LoginLimits(user_failures=3, address_failures=0, window_s=60, lockout_s=300),
        clock=lambda: now[0],
    )
    assert throttle.failed("alice", "10.0.0.1") == []
    now[0] += 61  # the first failure has left the window
    assert throttle.failed("alice", "10.0.0.1") == []
    assert throttle.failed("alice", "10.0.0.1") == []
    assert throttle.locked_for("alice", "10.0.0.2") == 0
    (lockout,) = throttle.failed("alice", "10.0.0.1")
    assert (lockout.scope, lockout.key, lockout.failures) == ("user", "alice", 3)
    assert throttle.locked_for("alice", "10.0.0.2") == 300  # wherever she logs in from
    assert throttle.locked_for("bob", "10.0.0.1") == 0  # address limit 0: none
    now[0] += 299
    assert throttle.locked_for("alice", "10.0.0.1") == pytest.approx(1)
    now[0] += 1
    assert throttle.locked_for("alice", "10.0.0.1") == 0
    throttle.failed("alice", "10.0.0.1")
    throttle.succeeded("alice")  # a good login forgets her failures
    assert throttle.failed("alice", "10.0.0.1") == [] and throttle.failed("alice", "x") == []


def test_the_throttle_forgets_old_names_first() -> None:
    now = [0.0]
    throttle = LoginThrottle(
        LoginLimits(user_failures=2, address_failures=0, window_s=10, lockout_s=100),
        clock=lambda: now[0],
        max_keys=3,
    )
    throttle.failed("locked", "a")
    throttle.failed("locked", "a")
    for k in range(10):  # a flood of made-up names
        throttle.failed(f"name{k}", "a")
        now[0] += 1
    assert throttle.locked_for("locked", "a") > 0  # a lock is never forgotten early
    assert len(throttle._users.entries) <= 3


def test_limits_are_settings() -> None:
    limits = Settings(login_max_failures=20, login_lockout_minutes=60).login_limits
    assert (limits.user_failures, limits.address_failures) == (20, 30)
    assert (limits.window_s, limits.lockout_s) == (900.0, 3600.0)
    with pytest.raises(ValueError, match="user_failures"):
        LoginLimits(user_failures=-1)


def test_unknown_users_answer_as_slowly_as_known_ones(store: Store, tmp_path: Path) -> None:
    """Median of 50 wrong logins each, interleaved, in turns of alternating order (a loaded
    machine slows both alike; the second of two requests in a row tends to be slower)."""
    no_limit = LoginLimits(user_failures=0, address_failures=0)
    kinds = [("known", "alice"), ("unknown", "mallory")]
    times: dict[str, list[float]] = {kind: [] for kind, _ in kinds}
    with TestClient(_app(store, tmp_path, no_limit), follow_redirects=False) as client:
        for k in range(51):
            for kind, name in kinds if k % 2 else kinds[::-1]:
                started = time.perf_counter()
                answer = client.post("/login", data={"username": name, "password": f"w{k:05d}"})
                if k:  # the first round warms up
                    times[kind].append(time.perf_counter() - started)
                assert answer.headers["location"].startswith("/login?error=")
    known, unknown = (statistics.median(times[kind]) for kind, _ in kinds)
    assert abs(unknown - known) <= 0.1 * known, (unknown, known)


def test_a_user_without_a_password_costs_a_password_check(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """carol has no password: her login is refused after the same scrypt work as alice's."""
    import db.users

    checked: list[str] = []
    scrypt = db.users._scrypt_matches

    def counting(stored: str, password: str) -> bool | None:
        checked.append(stored)
        return scrypt(stored, password)

    with TestClient(_app(store, tmp_path), follow_redirects=False) as client:
        monkeypatch.setattr(db.users, "_scrypt_matches", counting)
        for name in ("alice", "carol", "mallory"):
            assert _log_in(client, name, "wrong one") == "/login?error=wrong"
    assert len(checked) == 3  # one scrypt check each: alice's hash, then the dummy twice
    assert checked[1] == checked[2] != checked[0]
