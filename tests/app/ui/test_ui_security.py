"""The review UI's web hardening, over HTTP against the real app (no browser): every Gradio
route needs a session, other sites cannot make requests with the user's cookie or frame the UI,
the Secure cookie setting, and the UI's temporary files (patient data) stay private and are
removed.

The browser test of logging out in one tab while another is open is in ``test_ui.py``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount

from app.ui.context import UiContext
from app.ui.security import SESSION_ENDED
from app.ui.server import create_app
from app.ui.sessions import COOKIE
from db.engine import Store

from tests.support.ui import PASSWORD, free_port, seeded_store

pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)

FRAMING = {"x-frame-options": "DENY", "content-security-policy": "frame-ancestors 'none'"}


@dataclass
class Site:
    store: Store
    study_uid: str
    root: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A store with one phantom study (measurements from its truth) and two users."""
    root = tmp_path_factory.mktemp("ui_security")
    store, study_uid = seeded_store(root)
    yield Site(store, study_uid, root)
    store.dispose()


def _context(site: Site, temp_dir: Path | None = None) -> UiContext:
    return UiContext(
        store=site.store,
        model_dir=None,
        nifti_modality=None,
        upload_dir=site.root / "uploads",
        temp_dir=temp_dir,
    )


def _log_in(client: Any, user: str = "alice") -> None:
    answer = client.post("/login", data={"username": user, "password": PASSWORD})
    assert answer.status_code == 303 and answer.headers["location"] == "/app/", answer.text


# --- every Gradio route needs a session ----------------------------------------------------------


def _routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, concrete path) of every route of the mounted Gradio app, parameters filled in."""
    mount = next(r for r in app.routes if isinstance(r, Mount) and r.path == "/app")
    found: list[tuple[str, str]] = []

    def walk(routes: Any, prefix: str) -> None:
        for route in routes:
            if hasattr(route, "original_router"):  # FastAPI's included router
                walk(route.original_router.routes, prefix + route.include_context.prefix)
                continue
            path = re.sub(r"\{[^}]+\}", "x", prefix + route.path)
            for method in sorted(getattr(route, "methods", None) or {"GET"}):
                found.append((method, path))

    walk(cast(FastAPI, mount.app).routes, "/app")
    return found


@pytest.fixture(scope="module")
def served(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FastAPI]]:
    """The app behind a real uvicorn (streaming routes such as the heartbeat never end: a
    client with a timeout tells an open stream from a refusal)."""
    import uvicorn

    app = create_app(_context(site, tmp_path_factory.mktemp("served") / "ui-temp"))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", app
    server.should_exit = True
    thread.join(timeout=10)


def test_every_gradio_route_answers_401_without_a_session(served: tuple[str, FastAPI]) -> None:
    base, app = served
    routes = _routes(app)
    # the routes that answered without a session before, among them
    for known in ("/app/gradio_api/reset", "/app/gradio_api/cancel"):
        assert ("POST", known) in routes
    for known in ("/app/gradio_api/heartbeat/x", "/app/gradio_api/startup-events"):
        assert ("GET", known) in routes
    assert len(routes) > 50
    with httpx.Client(base_url=base, timeout=10) as client:
        client.post("/login", data={"username": "alice", "password": PASSWORD})
        ended = client.cookies[COOKIE]
        client.post("/logout")
    for cookies in ({}, {COOKIE: ended}, {COOKIE: "forged"}):
        with httpx.Client(base_url=base, timeout=10, cookies=cookies) as client:
            answers = {
                (method, path): client.request(method, path).status_code for method, path in routes
            }
            assert {k: v for k, v in answers.items() if v != 401} == {}, cookies
            refused = client.post("/app/gradio_api/queue/join", json={})
        assert refused.json() == {"detail": SESSION_ENDED}  # what the page shows for the action
        assert refused.headers["x-frame-options"] == "DENY"


def test_a_page_without_a_session_links_to_the_login(served: tuple[str, FastAPI]) -> None:
    base, _ = served
    page = httpx.get(f"{base}/app/", headers={"accept": "text/html"}, timeout=10)
    assert page.status_code == 401
    assert SESSION_ENDED in page.text and 'href="/login"' in page.text


# --- framing, other sites, the cookie ------------------------------------------------------------


@pytest.fixture
def client(site: Site, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(_context(site, tmp_path / "ui-temp"))
    with TestClient(app, follow_redirects=False) as test_client:
        yield test_client


def test_no_response_may_be_framed(client: TestClient) -> None:
    answers = [client.get("/login"), client.get("/healthz"), client.get("/app/")]
    _log_in(client)
    answers += [client.get("/app/"), client.get("/app/gradio_api/info"), client.post("/logout")]
    for answer in answers:
        for name, value in FRAMING.items():
            assert answer.headers.get(name) == value, (answer.url, name)
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_state_changing_requests_from_another_site_are_refused(client: TestClient) -> None:
    form = {"username": "alice", "password": PASSWORD}
    host = "http://testserver"
    for headers in (
        {"origin": "https://evil.example"},
        {"origin": "null"},  # a sandboxed frame
        {"referer": "https://evil.example/page"},  # no Origin: the Referer decides
        {"origin": "http://testserver.evil.example"},
    ):
        refused = client.post("/login", data=form, headers=headers)
        assert refused.status_code == 403, headers
        assert "another site" in refused.json()["detail"]
    assert client.cookies.get(COOKIE) is None
    for headers in ({"origin": host}, {"referer": f"{host}/login"}, {}):  # {}: not a browser
        assert client.post("/login", data=form, headers=headers).status_code == 303, headers
    # with a live session, Gradio's own API is protected the same way
    cross = client.post(
        "/app/gradio_api/queue/join", json={}, headers={"origin": "https://evil.example"}
    )
    assert cross.status_code == 403
    # reading is not state-changing: a link from another site still opens the login page
    assert client.get("/login", headers={"origin": "https://evil.example"}).status_code == 200


def test_trusted_origins_may_post(site: Site, tmp_path: Path) -> None:
    app = create_app(_context(site, tmp_path / "t"), trusted_origins=["https://ui.example.org"])
    with TestClient(app, follow_redirects=False) as client:
        form = {"username": "alice", "password": PASSWORD}
        ok = client.post("/login", data=form, headers={"origin": "https://ui.example.org"})
        assert ok.status_code == 303
        other = client.post("/login", data=form, headers={"origin": "https://ui.example.com"})
        assert other.status_code == 403


def test_the_session_cookie_is_secure_when_asked(site: Site, tmp_path: Path) -> None:
    for secure in (False, True):
        app = create_app(_context(site, tmp_path / str(secure)), secure_cookies=secure)
        with TestClient(app, follow_redirects=False) as client:
            answer = client.post("/login", data={"username": "alice", "password": PASSWORD})
            cookie = answer.headers["set-cookie"]
            assert ("; secure" in cookie.lower()) is secure, cookie
            assert "httponly" in cookie.lower() and "samesite=lax" in cookie.lower()


# --- temporary files -----------------------------------------------------------------------------


def _call(client: TestClient, api: str, data: list[Any]) -> list[Any]:
    """Call a Gradio endpoint as the page does (queue, then the event's stream, in one page
    session); its outputs."""
    body = {"data": data, "session_hash": "page-1"}
    started = client.post(f"/app/gradio_api/call/{api}", json=body)
    assert started.status_code == 200, started.text
    stream = client.get(f"/app/gradio_api/call/{api}/{started.json()['event_id']}").text
    assert "event: complete" in stream, stream[-2000:]
    last = [line for line in stream.splitlines() if line.startswith("data:")][-1]
    outputs: list[Any] = json.loads(last[len("data:") :])
    return outputs


def _fetch(client: TestClient, file: dict[str, Any]) -> tuple[bytes, str | None]:
    """The content of a file the page was given, and its Cache-Control header."""
    answer = client.get(httpx.URL(file["url"]).raw_path.decode())
    assert answer.status_code == 200, answer.text
    return answer.content, answer.headers.get("cache-control")


def _readable_by_others(path: Path, top: Path) -> bool:
    """Whether a user other than the owner (group or others) can read ``path``: it is readable
    for them and they can enter every folder from ``top`` down to it."""
    if stat.S_IMODE(path.stat().st_mode) & 0o044 == 0:
        return False
    folder = path.parent
    while True:
        if stat.S_IMODE(folder.stat().st_mode) & 0o011 == 0:
            return False
        if folder == top:
            return True
        folder = folder.parent


def test_temporary_files_are_private_and_removed(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the system temp dir of this test: only this server writes there
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    os.chmod(system_temp, 0o1777)  # like /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))
    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    data_dir = tmp_path / "data"
    private = data_dir / "ui-temp"
    private.mkdir(parents=True, mode=0o755)
    (private / "left-by-a-killed-server.png").write_bytes(b"old")
    app = create_app(_context(site, private))
    with TestClient(app, follow_redirects=False) as client:
        _log_in(client, "alice")
        _call(client, "worklist", ["", "all"])  # fills the study choices, as the page does
        opened = _call(client, "open_study", [site.study_uid, "soft tissue", 40, 400, 1])
        image = next(o for o in opened if isinstance(o, dict) and "url" in o)
        slice_png, slice_cache = _fetch(client, image)
        assert slice_png.startswith(b"\x89PNG")  # a rendered slice
        client.post("/logout")
        _log_in(client, "ida")
        audited = _call(client, "audit", ["", "", "", "", "", "all", ""])
        export = next(o for o in audited if isinstance(o, dict) and "url" in o)
        csv_file, csv_cache = _fetch(client, export)
        assert b"study_instance_uid" in csv_file  # the audit CSV
        client.post("/logout")
        assert not [p for p in system_temp.rglob("*") if _readable_by_others(p, system_temp)]
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert not (private / "left-by-a-killed-server.png").exists()
        made = [p for p in private.rglob("*") if p.is_file()]
        assert len(made) >= 2  # the slice and the export are kept in the private folder
        for path in made:
            assert not _readable_by_others(path, private.parent), path
        export_file = Path(export["path"])
        assert export_file.is_relative_to(private)
        assert stat.S_IMODE(export_file.stat().st_mode) == 0o600
    assert slice_cache == csv_cache == "no-store"  # and no copy in the browser's cache
    # the server has stopped: nothing is left, neither in its folder nor in the system's
    assert list(private.iterdir()) == []
    assert [p for p in system_temp.rglob("*") if p.is_file()] == []


def test_serve_builds_the_hardened_app(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``radcaliper serve``: the temporary files in DATA_DIR/ui-temp (0700), --secure-cookies."""
    import uvicorn
    from typer.testing import CliRunner

    from app.cli import app as cli

    served: list[FastAPI] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(app))
    monkeypatch.setenv("RADCALIPER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RADCALIPER_LOGIN_MAX_FAILURES", "2")
    url = str(site.store.engine.url)
    result = CliRunner().invoke(cli, ["serve", "--no-demo", "--secure-cookies", "--db", url])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((tmp_path / "data" / "ui-temp").stat().st_mode) == 0o700
    with TestClient(served[0], follow_redirects=False) as client:
        assert "; secure" in _log_in_cookie(client).lower()
        for _ in range(2):
            client.post("/login", data={"username": "bob", "password": "wrong one"})
        locked = client.post("/login", data={"username": "bob", "password": "wrong one"})
        assert locked.headers["location"].startswith("/login?error=locked")


def _log_in_cookie(client: TestClient) -> str:
    answer = client.post("/login", data={"username": "alice", "password": PASSWORD})
    assert answer.status_code == 303
    return str(answer.headers["set-cookie"])


def test_the_private_folder_is_swept_and_refuses_links(tmp_path: Path) -> None:
    from app.ui.tempfiles import PrivateFolder
    from ingestion.errors import ConfigurationError

    folder = PrivateFolder(tmp_path / "ui-temp")
    root = folder.prepare()
    old_dir, new_dir = root / "old", root / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    (old_dir / "slice.png").write_bytes(b"x")
    (new_dir / "slice.png").write_bytes(b"y")
    an_hour_ago = time.time() - 3600
    os.utime(old_dir / "slice.png", (an_hour_ago, an_hour_ago))
    assert folder.sweep(max_age_s=1800) == 1
    assert not (old_dir / "slice.png").exists() and (new_dir / "slice.png").exists()
    os.utime(old_dir, (an_hour_ago, an_hour_ago))  # emptied long ago: the folder goes too
    folder.sweep(max_age_s=1800)
    assert not old_dir.exists() and new_dir.exists()
    folder.close()
    assert root.is_dir() and list(root.iterdir()) == []  # a configured folder stays, empty
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(ConfigurationError, match="link"):
        PrivateFolder(link).prepare()
    own = PrivateFolder()  # none configured: a fresh 0700 folder, removed when closed
    assert stat.S_IMODE(own.prepare().stat().st_mode) == 0o700
    own.close()
    assert not own.path.exists()
