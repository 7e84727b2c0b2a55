"""The review UI end to end in a real browser: Playwright drives Debian's Chromium (headless)
against a server this test starts on 127.0.0.1, backed by a real SQLite store.

The stored measurements come from the phantom's truth (this test is about the UI, not the
model): one lesion and one vessel, three measurements to review.
"""

from __future__ import annotations

import gc
import io
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select

from app.measuring import store_measured
from app.ui.context import UiContext
from app.ui.render import COLOURS
from app.ui.server import create_app
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import AuditEvent, Review, Role
from db.users import add_user
from ingestion.load import load_path
from ingestion.phantoms import write_phantoms
from model.measurer.data.sources import read_truth
from model.measurer.results import (
    FindingKind,
    Measurement,
    MeasurementName,
    ModelInfo,
    StudyFinding,
    StudyResult,
)
from model.measurer.tasks.axes import finding_axes

# uvicorn's and Playwright's threads leave their sockets and loops to the garbage collector
# at teardown; those warnings say nothing about radcaliper
pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)

CHROMIUM = "/usr/bin/chromium"
# headless on a machine without a network: no sandbox (root), no GPU, no background traffic
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse"


@dataclass
class Running:
    url: str
    store: Store
    study_uid: str


class _Measurer:
    """Only the checkpoint hash is used when storing a hand-made result."""

    checkpoint_hash = "f" * 64


def _result_from_truth(folder: Path) -> tuple[StudyResult, object]:
    (volume,) = load_path(folder / "dicom").volumes
    findings = []
    for k, t in enumerate(read_truth(folder / "truth.json"), start=1):
        axes = finding_axes(t)
        if t.kind == "lesion":
            assert t.long_axis_mm is not None and t.short_axis_mm is not None
            values = [(MeasurementName.LONG_AXIS, t.long_axis_mm)]
            values.append((MeasurementName.SHORT_AXIS, t.short_axis_mm))
        else:
            assert t.diameter_mm is not None
            values = [(MeasurementName.DIAMETER, t.diameter_mm)]
        measurements = tuple(
            Measurement(name, round(v, 1), (round(v, 1) - 2.0, round(v, 1) + 2.0), 0.9)
            for name, v in values
        )
        findings.append(
            StudyFinding(
                k,
                FindingKind(t.kind),
                t.center_lps_mm,
                t.slice_index,
                measurements,
                axes,
            )
        )
    ids = volume.identifiers
    result = StudyResult(
        ids.study_instance_uid,
        ids.series_instance_uid,
        ids.patient_id or "",
        str(folder / "dicom"),
        ModelInfo("radcaliper-test", "9.9.9", "rned_corr"),
        tuple(findings),
    )
    return result, volume


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seeded_store(root: Path) -> tuple[Store, str]:
    """An SQLite store under ``root`` with one phantom study (measurements from its truth) and
    the users alice (reviewer) and ida (auditor); returns it and the study's UID."""
    write_phantoms(root / "studies", n=1, seed=11)
    url = f"sqlite:///{root / 'ui.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    result, volume = _result_from_truth(root / "studies" / "phantom_0000")
    store_measured(
        store,
        _Measurer(),
        result,
        volume,  # type: ignore[arg-type]
        started_at=datetime.now(UTC),
        actor="test",
        pseudonym_key=None,
    )
    with store.writer() as session:
        add_user(session, "alice", Role.REVIEWER, password=PASSWORD, actor="test")
        add_user(session, "ida", Role.AUDITOR, password=PASSWORD, actor="test")
        session.commit()
    return store, result.study_instance_uid


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    import uvicorn

    root = tmp_path_factory.mktemp("ui")
    store, study_uid = seeded_store(root)
    context = UiContext(
        store=store, model_dir=None, nifti_modality=None, upload_dir=root / "uploads"
    )
    port = _free_port()
    config = uvicorn.Config(create_app(context), host="127.0.0.1", port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if uv.started:
            break
        time.sleep(0.05)
    yield Running(f"http://127.0.0.1:{port}", store, study_uid)
    uv.should_exit = True
    thread.join(timeout=10)
    store.dispose()
    gc.collect()  # uvicorn's loop and sockets: finalised here, under this module's filter


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
        )
        yield browser
        browser.close()
    gc.collect()  # Playwright's loop: finalised here, under this module's filter


def _login(browser: object, base: str, user: str, password: str) -> object:
    page = browser.new_context().new_page()  # type: ignore[attr-defined]
    page.goto(f"{base}/login")
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("#login")
    return page


def _choose(page: object, label: str, option: str) -> None:
    """Pick ``option`` in the Gradio dropdown labelled ``label``."""
    box = page.get_by_label(label, exact=True)  # type: ignore[attr-defined]
    box.click()
    box.fill(str(option))
    page.get_by_role("option", name=str(option), exact=True).click()  # type: ignore[attr-defined]


def _settled(page: object) -> None:
    """Wait until the study image shows no Gradio "processing" status."""
    from playwright.sync_api import expect

    expect(page.locator("#study-image")).not_to_contain_text("processing", timeout=30000)  # type: ignore[attr-defined]


def _overlay_pixels(page: object) -> int:
    _settled(page)
    image = page.locator("#study-image img")  # type: ignore[attr-defined]
    image.wait_for(timeout=20000)
    shot = image.screenshot()
    png = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"))  # (H, W, 3)
    hits = np.zeros(png.shape[:2], dtype=bool)
    for colour in (COLOURS["lesion"], COLOURS["vessel"]):
        hits |= np.all(np.abs(png.astype(int) - np.array(colour)) <= 40, axis=-1)
    return int(hits.sum())


def test_a_wrong_password_is_refused(server: Running, browser: object) -> None:
    page = _login(browser, server.url, "alice", "wrong password")
    page.wait_for_url("**/login?error=*")  # type: ignore[attr-defined]
    assert "Wrong user or password" in page.content()  # type: ignore[attr-defined]


def test_the_api_without_a_session_is_refused(server: Running, browser: object) -> None:
    request = browser.new_context().request  # type: ignore[attr-defined]
    assert request.get(f"{server.url}/app/").status == 401
    assert request.get(f"{server.url}/app/gradio_api/info").status == 401
    call = request.post(f"{server.url}/app/gradio_api/call/review", data={"data": []})
    assert call.status == 401


def test_a_reviewer_accepts_corrects_and_rejects(server: Running, browser: object) -> None:
    page = _login(browser, server.url, "alice", PASSWORD)
    page.wait_for_url("**/app/**")  # type: ignore[attr-defined]
    page.get_by_text("Logged in as").wait_for(timeout=30000)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Open study").click()  # type: ignore[attr-defined]
    page.get_by_role("tab", name="Study").click()  # type: ignore[attr-defined]
    page.get_by_text(re.compile(r"CLINICAL USE; logged in as alice")).wait_for(timeout=30000)  # type: ignore[attr-defined]
    assert _overlay_pixels(page) > 50, "no overlay drawn on the finding's slice"
    with server.store.reader() as session:
        from db.models import Measurement as Row

        ids = session.execute(select(Row.id).order_by(Row.id)).scalars().all()
    steps = [("accept", None, ""), ("correct", 33.3, "edge blurred"), ("reject", None, "artefact")]
    for mid, (action, value, reason) in zip(ids, steps, strict=True):
        _choose(page, "measurement id", str(mid))
        page.get_by_label(action, exact=True).check()  # type: ignore[attr-defined]
        if value is not None:
            page.get_by_label("corrected value (mm)").fill(str(value))  # type: ignore[attr-defined]
        page.get_by_label("reason (needed to correct or reject)").fill(reason)  # type: ignore[attr-defined]
        page.get_by_role("button", name="Save review").click()  # type: ignore[attr-defined]
        page.get_by_text(f"{action} of measurement {mid} saved by alice").wait_for(timeout=30000)  # type: ignore[attr-defined]
    with server.store.reader() as session:
        reviews = session.execute(select(Review).order_by(Review.id)).scalars().all()
        assert [(r.action.value, r.value_mm) for r in reviews] == [
            ("accept", None),
            ("correct", 33.3),
            ("reject", None),
        ]
        actions = (
            session.execute(
                select(AuditEvent.action).where(AuditEvent.actor == "alice").order_by(AuditEvent.id)
            )
            .scalars()
            .all()
        )
        assert [a for a in actions if a.startswith("review.")] == [
            "review.accept",
            "review.correct",
            "review.reject",
        ]
        assert "login" in actions


def test_an_auditor_cannot_change_a_measurement(server: Running, browser: object) -> None:
    page = _login(browser, server.url, "ida", PASSWORD)
    page.wait_for_url("**/app/**")  # type: ignore[attr-defined]
    page.get_by_text("Logged in as").wait_for(timeout=30000)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Open study").click()  # type: ignore[attr-defined]
    page.get_by_role("tab", name="Study").click()  # type: ignore[attr-defined]
    page.get_by_text(re.compile(r"CLINICAL USE; logged in as ida")).wait_for(timeout=30000)  # type: ignore[attr-defined]
    assert page.get_by_role("button", name="Save review").count() == 0  # type: ignore[attr-defined]
    with server.store.reader() as session:
        before = len(session.execute(select(Review)).scalars().all())
    # the endpoint refuses too, with the auditor's own session
    call = page.request.post(  # type: ignore[attr-defined]
        f"{server.url}/app/gradio_api/call/review",
        data={"data": [None, None, "accept", None, "", 0, "soft tissue", 40, 400, 1]},
    )
    assert call.status == 200
    event = json.loads(call.text())["event_id"]
    stream = page.request.get(f"{server.url}/app/gradio_api/call/review/{event}").text()  # type: ignore[attr-defined]
    assert "event: error" in stream and "auditor" in stream
    with server.store.reader() as session:
        assert len(session.execute(select(Review)).scalars().all()) == before


def test_logging_out_ends_the_session_in_every_tab(server: Running, browser: object) -> None:
    page = _login(browser, server.url, "alice", PASSWORD)
    page.wait_for_url("**/app/**")  # type: ignore[attr-defined]
    page.get_by_text("Logged in as").wait_for(timeout=30000)  # type: ignore[attr-defined]
    tabs = page.context  # type: ignore[attr-defined]
    other = tabs.new_page()  # a second tab of the same browser: the same session cookie
    other.goto(f"{server.url}/app/")
    other.get_by_text("Logged in as").wait_for(timeout=30000)
    other.get_by_role("button", name="Log out").click()
    other.wait_for_url("**/login")
    assert len(tabs.pages) == 2  # logging out opened no new tab
    # the first tab's next action is refused, and the tab says why, on the login page
    page.get_by_role("button", name="Refresh").click()  # type: ignore[attr-defined]
    page.wait_for_url("**/login?error=ended")  # type: ignore[attr-defined]
    page.get_by_text("Your session ended, log in again.").wait_for(timeout=30000)  # type: ignore[attr-defined]
    assert len(tabs.pages) == 2
    with server.store.reader() as session:
        actions = (
            session.execute(
                select(AuditEvent.action).where(AuditEvent.actor == "alice").order_by(AuditEvent.id)
            )
            .scalars()
            .all()
        )
    assert actions[-1] == "logout"
