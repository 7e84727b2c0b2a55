"""A value that is no number, written by SQL into a float column (SQLite takes text there), is
shown as invalid by the study view and the audit tab instead of failing them (issue 41, 7)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.ui.context import UiContext
from app.ui.server import create_app
from db.engine import Store

from tests.support.ui import PASSWORD, seeded_store

pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Store, str, Path]]:
    store, study_uid = seeded_store(tmp_path)
    yield store, study_uid, tmp_path
    store.dispose()


def _call(client: TestClient, api: str, data: list[Any]) -> tuple[bool, Any]:
    body = {"data": data, "session_hash": f"page-{id(client)}"}
    started = client.post(f"/app/gradio_api/call/{api}", json=body)
    assert started.status_code == 200, started.text
    stream = client.get(f"/app/gradio_api/call/{api}/{started.json()['event_id']}").text
    last = [line for line in stream.splitlines() if line.startswith("data:")][-1]
    return "event: complete" in stream, json.loads(last[len("data:") :])


def test_text_in_float_columns_shows_as_invalid(site: tuple[Store, str, Path]) -> None:
    store, study_uid, root = site
    with store.engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE measurements SET value_mm = 'abc', range_low_mm = 'x', "
                "reviewed_value_mm = 'y', status = 'corrected' WHERE id = 1"
            )
        )
        connection.execute(text("UPDATE measurements SET value_mm = 'd' WHERE name = 'diameter'"))
        connection.execute(text("UPDATE findings SET center_x_mm = 'left' WHERE number = 1"))
    context = UiContext(
        store=store, model_dir=None, nifti_modality=None, upload_dir=root / "uploads",
        temp_dir=root / "ui-temp",
    )  # fmt: skip
    with TestClient(create_app(context), follow_redirects=False) as client:
        for user in ("alice", "ida"):
            client.post("/login", data={"username": user, "password": PASSWORD})
            _call(client, "worklist", ["", "all"])
            ok, opened = _call(client, "open_study", [study_uid, "soft tissue", 40, 400, 1])
            assert ok, opened
            table = next(o for o in opened if isinstance(o, dict) and "headers" in o)
            cells = [str(cell) for row in table["data"] for cell in row]
            assert "invalid ('abc') -> invalid ('y')" in cells
            assert "invalid ('x')-" in " ".join(cells)
            client.post("/logout")
        client.post("/login", data={"username": "ida", "password": PASSWORD})
        ok, audited = _call(client, "audit", ["", "", "", "", "", "all", ""])
        assert ok, audited
        summary = audited[3]
        assert "left out" in summary or "implausible" in summary, summary
