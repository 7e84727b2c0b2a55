"""User administration in the review UI and its sessions (issue 41, attack 2, and the UI's
low ones): a change of a user ends their open sessions at their next request, wherever it was
made; a password an administrator set must be changed first; the admin page for admins only;
logging out is a POST; nobody downloads an uploaded study through Gradio's file route."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.ui.context import UiContext
from app.ui.server import create_app
from app.ui.sessions import COOKIE
from db.engine import Store
from db.logins import LoginLimits
from db.models import AuditEvent, Role, User
from db.users import reset_password, set_active, set_role

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
            ("root", Role.ADMIN, PASSWORD),
            ("alice", Role.REVIEWER, PASSWORD),
            ("ida", Role.AUDITOR, PASSWORD),
        ],
    )
    yield store
    store.dispose()


@pytest.fixture
def app(store: Store, tmp_path: Path) -> FastAPI:
    context = UiContext(
        store=store,
        model_dir=None,
        nifti_modality=None,
        upload_dir=tmp_path / "uploads",
        temp_dir=tmp_path / "ui-temp",
    )
    limits = LoginLimits(free_failures=3, address_failures=0, name_delay_s=0)
    return create_app(context, login_limits=limits)


def _client(app: FastAPI, address: str = "10.0.0.1") -> TestClient:
    return TestClient(app, follow_redirects=False, client=(address, 40000))


def _log_in(client: TestClient, user: str, password: str = PASSWORD) -> str:
    answer = client.post("/login", data={"username": user, "password": password})
    assert answer.status_code == 303
    return str(answer.headers["location"])


def _page(client: TestClient, path: str = "/app/") -> int:
    return client.get(path, headers={"accept": "text/html"}).status_code


def _call(client: TestClient, api: str, data: list[Any]) -> tuple[bool, Any]:
    """A Gradio endpoint as the page calls it: (completed, outputs or the error's text)."""
    body = {"data": data, "session_hash": f"page-{id(client)}"}  # one page per client
    started = client.post(f"/app/gradio_api/call/{api}", json=body)
    assert started.status_code == 200, started.text
    stream = client.get(f"/app/gradio_api/call/{api}/{started.json()['event_id']}").text
    last = [line for line in stream.splitlines() if line.startswith("data:")][-1]
    return "event: complete" in stream, json.loads(last[len("data:") :])


def _said(outputs: Any) -> str:
    """The admin page's status line as it reads (Markdown escapes removed)."""
    return str(outputs[2]).replace("\\", "")


@pytest.mark.parametrize(
    "change",
    [
        lambda s: set_active(s, "alice", False, actor="cli:root"),
        lambda s: set_role(s, "alice", Role.AUDITOR, actor="cli:root"),
        lambda s: reset_password(s, "alice", "a new secret", actor="cli:root"),
    ],
    ids=["disabled", "role", "password"],
)
def test_a_change_made_elsewhere_ends_the_session_at_its_next_request(
    app: FastAPI, store: Store, change: Any
) -> None:
    """As ``radcaliper users disable|role|passwd`` does it: in another process, on the store."""
    with _client(app) as client:
        assert _log_in(client, "alice") == "/app/"
        assert _page(client) == 200
        with store.writer() as session:
            change(session)
            session.commit()
        assert client.get("/app/gradio_api/info").status_code == 401
        assert _page(client) == 401  # and it stays ended


def test_a_password_an_admin_set_must_be_changed_first(app: FastAPI, store: Store) -> None:
    with store.writer() as session:
        reset_password(session, "alice", "temporary pass", actor="cli:root")
        session.commit()
    with _client(app) as client:
        assert _log_in(client, "alice", "temporary pass") == "/password?error=must"
        assert "choose a new one" in client.get("/password?error=must").text
        # nothing under /app but the way to the change page
        page = client.get("/app/", headers={"accept": "text/html"})
        assert page.status_code == 303 and page.headers["location"] == "/password"
        assert client.post("/app/gradio_api/call/worklist", json={"data": []}).status_code == 403

        def change(current: str, new: str, repeat: str | None = None) -> str:
            form = {"current": current, "new": new, "repeat": new if repeat is None else repeat}
            return str(client.post("/password", data=form).headers["location"])

        assert change("temporary pass", "a fine secret", "another") == "/password?error=repeat"
        assert change("not it", "a fine secret") == "/password?error=current"
        refused = change("temporary pass", "alice rules ok")
        assert refused.startswith("/password?error=") and "user%20name" in refused
        assert "must not contain the user name" in client.get(refused).text
        assert change("temporary pass", "a fine secret") == "/app/"
        assert _page(client) == 200  # a fresh session with the new password
    with _client(app) as again:
        assert _log_in(again, "alice", "a fine secret") == "/app/"
    with store.reader() as session:
        actions = session.execute(
            select(AuditEvent.action).where(AuditEvent.actor == "alice").order_by(AuditEvent.id)
        ).scalars()
        assert "user.password_changed" in list(actions)


def test_a_wrong_current_password_counts_as_a_failed_login(app: FastAPI) -> None:
    with _client(app) as client:
        assert _log_in(client, "alice") == "/app/"
        form = {"current": "guess", "new": "a fine secret", "repeat": "a fine secret"}
        answers = [client.post("/password", data=form).headers["location"] for _ in range(4)]
        assert answers[:2] == ["/password?error=current"] * 2
        assert answers[3].startswith("/password?error=locked")


def test_own_change_ends_the_other_sessions(app: FastAPI) -> None:
    with _client(app) as first, _client(app, "10.0.0.2") as second:
        _log_in(first, "alice")
        _log_in(second, "alice")
        form = {"current": PASSWORD, "new": "a fine secret", "repeat": "a fine secret"}
        assert first.post("/password", data=form).headers["location"] == "/app/"
        assert _page(first) == 200
        assert _page(second) == 401


def test_the_admin_page_is_for_admins(app: FastAPI, store: Store) -> None:
    with _client(app, "10.0.0.5") as alice:
        assert _log_in(alice, "alice") == "/app/"
        ok, said = _call(alice, "administer", ["disable", "ida", "reviewer", ""])
        assert not ok and "needs the admin role" in json.dumps(said)
        with _client(app) as root:
            assert _log_in(root, "root") == "/app/"
            for k in range(3):  # lock ida from one address
                _log_in(_client(app, "10.6.6.6"), "ida", f"guess {k}")
            ok, (table, _) = _call(root, "users", [])
            locked = {row[0]: row[5] for row in table["data"]}
            assert locked["ida"].startswith("from 10.6.6.6 until")
            ok, out = _call(root, "administer", ["unlock", "ida", "reviewer", ""])
            assert ok, out
            assert "Unlocked ida: 3 failed login(s)" in _said(out), out
            ok, out = _call(root, "administer", ["disable", "alice", "reviewer", ""])
            assert ok and "Disabled alice" in _said(out)
            assert _page(alice) == 401  # her open session ended
            ok, out = _call(root, "administer", ["enable", "alice", "reviewer", ""])
            reset = ["reset password", "alice", "reviewer", "set by root"]
            ok, out = _call(root, "administer", reset)
            assert ok and "must change it" in _said(out)
            ok, out = _call(root, "administer", ["set role", "ida", "admin", ""])
            assert ok and "ida is now admin" in _said(out)
            # demoting himself ends his own session, perhaps before the answer's stream
            body = {"data": ["set role", "root", "auditor", ""], "session_hash": "self"}
            started = root.post("/app/gradio_api/call/administer", json=body)
            assert started.status_code == 200, started.text
            root.get(f"/app/gradio_api/call/administer/{started.json()['event_id']}")
            with store.reader() as session:
                assert (
                    session.execute(select(User.role).where(User.name == "root")).scalar_one()
                    is Role.AUDITOR
                )
            assert _page(root) == 401  # his own session ended: he is an auditor now
        with _client(app, "10.0.0.9") as ida:
            assert _log_in(ida, "ida") == "/app/"
            ok, out = _call(ida, "administer", ["set role", "ida", "auditor", "x"])
            assert not ok and "last enabled admin" in json.dumps(out)
    with store.reader() as session:
        actions = session.execute(
            select(AuditEvent.actor, AuditEvent.action)
            .where(AuditEvent.action.like("user.%"), AuditEvent.actor == "root")
            .order_by(AuditEvent.id)
        ).all()
    assert [a for _, a in actions] == [
        "user.unlocked",
        "user.disabled",
        "user.enabled",
        "user.password_reset",
        "user.role_changed",
        "user.role_changed",
    ]


def test_logout_is_a_post(app: FastAPI) -> None:
    with _client(app) as client:
        _log_in(client, "alice")
        page = client.get("/logout")
        assert page.status_code == 200 and 'method="post"' in page.text
        assert _page(client) == 200  # a GET changed nothing
        assert client.post("/logout").headers["location"] == "/login"
        assert _page(client) == 401


@pytest.mark.parametrize("user", ["ida", "alice", "root"])
def test_an_uploaded_study_is_not_served_to_anyone(app: FastAPI, tmp_path: Path, user: str) -> None:
    """Uploads are kept in the upload folder to be measured; Gradio's file route serves none
    of them (it served them to any logged-in role, auditors included)."""
    kept = tmp_path / "uploads" / "20261128-abc" / "study.nii.gz"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"patient pixels")
    with _client(app) as client:
        _log_in(client, user)
        answer = client.get(f"/app/gradio_api/file={kept}")
        assert answer.status_code in (403, 404) and b"patient pixels" not in answer.content


def test_the_session_cookie_holds_no_user(app: FastAPI) -> None:
    with _client(app) as client:
        answer = client.post("/login", data={"username": "alice", "password": PASSWORD})
        assert "alice" not in answer.headers["set-cookie"] and client.cookies.get(COOKIE)
