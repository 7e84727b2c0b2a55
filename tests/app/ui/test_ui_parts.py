"""The review UI's parts without a browser: login and sessions over HTTP, safe uploads, drawing."""

from __future__ import annotations

import stat
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.ui.context import UiContext
from app.ui.render import COLOURS, Overlay, index_of, pixel_of, render_slice
from app.ui.server import create_app
from app.ui.sessions import COOKIE, Sessions
from app.ui.uploads import MAX_MEMBERS, UploadError, receive_upload
from db.engine import open_store
from db.migrate import upgrade
from db.models import AuditEvent, Role
from db.users import add_user
from ingestion.geometry import Geometry
from ingestion.volume import Volume

# Gradio's mounted app leaves event loops and sockets to the garbage collector, which reports
# them later, in whichever test runs then; they say nothing about radcaliper
pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)

PASSWORD = "correct horse"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'ui.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    with store.writer() as session:
        add_user(session, "alice", Role.REVIEWER, password=PASSWORD, actor="test")
        add_user(session, "bob", Role.REVIEWER, password=None, actor="test")
        session.commit()
    context = UiContext(store=store, model_dir=None, nifti_modality=None, upload_dir=tmp_path)
    app = create_app(context, session_minutes=1.0)
    app.state.store = store
    with TestClient(app, follow_redirects=False) as test_client:
        yield test_client
    store.dispose()


def test_login_sets_a_server_side_session_and_logout_ends_it(client: TestClient) -> None:
    assert client.get("/app/").status_code == 401
    assert client.get("/").headers["location"] == "/login"
    refused = client.post("/login", data={"username": "alice", "password": "nope"})
    assert refused.status_code == 303 and "error" in refused.headers["location"]
    no_password = client.post("/login", data={"username": "bob", "password": ""})
    assert "error" in no_password.headers["location"]
    ok = client.post("/login", data={"username": "alice", "password": PASSWORD})
    assert ok.status_code == 303 and ok.headers["location"] == "/app/"
    cookie = ok.headers["set-cookie"]
    assert COOKIE in cookie and "HttpOnly" in cookie and "samesite=lax" in cookie.lower()
    assert "alice" not in cookie  # the cookie is a random token, nothing about the user
    assert client.get("/app/").status_code == 200
    assert client.get("/app/gradio_api/info").status_code == 200
    # a GET (a link or an image on another page) does not log out: it shows a button
    assert '<form method="post" action="/logout">' in client.get("/logout").text
    assert client.get("/app/").status_code == 200
    client.post("/logout")
    assert client.get("/app/").status_code == 401
    store = client.app.state.store  # type: ignore[attr-defined]
    with store.reader() as session:
        actions = session.execute(
            select(AuditEvent.actor, AuditEvent.action).where(AuditEvent.object_type == "session")
        ).all()
    assert [tuple(a) for a in actions] == [
        ("alice", "login.refused"),
        ("bob", "login.refused"),
        ("alice", "login"),
        ("alice", "logout"),
    ]


def test_sessions_expire_on_the_server() -> None:
    sessions = Sessions(lifetime_s=0.2)
    token = sessions.open("alice", "reviewer")
    assert sessions.get(token) is not None and sessions.get("forged") is None
    time.sleep(0.3)
    assert sessions.get(token) is None  # expired, and gone
    other = sessions.open("ida", "auditor")
    sessions.close(other)
    assert sessions.get(other) is None


# --- uploads -------------------------------------------------------------------------------------


def _zip(tmp_path: Path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> Path:
    path = tmp_path / "upload.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return path


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({"../../evil.dcm": b"x"}, "outside its folder"),
        ({"/etc/evil.dcm": b"x"}, "outside its folder"),
        ({"ok/../../evil.dcm": b"x"}, "outside its folder"),
    ],
)
def test_zips_that_would_write_outside_are_refused_whole(
    tmp_path: Path, members: dict[str, bytes], message: str
) -> None:
    upload = _zip(tmp_path, {"study/a.dcm": b"fine", **members})
    with pytest.raises(UploadError, match=message):
        receive_upload(upload, tmp_path / "kept", max_bytes=10**6)
    assert not (tmp_path / "kept").exists() or not any((tmp_path / "kept").rglob("*.dcm"))


def test_links_bombs_and_other_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UploadError, match="link"):
        receive_upload(_zip(tmp_path, {}, links=("study/a.dcm",)), tmp_path, max_bytes=10**6)
    big = _zip(tmp_path, {"a.bin": b"\0" * 200_000})
    with pytest.raises(UploadError, match="unpacks to"):
        receive_upload(big, tmp_path, max_bytes=100_000)
    many = _zip(tmp_path, {f"f{k}": b"" for k in range(MAX_MEMBERS + 1)})
    with pytest.raises(UploadError, match="at most"):
        receive_upload(many, tmp_path, max_bytes=10**8)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(UploadError, match="neither a zip"):
        receive_upload(text, tmp_path, max_bytes=10**6)
    fake = tmp_path / "fake.zip"
    fake.write_bytes(b"not a zip")
    with pytest.raises(UploadError, match="not a readable zip"):
        receive_upload(fake, tmp_path, max_bytes=10**6)


def test_good_uploads_are_kept(tmp_path: Path) -> None:
    kept = receive_upload(
        _zip(tmp_path, {"s/1.dcm": b"a", "s/2.dcm": b"b"}), tmp_path / "up", max_bytes=10**6
    )
    assert kept.kind == "dicom" and sorted(p.name for p in kept.path.rglob("*.dcm")) == [
        "1.dcm",
        "2.dcm",
    ]
    nifti = tmp_path / "scan.nii.gz"
    nifti.write_bytes(b"\x1f\x8b fake")
    stored = receive_upload(nifti, tmp_path / "up", max_bytes=10**6)
    assert stored.kind == "nifti" and stored.path.name == "image.nii.gz"


# --- drawing -------------------------------------------------------------------------------------


def _volume() -> Volume:
    voxels = np.zeros((3, 100, 200), np.float32)  # rows 0.5 mm apart, columns 1 mm apart
    geometry = Geometry((0.0, 0.0, 0.0), (1.0, 0, 0), (0, 1.0, 0), (0, 0, 1.0), (2.0, 0.5, 1.0))
    return Volume.in_memory(voxels, geometry)


def test_display_pixels_and_voxels_map_both_ways() -> None:
    volume = _volume()
    for zoom in (1.0, 2.5):
        x, y = pixel_of(volume, zoom, 40.0, 120.0)
        row, column = index_of(volume, zoom, x, y)
        assert (row, column) == pytest.approx((40.0, 120.0))


def test_overlays_land_on_the_measured_axes() -> None:
    volume = _volume()
    # a lesion whose long axis runs along x from 80 to 160 mm, on slice 1 (z = 2 mm), y = 20 mm
    lesion = Overlay(
        1,
        "lesion",
        1,
        (120.0, 20.0, 2.0),
        (((80.0, 20.0, 2.0), (160.0, 20.0, 2.0)), ((120.0, 15.0, 2.0), (120.0, 25.0, 2.0))),
    )
    image = np.asarray(render_slice(volume, 1, (40.0, 400.0), 1.0, [lesion]))
    yellow = np.all(image == COLOURS["lesion"], axis=-1)
    ys, xs = np.nonzero(yellow)
    x0, y0 = pixel_of(volume, 1.0, 40.0, 80.0)  # row of y = 20 mm, column of x = 80 mm
    x1, _ = pixel_of(volume, 1.0, 40.0, 160.0)
    assert xs.min() == pytest.approx(x0, abs=6) and xs.max() == pytest.approx(x1, abs=6)
    assert abs(np.median(ys[(xs > x0 + 10) & (xs < x1 - 10)]) - y0) <= 2
    other_slice = np.asarray(render_slice(volume, 0, (40.0, 400.0), 1.0, [lesion]))
    assert not np.any(np.all(other_slice == COLOURS["lesion"], axis=-1))
    unlocated = Overlay(2, "vessel", 1, (50.0, 30.0, 2.0), None)
    drawn = np.asarray(render_slice(volume, 1, (40.0, 400.0), 1.0, [unlocated]))
    cyan = np.all(drawn == COLOURS["vessel"], axis=-1)
    assert 0 < cyan.sum() < 100  # a small cross: no circle is invented without a diameter


def test_the_first_start_seeds_demo_studies_and_users(tmp_path: Path) -> None:
    from app.ui.demo import DEMO_USERS, seed_demo
    from db.models import Study, User
    from db.users import verify_password
    from model.measurer.checkpoint.settings import default_checkpoint
    from model.measurer.infer.pipeline import CheckpointMeasurer

    url = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    steps: list[str] = []
    passwords = seed_demo(
        store, CheckpointMeasurer.load(default_checkpoint()), tmp_path, on_step=steps.append
    )
    assert steps == [  # what the first start shows while it works (minutes on a slow machine)
        "writing 3 phantom CT studies",
        "measuring demo study 1/3 (phantom_0000)",
        "measuring demo study 2/3 (phantom_0001)",
        "measuring demo study 3/3 (phantom_0002)",
        "creating the demo users",
    ]
    assert set(passwords) == {name for name, _ in DEMO_USERS}
    note = tmp_path / "demo-users.txt"
    assert stat.S_IMODE(note.stat().st_mode) == 0o600
    with store.reader() as session:
        studies = session.execute(select(Study)).scalars().all()
        users = {u.name: u for u in session.execute(select(User)).scalars()}
    assert len(studies) == 3
    assert all(verify_password(users[n].password_hash, p) for n, p in passwords.items())
    assert seed_demo(store, None, tmp_path) == {}  # a second start changes nothing
    store.dispose()


def test_the_first_start_also_measures_the_real_ct_where_the_machine_has_it(
    tmp_path: Path,
) -> None:
    """The shared real CT (Apache-2.0) is read in place and stored beside the phantoms, named
    by its folder; without a shared folder there is none to add."""
    from app.ui.demo import (
        DEMO_CLICK_CASE,
        DEMO_REAL_CASE,
        demo_click_study,
        demo_real_study,
        seed_demo,
    )
    from db.models import Finding, Measurement, Run, Study
    from db.queries import CLICKED
    from model.measurer.checkpoint.settings import default_checkpoint
    from model.measurer.infer.pipeline import CheckpointMeasurer

    assert demo_real_study(tmp_path / "no-such-folder") is None
    assert demo_click_study(tmp_path / "no-such-folder") is None
    real = demo_real_study()
    click = demo_click_study()
    assert click is not None and click.image.name.startswith(DEMO_CLICK_CASE)
    assert real is not None and real.parts[-2] == DEMO_REAL_CASE  # the shared set is here
    url = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    steps: list[str] = []
    seed_demo(
        store,
        CheckpointMeasurer.load(default_checkpoint()),
        tmp_path,
        on_step=steps.append,
        real_study=real,
        click_study=click,
    )
    assert f"measuring the real CT demo study ({DEMO_REAL_CASE})" in steps
    assert f"measuring a real lung nodule by a click ({DEMO_CLICK_CASE})" in steps
    with store.reader() as session:
        studies = session.execute(select(Study)).scalars().all()
        # the nodule is measured by its click: a lesion with both axes, each with its range
        runs = session.execute(select(Run)).scalars().all()
        clicked = [r for r in runs if r.settings.get("inference") == CLICKED]
        assert len(clicked) == 1 and clicked[0].source.endswith(f"{DEMO_CLICK_CASE}.nii.gz")
        values = dict(
            session.execute(
                select(Measurement.name, Measurement.value_mm)
                .join(Finding, Measurement.finding_id == Finding.id)
                .where(Finding.run_id == clicked[0].id, Finding.kind == "lesion")
            ).all()
        )
    assert len(studies) == 5
    # the nodule (17.7 mm by its readers) is measured by its click, both axes
    assert set(values) == {"long_axis", "short_axis"}
    assert all(v is not None and v > 3.0 for v in values.values())
    store.dispose()
