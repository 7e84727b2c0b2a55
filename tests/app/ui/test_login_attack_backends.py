"""A known account under a continuous wrong-password attack from one address can still be used
by its owner from another address within a minute (issue 41, attack 2; shortened timings), on
SQLite and PostgreSQL: the back-off's failures live in the store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.ui.context import UiContext
from app.ui.server import create_app
from db.engine import Store
from db.logins import LoginLimits
from db.models import AuditEvent, LoginFailure, Role
from db.users import add_user

pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)

PASSWORD = "correct horse"


def _log_in(client: TestClient, user: str, password: str) -> str:
    answer = client.post("/login", data={"username": user, "password": password})
    assert answer.status_code == 303
    return str(answer.headers["location"])


def test_the_owner_gets_in_from_another_address_during_an_attack(
    store: Store, tmp_path: Path
) -> None:
    with store.writer() as session:
        add_user(session, "root", Role.ADMIN, password=PASSWORD, actor="cli:test")
        session.commit()
    context = UiContext(
        store=store, model_dir=None, nifti_modality=None, upload_dir=tmp_path / "uploads",
        temp_dir=tmp_path / "ui-temp",
    )  # fmt: skip
    limits = LoginLimits(
        free_failures=3, address_failures=0, name_failures=3, first_lock_s=0.2,
        max_lock_s=1.0, window_s=60, name_delay_s=0.3,
    )  # fmt: skip
    app = create_app(context, login_limits=limits)
    stop = threading.Event()
    tries = [0]

    def attack() -> None:
        with TestClient(app, follow_redirects=False, client=("10.6.6.6", 1)) as attacker:
            while not stop.is_set():
                _log_in(attacker, "root", f"guess {tries[0]}")
                tries[0] += 1

    thread = threading.Thread(target=attack)
    thread.start()
    try:
        time.sleep(2.0)
        started = time.monotonic()
        owner = TestClient(app, follow_redirects=False, client=("192.168.1.20", 1))
        assert _log_in(owner, "root", PASSWORD) == "/app/"
        took = time.monotonic() - started
    finally:
        stop.set()
        thread.join()
    assert 0.3 <= took < 60.0 and tries[0] > 10
    with store.reader() as session:
        counted = session.execute(select(func.count()).select_from(LoginFailure)).scalar_one()
        locks = session.execute(
            select(func.count()).where(AuditEvent.action == "login.locked")
        ).scalar_one()
    # the attacker's address was locked (for it only), and the attempts during a lock were
    # not counted: far fewer failures than tries
    assert 3 <= counted < tries[0] and locks >= 1
