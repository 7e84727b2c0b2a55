"""Logging in resists guessing without letting anyone lock an account: failed logins back off
a name from one address, or an address (one audit event per lock); a name under attack from
elsewhere is slowed, never locked; an unknown user is answered as slowly as a known one."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.settings import Settings
from app.ui.context import UiContext
from app.ui.server import create_app
from app.ui.sessions import COOKIE
from db.engine import Store
from db.logins import LoginLimits
from db.models import AuditEvent, Role
from db.users import add_user

from tests.support.ui import users_store

pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)

PASSWORD = "correct horse"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = users_store(
        tmp_path / "ui.sqlite3",
        [
            ("alice", Role.REVIEWER, PASSWORD),
            ("bob", Role.REVIEWER, PASSWORD),
            ("carol", Role.REVIEWER, None),
        ],
    )
    yield store
    store.dispose()


def _app(
    store: Store,
    tmp_path: Path,
    limits: LoginLimits | None = None,
    *,
    clock: Callable[[], datetime] | None = None,
    trusted_proxies: list[str] | None = None,
) -> FastAPI:
    context = UiContext(
        store=store,
        model_dir=None,
        nifti_modality=None,
        upload_dir=tmp_path / "uploads",
        temp_dir=tmp_path / "ui-temp",
    )
    extra: dict[str, Any] = {} if clock is None else {"clock": clock}
    return create_app(context, login_limits=limits, trusted_proxies=trusted_proxies or [], **extra)


def _log_in(client: TestClient, user: str, password: str) -> str:
    """Where the login sends the browser."""
    answer = client.post("/login", data={"username": user, "password": password})
    assert answer.status_code == 303
    return str(answer.headers["location"])


def _events(store: Store, action: str) -> list[AuditEvent]:
    with store.reader() as session:
        query = select(AuditEvent).where(AuditEvent.action == action).order_by(AuditEvent.id)
        return list(session.execute(query).scalars())


class Clock:
    """The server's clock for failed logins, moved by the test."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


FAST = LoginLimits(
    free_failures=5, address_failures=30, name_failures=10, first_lock_s=30, max_lock_s=900,
    window_s=900, name_delay_s=0.0,
)  # fmt: skip


def _client(app: FastAPI, address: str) -> TestClient:
    return TestClient(app, follow_redirects=False, client=(address, 40000))


def test_wrong_passwords_lock_the_name_from_that_address_only(store: Store, tmp_path: Path) -> None:
    clock = Clock()
    app = _app(store, tmp_path, FAST, clock=clock)
    with _client(app, "10.0.0.66") as attacker:
        answers = [_log_in(attacker, "alice", f"guess {k:02d}") for k in range(5)]
        assert answers[:4] == ["/login?error=wrong"] * 4
        assert answers[4].startswith("/login?error=locked")
        # the right password is refused too, with the same message: nothing tells it was right
        assert _log_in(attacker, "alice", PASSWORD) == answers[4]
        assert attacker.cookies.get(COOKIE) is None
        page = attacker.get(answers[4]).text
        assert "Too many failed logins" in page and "1 more minute(s)" in page
        # the attacker's address is not locked for other names (5 failures: under its 30)
        assert _log_in(attacker, "bob", PASSWORD) == "/app/"
    # alice herself, from her own address, gets in at once: nobody can lock her out
    assert _log_in(_client(app, "10.0.0.7"), "alice", PASSWORD) == "/app/"
    (locked,) = _events(store, "login.locked")  # one event per lock, not per refused attempt
    assert locked.actor == "alice"
    assert (locked.details["scope"], locked.details["address"]) == ("user", "10.0.0.66")
    assert (locked.details["failures"], locked.details["locked_seconds"]) == (5, 30)
    refused = [e for e in _events(store, "login.refused") if e.actor == "alice"]
    assert len(refused) == 5  # attempts during the lock are not written, the lock is


def test_each_further_failure_doubles_the_lock_up_to_the_longest(
    store: Store, tmp_path: Path
) -> None:
    clock = Clock()
    limits = LoginLimits(free_failures=2, address_failures=0, first_lock_s=30, max_lock_s=100)
    with _client(_app(store, tmp_path, limits, clock=clock), "10.0.0.66") as client:
        assert _log_in(client, "alice", "guess 1") == "/login?error=wrong"
        assert _log_in(client, "alice", "guess 2").startswith("/login?error=locked")
        for seconds in (30, 60, 100, 100):  # doubled, then capped
            clock.advance(seconds - 1)
            assert _log_in(client, "alice", PASSWORD).startswith("/login?error=locked")
            clock.advance(1)
            assert _log_in(client, "alice", "guess again").startswith("/login?error=locked")
        clock.advance(100)
        assert _log_in(client, "alice", PASSWORD) == "/app/"  # and her failures are forgotten
        assert _log_in(client, "alice", "one slip") == "/login?error=wrong"
    seconds = [e.details["locked_seconds"] for e in _events(store, "login.locked")]
    assert seconds == [30, 60, 100, 100, 100]


def test_an_address_guessing_many_names_is_locked(store: Store, tmp_path: Path) -> None:
    limits = LoginLimits(free_failures=10, address_failures=5)
    with _client(_app(store, tmp_path, limits, clock=Clock()), "10.0.0.66") as client:
        for name in ("nobody", "root", "admin", "alice", "ghost"):  # one guess each
            _log_in(client, name, "password1")
        # the address is locked now, for every name, the right password too
        assert _log_in(client, "bob", PASSWORD).startswith("/login?error=locked")
    (locked,) = _events(store, "login.locked")
    assert locked.details["scope"] == "address" and locked.details["address"] == "10.0.0.66"


def test_an_account_under_continuous_attack_is_usable_from_another_address(
    store: Store, tmp_path: Path
) -> None:
    """Shortened timings: an attacker guesses an admin's password from one address without
    pause; the admin logs in from another address within a minute (here: within seconds,
    slowed by the name's delay), and the attacker is still refused."""
    with store.writer() as session:
        add_user(session, "root-admin", Role.ADMIN, password=PASSWORD, actor="test")
        session.commit()
    limits = LoginLimits(
        free_failures=3, address_failures=0, name_failures=3, first_lock_s=0.2,
        max_lock_s=1.0, window_s=60, name_delay_s=0.3,
    )  # fmt: skip
    app = _app(store, tmp_path, limits)
    stop = threading.Event()
    tries = [0]

    def attack() -> None:
        with _client(app, "10.6.6.6") as attacker:
            while not stop.is_set():
                _log_in(attacker, "root-admin", f"guess {tries[0]}")
                tries[0] += 1

    attacker = threading.Thread(target=attack)
    attacker.start()
    try:
        time.sleep(2.0)  # the name is under attack, its lock from 10.6.6.6 at the longest
        started = time.monotonic()
        owner = _client(app, "192.168.1.20")
        assert _log_in(owner, "root-admin", PASSWORD) == "/app/"
        took = time.monotonic() - started
        assert owner.get("/app/", headers={"accept": "text/html"}).status_code == 200
    finally:
        stop.set()
        attacker.join()
    assert took < 60.0 and took >= 0.3  # slowed by the name's delay, never locked
    assert tries[0] > 10
    locked = [e.details for e in _events(store, "login.locked")]
    assert locked and {d["address"] for d in locked} == {"10.6.6.6"}  # the attacker's only


def test_x_forwarded_for_counts_only_from_trusted_proxies(store: Store, tmp_path: Path) -> None:
    """A client cannot choose the address its failures are counted against (and lock someone
    else's), unless it is a configured proxy."""
    limits = LoginLimits(free_failures=2, address_failures=0)
    spoof = {"x-forwarded-for": "192.168.1.20"}
    with _client(_app(store, tmp_path, limits, clock=Clock()), "10.6.6.6") as client:
        for k in range(2):
            client.post("/login", data={"username": "alice", "password": f"w{k}"}, headers=spoof)
    (locked,) = _events(store, "login.locked")
    assert locked.details["address"] == "10.6.6.6"
    proxied = _app(store, tmp_path, limits, clock=Clock(), trusted_proxies=["10.0.0.1"])
    with _client(proxied, "10.0.0.1") as proxy:
        for k in range(2):
            headers = {"x-forwarded-for": "6.6.6.6, 172.16.0.9"}  # the proxy appended the last
            proxy.post("/login", data={"username": "bob", "password": f"w{k}"}, headers=headers)
    assert _events(store, "login.locked")[-1].details["address"] == "172.16.0.9"


def test_limits_are_settings() -> None:
    limits = Settings(login_max_failures=20, login_lockout_minutes=60).login_limits
    assert (limits.free_failures, limits.address_failures, limits.name_failures) == (20, 30, 10)
    assert (limits.window_s, limits.max_lock_s, limits.first_lock_s) == (900.0, 3600.0, 30.0)
    with pytest.raises(ValueError, match="free_failures"):
        LoginLimits(free_failures=-1)
    with pytest.raises(ValueError, match="name_delay_s"):
        LoginLimits(name_delay_s=float("inf"))
    with pytest.raises(ValueError, match="shorter than first_lock_s"):
        LoginLimits(first_lock_s=60, max_lock_s=30)


def test_unknown_users_answer_as_slowly_as_known_ones(store: Store, tmp_path: Path) -> None:
    """Median of 50 wrong logins each, interleaved, in turns of alternating order (a loaded
    machine slows both alike; the second of two requests in a row tends to be slower)."""
    no_limit = LoginLimits(free_failures=0, address_failures=0, name_failures=0)
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
