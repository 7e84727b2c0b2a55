"""The audit chain covers every stored fact a reader relies on: tampering with a patient id, a
finding's place, kind or slice, a run's model version, a series UID or a user's role behind
radcaliper's back makes ``audit verify`` fail naming the table, row and field; databases from
before the coverage (schema 0002) get it through the 0003 migration's baseline."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, select, text
from typer.testing import CliRunner

from app.cli import app
from db.audit import verify
from db.engine import Store, open_store
from db.migrate import SCHEMA_HEAD, upgrade
from db.models import AuditEvent, Role, User
from db.users import add_user

from tests.support.old_database import old_database

runner = CliRunner()

# (table, field, statement): one way each covered fact is changed behind the log; the statement
# changes the row with the lowest id of its table
FIRST = "(SELECT min(id) FROM {table})"
TAMPERING = [
    ("studies", "patient_id", "UPDATE studies SET patient_id = 'ANOTHER-PATIENT'"),
    ("studies", "patient_name", "UPDATE studies SET patient_name = 'Someone^Else'"),
    ("studies", "study_instance_uid", "UPDATE studies SET study_instance_uid = '1.2.3.4.5'"),
    ("series", "series_instance_uid", "UPDATE series SET series_instance_uid = '1.2.3.4.6'"),
    ("series", "geometry", "UPDATE series SET geometry = NULL"),
    (
        "series",
        "sop_instance_uids",
        """UPDATE series SET sop_instance_uids = '{"uids": [], "frames": []}'""",
    ),
    ("runs", "model_version", "UPDATE runs SET model_version = '9.9.10'"),
    ("runs", "model_name", "UPDATE runs SET model_name = 'radcaliper-pro'"),
    ("runs", "checkpoint_hash", "UPDATE runs SET checkpoint_hash = '" + "d" * 64 + "'"),
    ("runs", "input_fingerprint", "UPDATE runs SET input_fingerprint = '" + "e" * 64 + "'"),
    ("findings", "center_x_mm", "UPDATE findings SET center_x_mm = center_x_mm + 40"),
    ("findings", "slice_index", "UPDATE findings SET slice_index = slice_index + 5"),
    (
        "findings",
        "kind",
        "UPDATE findings SET kind = CASE kind WHEN 'lesion' THEN 'vessel' ELSE 'lesion' END",
    ),
    (
        "findings",
        "axes_lps_mm",
        """UPDATE findings SET axes_lps_mm = '{"segments": [[[0, 0, 0], [9, 9, 9]]]}'""",
    ),
    ("measurements", "reason", "UPDATE measurements SET reason = 'no reason'"),
    ("users", "role", "UPDATE users SET role = 'admin'"),
    ("users", "active", "UPDATE users SET active = false"),
    ("users", "password_hash", "UPDATE users SET password_hash = 'scrypt$1$1$1$AA==$AA=='"),
]


# the facts the issue names (plain values, so a test can put them back)
NAMED_IN_THE_ISSUE = {
    ("studies", "patient_id"),
    ("series", "series_instance_uid"),
    ("runs", "model_version"),
    ("findings", "center_x_mm"),
    ("findings", "slice_index"),
    ("findings", "kind"),
    ("users", "role"),
}


def _first_id(store: Store, table: str) -> int:
    with store.engine.connect() as connection:
        return int(connection.execute(text(f"SELECT min(id) FROM {table}")).scalar_one())


def _tamper(store: Store, table: str, statement: str) -> int:
    row = _first_id(store, table)
    with store.engine.begin() as connection:
        connection.execute(text(f"{statement} WHERE id = {row}"))
    return row


def _verify(store: Store):  # type: ignore[no-untyped-def]
    with store.reader() as session:
        return verify(session)


@pytest.mark.parametrize(("table", "field", "statement"), TAMPERING)
def test_tampering_a_covered_field_is_named(
    store: Store,
    stored: int,
    users: dict[str, User],
    table: str,
    field: str,
    statement: str,
) -> None:
    assert _verify(store).ok
    row = _tamper(store, table, statement)
    report = _verify(store)
    assert not report.ok
    assert (report.table, report.row_id, report.field) == (table, row, field)
    assert f"table {table}, row {row}, field {field}:" in (report.problem or "")
    assert "changed outside radcaliper" in (report.problem or "")


@pytest.mark.parametrize(
    ("table", "field", "statement"),
    [case for case in TAMPERING if case[:2] in NAMED_IN_THE_ISSUE],
)
def test_the_command_line_exits_1_naming_table_row_and_field(
    store: Store,
    stored: int,
    users: dict[str, User],
    table: str,
    field: str,
    statement: str,
) -> None:
    intact = runner.invoke(app, ["audit", "verify", "--db", store.url])
    assert intact.exit_code == 0 and "intact" in intact.stdout
    row = _tamper(store, table, statement)
    tampered = runner.invoke(app, ["audit", "verify", "--db", store.url])
    assert tampered.exit_code == 1
    flat = " ".join(tampered.output.split())
    assert f"table {table}, row {row}, field {field}" in flat


def test_a_row_added_or_deleted_behind_the_log_is_named(store: Store, stored: int) -> None:
    with store.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO studies (study_instance_uid, patient_id, created_at) "
                "VALUES ('1.2.3.9', 'P', :now)"
            ),
            {"now": datetime.now(UTC)},
        )
    report = _verify(store)
    added = _first_id(store, "studies") + 1
    assert not report.ok and (report.table, report.row_id, report.field) == (
        "studies",
        added,
        None,
    )
    assert "not in the audit log: it was added outside radcaliper" in (report.problem or "")
    with store.engine.begin() as connection:
        connection.execute(text(f"DELETE FROM studies WHERE id = {added}"))
        finding = connection.execute(text("SELECT max(id) FROM findings")).scalar_one()
        connection.execute(text(f"DELETE FROM measurements WHERE finding_id = {finding}"))
        connection.execute(text(f"DELETE FROM findings WHERE id = {finding}"))
    report = _verify(store)
    assert not report.ok and (report.table, report.row_id) == ("findings", finding)
    assert "but not in the table: it was deleted" in (report.problem or "")


def test_a_second_run_on_the_same_series_records_only_its_own_rows(
    store: Store, stored: int, volume: Any
) -> None:
    from tests.support.db import make_result, store_one

    store_one(store, make_result(volume, version="2.0.0"), volume)
    assert _verify(store).ok
    with store.reader() as session:
        last_run = session.execute(
            select(AuditEvent).where(AuditEvent.action == "run.stored").order_by(AuditEvent.id)
        ).scalars()
        recorded = [set(event.details["rows"]) for event in last_run]
    assert recorded == [{"studies", "series", "runs", "findings"}, {"runs", "findings"}]
    _tamper(store, "runs", "UPDATE runs SET model_version = '0.0.1'")
    assert _verify(store).field == "model_version"


# --- databases from before the coverage -----------------------------------------------------------


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_an_upgraded_old_database_verifies_and_then_detects_tampering(
    empty_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    old_database(empty_url)
    with caplog.at_level(logging.WARNING):
        upgrade(empty_url, actor="cli:admin")
    assert "baseline audit events 5..9" in caplog.text and "signed off by cli:admin" in caplog.text
    store = open_store(empty_url)
    try:
        assert _verify(store).ok
        with store.reader() as session:
            baseline = session.execute(
                select(AuditEvent).where(AuditEvent.action == "audit.baseline")
            ).scalars()
            tables = [(e.actor, set(e.details["rows"])) for e in baseline]
        assert tables == [
            ("cli:admin", {"users"}),
            ("cli:admin", {"studies"}),
            ("cli:admin", {"series"}),
            ("cli:admin", {"runs"}),
            ("cli:admin", {"findings"}),
        ]
        # what radcaliper stores after the upgrade is covered the usual way
        with store.writer() as session:
            add_user(session, "alice", Role.REVIEWER, password="correct horse", actor="cli:t")
            session.commit()
        assert _verify(store).ok
        for table, field, statement in TAMPERING:
            if (table, field) not in NAMED_IN_THE_ISSUE:
                continue
            row = _tamper(store, table, statement)
            report = _verify(store)
            assert (report.ok, report.table, report.row_id, report.field) == (
                False,
                table,
                row,
                field,
            ), statement
            _untamper(store, report)
    finally:
        store.dispose()


def _untamper(store: Store, report: Any) -> None:
    """Put the logged value back (what an administrator does after verify named it)."""
    with store.reader() as session:
        event_id = int(report.problem.split("(event ")[1].split(")")[0])
        event = session.get(AuditEvent, event_id)
        assert event is not None
    from db.audit.coverage import logged_states

    (state,) = [
        s
        for table, row, s in logged_states(
            event.object_type, event.object_id, event.details, action=event.action
        )
        if (table, row) == (report.table, report.row_id)
    ]
    with store.engine.begin() as connection:
        tables = MetaData()
        tables.reflect(connection, only=[report.table])
        table = tables.tables[report.table]
        connection.execute(
            table.update()
            .where(table.c.id == report.row_id)
            .values({report.field: state[report.field]})
        )
    assert _verify(store).ok, report


def test_a_new_database_gets_no_baseline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    try:
        report = _verify(store)
        assert report.ok and report.events == 1  # the schema event: created at the head
        with store.reader() as session:
            (event,) = session.execute(select(AuditEvent)).scalars()
        assert (event.action, event.details) == (
            "schema.upgraded",
            {"from": None, "to": SCHEMA_HEAD},
        )
        assert not session.execute(
            select(AuditEvent).where(AuditEvent.action == "audit.baseline")
        ).first()
    finally:
        store.dispose()
