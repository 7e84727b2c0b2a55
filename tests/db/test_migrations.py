"""Migrations up and down on SQLite and PostgreSQL, and the schema check's clear errors."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from db.engine import connect, current, open_store
from db.migrate import SCHEMA_HEAD, downgrade, head_revision, stored_revision, upgrade
from ingestion.errors import SchemaVersionError, StorageError

TABLES = {
    "alembic_version",
    "audit_events",
    "audit_head",
    "findings",
    "login_failures",
    "measurements",
    "reviews",
    "runs",
    "series",
    "studies",
    "users",
}


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    assert current(empty_url) is None
    with pytest.raises(SchemaVersionError, match="radcaliper db upgrade"):
        open_store(empty_url)
    upgrade(empty_url)
    assert current(empty_url) == head_revision()
    engine = connect(empty_url)
    assert set(inspect(engine).get_table_names()) == TABLES
    engine.dispose()
    store = open_store(empty_url)
    store.dispose()
    downgrade(empty_url, "base")
    engine = connect(empty_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()
    upgrade(empty_url)  # types and triggers were dropped too: a second upgrade works
    assert current(empty_url) == head_revision()


def test_the_schema_check_agrees_with_alembic() -> None:
    """open_store checks against SCHEMA_HEAD (no Alembic import): the scripts' head."""
    assert head_revision() == SCHEMA_HEAD


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_the_stored_revision_is_alembics(empty_url: str) -> None:
    """stored_revision reads what Alembic's MigrationContext reads, at every revision."""

    def stored() -> str | None:
        engine = connect(empty_url)
        try:
            with engine.connect() as connection:
                return stored_revision(connection)
        finally:
            engine.dispose()

    assert stored() is None and current(empty_url) is None  # no version table
    upgrade(empty_url, "0002")
    assert stored() == current(empty_url) == "0002"
    with pytest.raises(SchemaVersionError, match=f"schema version 0002; .* needs {SCHEMA_HEAD}"):
        open_store(empty_url)
    upgrade(empty_url)
    assert stored() == current(empty_url) == SCHEMA_HEAD
    downgrade(empty_url, "base")
    assert stored() is None and current(empty_url) is None  # an empty version table


def test_the_default_sqlite_file_is_created_on_first_use(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'new' / 'radcaliper.sqlite3'}"
    store = open_store(url, create_if_empty=True)
    assert current(url) == head_revision() and store.backend == "sqlite"
    store.dispose()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nonsense", "is not a database URL"),
        ("mysql://root@127.0.0.1/test", "not supported"),
        ("postgresql://nobody@127.0.0.1:1/none", "cannot reach the database"),
    ],
)
def test_bad_urls_are_one_clear_error(url: str, message: str) -> None:
    with pytest.raises(StorageError, match=message) as caught:
        open_store(url)
    assert "\n" not in str(caught.value)


def test_passwords_never_appear_in_errors() -> None:
    with pytest.raises(StorageError) as caught:
        open_store("postgresql://user:s3cret@127.0.0.1:1/none")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_a_database_of_another_schema_version_is_refused(empty_url: str) -> None:
    from sqlalchemy import text

    upgrade(empty_url)
    engine = connect(empty_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0000'"))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match=r"schema version 0000; this radcaliper needs"):
        open_store(empty_url)
