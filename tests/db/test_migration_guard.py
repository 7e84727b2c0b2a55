"""A migration never launders the audit chain (issue 41, attack 1).

Someone with SQL write access, but not to a head hash kept outside the database, tampers with
rows, then sets the schema version back (dropping the columns of later revisions) so that an
administrator runs ``radcaliper db upgrade`` and migration 0003 records the tampered rows as a
new baseline. The upgrade must refuse (exit 2, naming the first difference) whenever the log
does not vouch for the database; ``audit verify`` exits 1 for the log's own guards (the
append-only triggers, the head row). A genuine older database still upgrades.
"""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData, select, text
from typer.testing import CliRunner

from app.cli import app
from db.audit import verify
from db.audit.coverage import COVERED_TABLES
from db.engine import Store, connect, current, open_store
from db.migrate import SCHEMA_HEAD, downgrade, upgrade
from db.models import AuditEvent, Role, Study, User
from db.users import add_user
from ingestion.errors import MigrationRefusedError

from tests.support.db import as_attacker

runner = CliRunner()


def _sql(store: Store, *statements: str) -> None:
    """Raw SQL as someone with write access (the triggers left in place)."""
    with store.engine.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))


def _events(store: Store) -> list[tuple[int, str]]:
    with store.reader() as session:
        rows = session.execute(select(AuditEvent.id, AuditEvent.action).order_by(AuditEvent.id))
        return [(row.id, row.action) for row in rows]


def _named(store: Store, name: str) -> int:
    with store.reader() as session:
        user = session.execute(select(User).where(User.name == name)).scalar_one()
        return user.id


def _upgrade_cli(url: str) -> object:
    return runner.invoke(app, ["db", "upgrade", "--db", url])


def _verify_cli(url: str) -> object:
    return runner.invoke(app, ["audit", "verify", "--db", url])


def _refused(store: Store, revision: str | None, match: str) -> None:
    """``db upgrade`` refuses, exit 2 naming ``match``; nothing was migrated or logged."""
    before = _events(store)
    store.dispose()
    with pytest.raises(MigrationRefusedError, match=match):
        upgrade(store.url, actor="cli:admin")
    result = _upgrade_cli(store.url)
    assert result.exit_code == 2, result.output
    assert "refused to migrate" in result.output
    assert current(store.url) == revision
    assert _events(store) == before  # no baseline, no schema event


@pytest.fixture
def filled(store: Store, stored: int, users: dict[str, User]) -> Store:
    """A store at the head with a stored result (no patient name) and three users."""
    return store


def test_a_faked_0002_with_a_dropped_column_is_refused_naming_the_row(filled: Store) -> None:
    alice = _named(filled, "alice")
    _sql(
        filled,
        f"UPDATE users SET role = 'admin' WHERE id = {alice}",
        "ALTER TABLE studies DROP COLUMN patient_name",
        "UPDATE alembic_version SET version_num = '0002'",
    )
    _refused(filled, "0002", f"table users, row {alice}, field role: 'admin' in the table")
    # an auditor sees it too, at the database's (faked) schema
    result = _verify_cli(filled.url)
    assert result.exit_code == 1 and f"table users, row {alice}, field role" in result.output


def test_a_faked_0002_without_other_changes_is_refused_by_the_schema_events(
    filled: Store,
) -> None:
    _sql(
        filled,
        "ALTER TABLE studies DROP COLUMN patient_name",
        "UPDATE alembic_version SET version_num = '0002'",
    )
    _refused(
        filled,
        "0002",
        f"migrated to schema {SCHEMA_HEAD} \\(event 1\\) but the database says schema 0002",
    )


def test_a_faked_0001_is_refused_naming_the_lost_column(filled: Store) -> None:
    """Set back two revisions: the series' geometry, which the log holds, goes with its
    column, and that shows (before any schema event is even read)."""
    _sql(
        filled,
        "ALTER TABLE studies DROP COLUMN patient_name",
        "ALTER TABLE series DROP COLUMN geometry",
        "UPDATE alembic_version SET version_num = '0001'",
    )
    _refused(
        filled,
        "0001",
        "table series, row 1, field geometry: None in the table \\(the column is missing\\)",
    )


def test_a_faked_0002_with_a_moved_finding_is_refused_naming_it(filled: Store) -> None:
    """Findings are covered whole only from 0003, but the rows the log records are compared
    at any schema."""
    _sql(
        filled,
        "UPDATE findings SET center_x_mm = center_x_mm + 40 WHERE number = 1",
        "ALTER TABLE studies DROP COLUMN patient_name",
        "UPDATE alembic_version SET version_num = '0002'",
    )
    _refused(filled, "0002", "table findings, row 1, field center_x_mm")


def test_a_removed_schema_version_is_refused(filled: Store) -> None:
    _sql(filled, "DELETE FROM alembic_version")
    _refused(filled, None, "has radcaliper's tables but no schema version")


def test_dropped_append_only_triggers_are_reported_and_refuse_a_migration(filled: Store) -> None:
    as_attacker(filled)  # drops the triggers, changes nothing else
    result = _verify_cli(filled.url)
    assert result.exit_code == 1, result.output
    assert "append-only trigger" in result.output and "is missing" in result.output
    filled.dispose()
    with pytest.raises(MigrationRefusedError, match=r"append-only trigger .* is missing"):
        downgrade(filled.url, "0002", actor="cli:admin")


def test_a_replaced_append_only_trigger_is_reported(filled: Store) -> None:
    if filled.backend == "sqlite":
        statements = (
            "DROP TRIGGER audit_events_no_delete",
            "CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events "
            "BEGIN SELECT 1; END",
        )
    else:
        statements = (
            "CREATE OR REPLACE FUNCTION audit_events_append_only() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN RETURN OLD; END $$",
        )
    _sql(filled, *statements)
    report = _verify(filled)
    assert not report.ok and "is not the one radcaliper created" in (report.problem or "")


def test_a_disabled_postgres_trigger_is_reported(store: Store, stored: int) -> None:
    if store.backend != "postgresql":
        _sql(store, "DROP TRIGGER audit_events_no_update")
        assert "audit_events_no_update is missing" in (_verify(store).problem or "")
        return
    _sql(store, "ALTER TABLE audit_events DISABLE TRIGGER audit_events_append_only")
    assert "is disabled" in (_verify(store).problem or "")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_head SET last_hash = '" + "a" * 64 + "'",
        "UPDATE audit_head SET last_id = last_id + 1",
        "INSERT INTO audit_head (id, last_id, last_hash) VALUES (2, 0, '" + "0" * 64 + "')",
    ],
)
def test_an_edited_audit_head_is_reported_and_refuses_a_migration(
    filled: Store, statement: str
) -> None:
    _sql(filled, statement)
    result = _verify_cli(filled.url)
    assert result.exit_code == 1, result.output
    assert "head" in result.output
    _sql(filled, "UPDATE alembic_version SET version_num = '0002'")
    filled.dispose()
    with pytest.raises(MigrationRefusedError, match="head"):
        upgrade(filled.url)


def _verify(store: Store):  # type: ignore[no-untyped-def]
    with store.reader() as session:
        return verify(session)


def test_a_recorded_downgrade_and_upgrade_keep_the_log_intact(filled: Store) -> None:
    """A downgrade the log records (the patient names it drops recorded as gone), then the
    upgrade again: no baseline (the log covers every table already), verify intact."""
    with filled.writer() as session:
        study = session.execute(select(Study)).scalar_one()
        study_id = study.id
    _sql(filled, f"UPDATE studies SET patient_name = 'DOE^JANE' WHERE id = {study_id}")
    # radcaliper itself never writes a name without logging it: log this one the usual way
    from db.audit import append_event
    from db.audit.coverage import states_detail

    with filled.writer() as session:
        study = session.get(Study, study_id)
        assert study is not None
        append_event(
            session,
            actor="cli:test",
            action="study.named",
            object_type="study",
            object_id=study_id,
            details={"rows": states_detail({"studies": [study]})},
        )
        session.commit()
    assert _verify(filled).ok
    filled.dispose()
    downgrade(filled.url, "0002", actor="cli:admin")
    actions = [action for _, action in _events(filled)]
    assert actions[-2:] == ["schema.data_dropped", "schema.downgraded"]
    result = _verify_cli(filled.url)  # at 0002: intact
    assert result.exit_code == 0, result.output
    upgrade(filled.url, actor="cli:admin")
    actions = [action for _, action in _events(filled)]
    assert actions[-1] == "schema.upgraded" and "audit.baseline" not in actions
    reopened = open_store(filled.url)
    try:
        assert _verify(reopened).ok
    finally:
        reopened.dispose()


def test_a_tampered_database_is_not_downgraded(filled: Store) -> None:
    _sql(filled, "UPDATE measurements SET value_mm = 99 WHERE id = 1")
    filled.dispose()
    with pytest.raises(MigrationRefusedError, match="table measurements, row 1, field value_mm"):
        downgrade(filled.url, "0002")
    assert current(filled.url) == SCHEMA_HEAD


def test_every_covered_table_is_known_to_the_guard() -> None:
    from db.audit.coverage import COVERED_SINCE

    assert set(COVERED_SINCE) == set(COVERED_TABLES)


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_a_genuine_0002_database_upgrades_on_the_command_line(empty_url: str) -> None:
    """What radcaliper of schema 0002 stored (tests/support/old_database.py's rows and
    events) upgrades with exit 0 and verifies."""
    from tests.support.old_database import old_database

    old_database(empty_url)
    result = _upgrade_cli(empty_url)
    assert result.exit_code == 0, result.output
    assert current(empty_url) == SCHEMA_HEAD
    assert _verify_cli(empty_url).exit_code == 0


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize(
    ("statement", "match"),
    [
        ("UPDATE measurements SET value_mm = 12.5", "table measurements, row 1, field value_mm"),
        ("UPDATE users SET role = 'admin'", "table users, row 1, field role: 'admin'"),
        (
            "INSERT INTO users (name, role, active, created_at) "
            "VALUES ('mallory', 'admin', true, '2026-11-20 12:00:00')",
            "table users, row 2: not in the audit log",
        ),
        (
            "INSERT INTO runs (series_id, model_name, model_version, numeric_mode, "
            "checkpoint_hash, not_for_clinical_use, settings, input_fingerprint, source, "
            "status, warnings, started_at, finished_at) SELECT series_id, model_name, "
            "model_version, numeric_mode, checkpoint_hash, not_for_clinical_use, settings, "
            "'e', source, status, warnings, started_at, finished_at FROM runs WHERE id = 1",
            "table runs, row 2: not in the audit log",
        ),
    ],
)
def test_a_genuine_0002_database_tampered_in_what_its_log_covers_is_refused(
    empty_url: str, statement: str, match: str
) -> None:
    from tests.support.old_database import old_database

    old_database(empty_url)
    engine = connect(empty_url)
    with engine.begin() as connection:
        connection.execute(text(statement))
    engine.dispose()
    with pytest.raises(MigrationRefusedError, match=match):
        upgrade(empty_url, actor="cli:admin")
    assert current(empty_url) == "0002"
    engine = connect(empty_url)
    tables = MetaData()
    tables.reflect(engine, only=["audit_events"])
    with engine.connect() as connection:
        actions = connection.execute(select(tables.tables["audit_events"].c.action)).scalars()
        assert "audit.baseline" not in list(actions)
    engine.dispose()


def test_an_added_user_is_not_laundered_by_a_new_role(store: Store) -> None:
    """The users a genuine log records cannot gain a role by SQL before an upgrade either."""
    with store.writer() as session:
        add_user(session, "ida", Role.AUDITOR, password="correct horse", actor="cli:test")
        session.commit()
    _sql(store, "UPDATE users SET role = 'admin' WHERE name = 'ida'")
    assert _verify(store).field == "role"
