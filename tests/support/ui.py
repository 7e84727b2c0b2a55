"""The review UI under test: a seeded store, a running server, Chromium, page helpers."""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.measuring import store_measured
from app.ui.context import UiContext
from app.ui.server import create_app
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import Role
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

PASSWORD = "correct horse"


@dataclass
class Running:
    url: str
    store: Store
    study_uid: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def users_store(path: Path, users: Iterable[tuple[str, Role, str | None]]) -> Store:
    """A new SQLite store at ``path`` holding ``users`` (name, role, password or None), added
    as the test; the caller disposes of it."""
    url = f"sqlite:///{path}"
    upgrade(url)
    store = open_store(url)
    with store.writer() as session:
        for name, role, password in users:
            add_user(session, name, role, password=password, actor="test")
        session.commit()
    return store


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
    port = free_port()
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


def login(browser: object, base: str, user: str, password: str) -> object:
    page = browser.new_context().new_page()  # type: ignore[attr-defined]
    page.goto(f"{base}/login")
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("#login")
    return page


def choose(page: object, label: str, option: str) -> None:
    """Pick ``option`` in the Gradio dropdown labelled ``label``."""
    box = page.get_by_label(label, exact=True)  # type: ignore[attr-defined]
    box.click()
    box.fill(str(option))
    page.get_by_role("option", name=str(option), exact=True).click()  # type: ignore[attr-defined]


def settled(page: object) -> None:
    """Wait until the study image shows no Gradio "processing" status."""
    from playwright.sync_api import expect

    expect(page.locator("#study-image")).not_to_contain_text("processing", timeout=30000)  # type: ignore[attr-defined]


def overlay_pixels(
    page: object, colours: Iterable[str], at_least: int, timeout_s: float = 30.0
) -> int:
    """Pixels of the shown slice in any of ``colours`` (names of ``app.ui.render.COLOURS``),
    once there are at least ``at_least`` of them or ``timeout_s`` has passed: the study image is
    replaced after each action, and a screenshot taken while the new one loads holds none. The
    count returned is the last one taken, so a page that never draws them fails the caller."""
    import io

    import numpy as np
    from PIL import Image

    from app.ui.render import COLOURS

    wanted = [np.array(COLOURS[name]) for name in colours]
    deadline = time.monotonic() + timeout_s
    while True:
        settled(page)
        image = page.locator("#study-image img")  # type: ignore[attr-defined]
        image.wait_for(timeout=20000)
        png = np.asarray(Image.open(io.BytesIO(image.screenshot())).convert("RGB")).astype(int)
        hits = np.zeros(png.shape[:2], dtype=bool)
        for colour in wanted:
            hits |= np.all(np.abs(png - colour) <= 40, axis=-1)
        count = int(hits.sum())
        if count >= at_least or time.monotonic() > deadline:
            return count
        time.sleep(0.5)


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
