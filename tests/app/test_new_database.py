"""A new, empty database gets the schema by itself where radcaliper stores (batch, measure,
serve, users add), with one log line; an older schema is still refused; the SQLite file and the
data dir are owner-only; the first start says what it is doing when nobody watches a terminal."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from app.cli import app
from app.files import owner_only_dir
from app.progress import steps_display
from db.engine import open_store
from db.migrate import head_revision, upgrade
from db.models import Run
from ingestion.phantoms import write_phantoms

from tests.support.batch import SMALL

runner = CliRunner()


@pytest.fixture(scope="module")
def one_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    write_phantoms(root / "study", n=1, seed=31, spec=SMALL)
    return root


def _runs(url: str) -> int:
    store = open_store(url)
    try:
        with store.reader() as session:
            return int(session.execute(select(func.count()).select_from(Run)).scalar_one())
    finally:
        store.dispose()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_batch_on_a_new_database_creates_the_schema_and_stores(
    empty_url: str, one_study: Path, tmp_path: Path
) -> None:
    args = ["batch", str(one_study), "--db", empty_url, "--work", str(tmp_path / "work")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert f"a new, empty database: created the radcaliper schema {head_revision()}" in flat
    assert flat.count("created the radcaliper schema") == 1
    assert _runs(empty_url) == 1
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "created the radcaliper schema" not in again.output
    assert _runs(empty_url) == 1


def test_a_new_sqlite_file_and_its_folders_are_owner_only(one_study: Path, tmp_path: Path) -> None:
    database = tmp_path / "site" / "db" / "new.sqlite3"
    args = ["batch", str(one_study), "--db", f"sqlite:///{database}"]
    result = runner.invoke(app, [*args, "--work", str(tmp_path / "work")])
    assert result.exit_code == 0, result.output
    for path in (database, *database.parent.glob("new.sqlite3-*")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for folder in (tmp_path / "site", tmp_path / "site" / "db"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_an_older_schema_is_still_refused(empty_url: str, one_study: Path, tmp_path: Path) -> None:
    upgrade(empty_url, "0002")
    args = ["batch", str(one_study), "--db", empty_url, "--work", str(tmp_path / "work")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    flat = " ".join(result.output.split())
    assert "schema version 0002" in flat and "radcaliper db upgrade" in flat


def test_reading_commands_never_create_a_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'typo.sqlite3'}"
    verify = runner.invoke(app, ["audit", "verify", "--db", url])
    assert verify.exit_code == 2 and "no radcaliper schema" in " ".join(verify.output.split())
    measurements = runner.invoke(app, ["audit", "measurements", "--db", url])
    assert measurements.exit_code == 2


def test_an_existing_world_readable_database_and_data_dir_are_tightened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    database = data / "old.sqlite3"
    upgrade(f"sqlite:///{database}")
    database.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        owner_only_dir(data)
        open_store(f"sqlite:///{database}").dispose()
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE(database.stat().st_mode) == 0o640
    assert "was open to other users" in caplog.text
    assert "was readable by other users" in caplog.text


def test_the_first_start_prints_plain_steps_without_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with steps_display("preparing the demo") as status:
        status.update("measuring demo study 1/3 (phantom_0000)")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("preparing the demo: started (elapsed")
    assert lines[1].startswith("preparing the demo: measuring demo study 1/3 (phantom_0000)")
    assert lines[2].startswith("preparing the demo: done (elapsed")
