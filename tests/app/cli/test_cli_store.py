"""The store's commands: db, users, audit, and measure storing its result."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from app.cli import app
from db.engine import connect
from db.migrate import head_revision, upgrade
from ingestion.phantoms import write_phantoms
from model.measurer.data.sources import PhantomSource
from model.measurer.train.loop import train

from tests.support.measurer import TINY

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(TINY, tmp_path_factory.mktemp("tiny_model"), PhantomSource(1))


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one_study")
    write_phantoms(root / "s", n=1, seed=4711)
    return root / "s" / "phantom_0000" / "dicom"


def _db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'site.sqlite3'}"


def test_db_upgrade_current_downgrade(tmp_path: Path) -> None:
    url = _db(tmp_path)
    before = runner.invoke(app, ["db", "current", "--db", url])
    assert before.exit_code == 0 and "schema none" in before.stdout
    up = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert up.exit_code == 0 and f"is at schema {head_revision()}" in up.stdout
    down = runner.invoke(app, ["db", "downgrade", "base", "--db", url])
    assert down.exit_code == 0 and "base (no tables)" in down.stdout


def test_a_database_of_an_older_schema_says_what_to_do(
    tmp_path: Path, study: Path, tiny_model: Path
) -> None:
    url = _db(tmp_path)
    upgrade(url, "0002")
    result = runner.invoke(app, ["measure", str(study), "--model", str(tiny_model), "--db", url])
    assert result.exit_code == 2
    flat = " ".join(result.output.split())
    assert "schema version 0002" in flat and "radcaliper db upgrade" in flat
    unreachable = runner.invoke(
        app, ["audit", "log", "--db", "postgresql://nobody@127.0.0.1:1/none"]
    )
    assert unreachable.exit_code == 2 and "cannot reach the database" in unreachable.output


def test_users_add_and_list(tmp_path: Path) -> None:
    url = _db(tmp_path)
    runner.invoke(app, ["db", "upgrade", "--db", url])
    added = runner.invoke(
        app,
        ["users", "add", "alice", "--role", "reviewer", "--password-stdin", "--db", url],
        input="correct horse battery\n",
    )
    assert added.exit_code == 0, added.output
    again = runner.invoke(app, ["users", "add", "alice", "--role", "admin", "--db", url])
    assert again.exit_code == 2 and "exists already" in again.output
    bad = runner.invoke(app, ["users", "add", "bob", "--role", "boss", "--db", url])
    assert bad.exit_code == 2 and "use reviewer, auditor or admin" in bad.output
    short = runner.invoke(
        app,
        ["users", "add", "carl", "--role", "auditor", "--password-stdin", "--db", url],
        input="short\n",
    )
    assert short.exit_code == 2 and "at least 8" in short.output
    listed = runner.invoke(app, ["users", "list", "--db", url])
    assert "alice" in listed.stdout and "reviewer" in listed.stdout
    assert "correct horse" not in listed.stdout


def test_measure_stores_once_and_the_audit_commands_show_it(
    tmp_path: Path, study: Path, tiny_model: Path
) -> None:
    url = _db(tmp_path)
    runner.invoke(app, ["db", "upgrade", "--db", url])
    first = runner.invoke(app, ["measure", str(study), "--model", str(tiny_model), "--db", url])
    assert first.exit_code == 0, first.output
    assert "stored as run 1" in first.output
    second = runner.invoke(app, ["measure", str(study), "--model", str(tiny_model), "--db", url])
    assert "already stored as run 1" in second.output
    log = runner.invoke(app, ["audit", "log", "--db", url, "--format", "json"])
    events = json.loads(log.stdout)
    assert [e["action"] for e in events if e["action"] == "run.stored"] == ["run.stored"]
    assert events[0]["actor"].startswith("cli:")
    rows = runner.invoke(app, ["audit", "measurements", "--db", url, "--format", "csv"])
    assert rows.exit_code == 0
    header = next(csv.reader(io.StringIO(rows.stdout)))
    assert header[:3] == ["study_instance_uid", "patient_id", "finding_id"]
    table = runner.invoke(app, ["audit", "measurements", "--db", url, "--status", "pending"])
    assert table.exit_code == 0 and "row(s)" in table.stdout
    wrong = runner.invoke(app, ["audit", "measurements", "--db", url, "--status", "maybe"])
    assert wrong.exit_code == 2 and "use pending" in wrong.output
    bad_date = runner.invoke(app, ["audit", "log", "--db", url, "--since", "last tuesday"])
    assert bad_date.exit_code == 2 and "not a date" in bad_date.output
    no_store = runner.invoke(
        app, ["measure", str(study), "--model", str(tiny_model), "--no-store", "--db", "nonsense"]
    )
    assert no_store.exit_code == 0 and "stored" not in no_store.output


def test_audit_verify_exit_codes(tmp_path: Path, study: Path, tiny_model: Path) -> None:
    url = _db(tmp_path)
    runner.invoke(app, ["db", "upgrade", "--db", url])
    runner.invoke(app, ["users", "add", "ida", "--role", "auditor", "--db", url])
    runner.invoke(app, ["measure", str(study), "--model", str(tiny_model), "--db", url])
    intact = runner.invoke(app, ["audit", "verify", "--db", url])
    assert intact.exit_code == 0 and "intact" in intact.stdout
    head = intact.stdout.split("head ")[1].strip()
    assert runner.invoke(app, ["audit", "verify", "--db", url, "--head", head]).exit_code == 0
    engine = connect(url)
    with engine.begin() as connection:
        connection.execute(text("DROP TRIGGER audit_events_no_update"))
        connection.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE id = 1"))
    engine.dispose()
    tampered = runner.invoke(app, ["audit", "verify", "--db", url])
    assert tampered.exit_code == 1
    assert "TAMPERED" in tampered.output and "audit event 1" in tampered.output


def test_the_default_database_is_created_in_the_data_dir(study: Path, tiny_model: Path) -> None:
    result = runner.invoke(app, ["measure", str(study), "--model", str(tiny_model), "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # the store's note went to stderr, not into the JSON
    verify = runner.invoke(app, ["audit", "verify"])
    assert verify.exit_code == 0 and "intact" in verify.stdout
