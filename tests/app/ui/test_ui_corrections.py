"""Corrections in the review UI are plausible or refused, and the audit tab survives any stored
value (issue 21), in a real browser: Playwright drives Debian's Chromium against the server of
``test_ui`` (its fixtures, a store of its own for this module).
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select, update

from app.ui.render import COLOURS
from db.models import AuditEvent, Measurement, Review, ReviewStatus

# the server, the browser and the page helpers of the UI's end-to-end test
from tests.support.ui import PASSWORD, Running, choose, login, overlay_pixels

pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)

# what is typed -> the one message it gets (the long axis is corrected)
REFUSED = [
    ("1e308", "1e+308 mm is not a plausible long axis (a long axis must be a finite number of "
              "mm of at least 0.1 and at most 500 mm"),
    ("1e-320", "9.99989e-321 mm is not a plausible long axis"),
    ("0", "0 mm is not a plausible long axis"),
    ("-1", "-1 mm is not a plausible long axis"),
    ("NaN", "nan mm is not a plausible long axis"),
    ("ten mm", "'ten mm' is not a number: type the corrected value in mm"),
    ("", "a correction needs the corrected value"),
]  # fmt: skip


def _counts(running: Running) -> tuple[int, int]:
    with running.store.reader() as session:
        return (
            session.execute(select(func.count()).select_from(Review)).scalar_one(),
            session.execute(select(func.count()).select_from(AuditEvent)).scalar_one(),
        )


def _measurement_ids(running: Running) -> dict[str, int]:
    with running.store.reader() as session:
        rows = session.execute(select(Measurement.name, Measurement.id)).all()
    return {name: int(mid) for name, mid in rows}


def _open_study(page: object, user: str) -> None:
    page.wait_for_url("**/app/**")  # type: ignore[attr-defined]
    page.get_by_text("Logged in as").wait_for(timeout=30000)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Open study").click()  # type: ignore[attr-defined]
    page.get_by_role("tab", name="Study").click()  # type: ignore[attr-defined]
    page.get_by_text(re.compile(rf"CLINICAL USE; logged in as {user}")).wait_for(timeout=30000)  # type: ignore[attr-defined]


def _page_intact(page: object) -> None:
    """The image is drawn with its overlays and the table lists the measurements: no error
    overlay took their place, and no error toast was shown."""
    from playwright.sync_api import expect

    assert overlay_pixels(page, COLOURS, at_least=51) > 50, "the image lost its overlays"
    for part in ("#study-image", "#study-table"):
        expect(page.locator(part)).not_to_contain_text("Error")  # type: ignore[attr-defined]
    expect(page.locator("#study-table")).to_contain_text("long axis")  # type: ignore[attr-defined]
    expect(page.locator("#study-table")).to_contain_text("diameter")  # type: ignore[attr-defined]
    assert page.locator(".toast-item").count() == 0  # type: ignore[attr-defined]


def test_implausible_corrections_are_refused_with_one_message(
    server: Running, browser: object
) -> None:
    from playwright.sync_api import expect

    ids = _measurement_ids(server)
    page = login(browser, server.url, "alice", PASSWORD)
    _open_study(page, "alice")
    before = _counts(server)  # after the login's event
    field = page.get_by_label("corrected value (mm)")  # type: ignore[attr-defined]
    assert field.input_value() == ""  # empty, not 0
    choose(page, "measurement id", str(ids["long_axis"]))
    page.get_by_label("correct", exact=True).check()  # type: ignore[attr-defined]
    page.get_by_label("reason (needed to correct or reject)").fill("typo")  # type: ignore[attr-defined]
    status = page.locator("#review-status")  # type: ignore[attr-defined]
    for typed, message in REFUSED:
        field.fill(typed)
        page.get_by_role("button", name="Save review").click()  # type: ignore[attr-defined]
        expect(status).to_contain_text(message)
        assert status.inner_text().count("Not saved") == 1
        assert field.input_value() == typed  # kept, to be fixed
        _page_intact(page)
    assert _counts(server) == before  # nothing stored: no review, no audit event
    with server.store.reader() as session:
        row = session.get(Measurement, ids["long_axis"])
        assert row is not None and row.status is ReviewStatus.PENDING and row.version == 1

    field.fill("31.5")  # the form still works, and the field empties for the next one
    page.get_by_role("button", name="Save review").click()  # type: ignore[attr-defined]
    expect(status).to_contain_text(f"correct of measurement {ids['long_axis']} saved by alice")
    expect(field).to_have_value("")
    expect(page.locator("#study-table")).to_contain_text("-> 31.5")  # type: ignore[attr-defined]


def test_a_stale_edit_shows_the_current_state_and_one_message(
    server: Running, browser: object
) -> None:
    """Another reviewer saved first: the page says so once, shows what they saved, and keeps
    the image (it was an error overlay, and the page kept the outdated table)."""
    from playwright.sync_api import expect

    from db.models import Role
    from db.review import review_measurement
    from db.users import add_user

    mid = _measurement_ids(server)["short_axis"]
    page = login(browser, server.url, "alice", PASSWORD)
    _open_study(page, "alice")
    with server.store.writer() as session:
        bob = add_user(session, "bob", Role.REVIEWER, password=PASSWORD, actor="test")
        review_measurement(session, mid, action="accept", reviewer=bob, seen_version=1)
        session.commit()
    choose(page, "measurement id", str(mid))
    page.get_by_label("reject", exact=True).check()  # type: ignore[attr-defined]
    page.get_by_label("reason (needed to correct or reject)").fill("artefact")  # type: ignore[attr-defined]
    page.get_by_role("button", name="Save review").click()  # type: ignore[attr-defined]
    status = page.locator("#review-status")  # type: ignore[attr-defined]
    expect(status).to_contain_text(f"measurement {mid} was changed by bob")
    assert status.inner_text().count("Not saved") == 1
    table = page.locator("#study-table")  # type: ignore[attr-defined]
    expect(table).to_contain_text(re.compile(r"short axis\s+\S+\s+\S+\s+accepted\s+bob"))
    _page_intact(page)


def test_the_audit_tab_survives_extreme_stored_values(server: Running, browser: object) -> None:
    """1e308 mm and infinity written with SQL, as an old or hand-edited database holds them:
    the audit query answers, leaves them out of the agreement figure and says so; the study
    view shows them."""
    from playwright.sync_api import expect

    ids = _measurement_ids(server)
    with server.store.writer() as session:
        for name, value in (("short_axis", 1e308), ("diameter", float("inf"))):
            session.execute(
                update(Measurement)
                .where(Measurement.id == ids[name])
                .values(status=ReviewStatus.CORRECTED, reviewed_value_mm=value)
            )
        session.commit()
    page = login(browser, server.url, "ida", PASSWORD)
    page.wait_for_url("**/app/**")  # type: ignore[attr-defined]
    page.get_by_text("Logged in as").wait_for(timeout=30000)  # type: ignore[attr-defined]
    page.get_by_role("tab", name="Audit").click()  # type: ignore[attr-defined]
    page.get_by_role("button", name="Query").click()  # type: ignore[attr-defined]
    left_out = "left out with an implausible value (not finite, not > 0 or over the limit"
    page.get_by_text(re.compile(re.escape(left_out))).wait_for(timeout=30000)  # type: ignore[attr-defined]
    body = page.locator("body")  # type: ignore[attr-defined]
    expect(body).to_contain_text(f"measurement {ids['short_axis']}, {ids['diameter']}")
    expect(body).to_contain_text("1e+308")
    expect(body).to_contain_text("Infinity")
    assert page.locator(".toast-item").count() == 0  # type: ignore[attr-defined]
    page.get_by_role("tab", name="Worklist").click()  # type: ignore[attr-defined]
    _open_study(page, "ida")
    expect(page.locator("#study-table")).to_contain_text("-> 1e+308")  # type: ignore[attr-defined]
    expect(page.locator("#study-table")).to_contain_text("-> Infinity")  # type: ignore[attr-defined]
