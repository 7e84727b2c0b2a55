"""The review UI end to end in a real browser: Playwright drives Debian's Chromium (headless)
against a server this test starts on 127.0.0.1, backed by a real SQLite store.

The stored measurements come from the phantom's truth (this test is about the UI, not the
model): one lesion and one vessel, three measurements to review.
"""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import select

from db.models import AuditEvent, Review

from tests.support.ui import (
    PASSWORD,
    Running,
    choose,
    login,
    overlay_pixels,
)

# uvicorn's and Playwright's threads leave their sockets and loops to the garbage collector
# at teardown; those warnings say nothing about radcaliper
pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)


def test_a_wrong_password_is_refused(server: Running, browser: object) -> None:
    page = login(browser, server.url, "alice", "wrong password")
    page.wait_for_url("**/login?error=*")  # type: ignore[attr-defined]
    assert "Wrong user or password" in page.content()  # type: ignore[attr-defined]


def test_the_api_without_a_session_is_refused(server: Running, browser: object) -> None:
    request = browser.new_context().request  # type: ignore[attr-defined]
    assert request.get(f"{server.url}/app/").status == 401
    assert request.get(f"{server.url}/app/gradio_api/info").status == 401
    call = request.post(f"{server.url}/app/gradio_api/call/review", data={"data": []})
    assert call.status == 401


def test_a_reviewer_accepts_corrects_and_rejects(server: Running, browser: object) -> None:
    page = login(browser, server.url, "alice", PASSWORD)
    page.wait_for_url("**/app/**")  # type: ignore[attr-defined]
    page.get_by_text("Logged in as").wait_for(timeout=30000)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Open study").click()  # type: ignore[attr-defined]
    page.get_by_role("tab", name="Study").click()  # type: ignore[attr-defined]
    page.get_by_text(re.compile(r"CLINICAL USE; logged in as alice")).wait_for(timeout=30000)  # type: ignore[attr-defined]
    assert overlay_pixels(page, ("lesion", "vessel"), at_least=51) > 50, (
        "no overlay drawn on the finding's slice"
    )
    with server.store.reader() as session:
        from db.models import Measurement as Row

        ids = session.execute(select(Row.id).order_by(Row.id)).scalars().all()
    steps = [("accept", None, ""), ("correct", 33.3, "edge blurred"), ("reject", None, "artefact")]
    for mid, (action, value, reason) in zip(ids, steps, strict=True):
        choose(page, "measurement id", str(mid))
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
    page = login(browser, server.url, "ida", PASSWORD)
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
    page = login(browser, server.url, "alice", PASSWORD)
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
