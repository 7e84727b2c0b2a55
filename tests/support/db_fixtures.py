"""Fixtures of the store's tests (a pytest plugin of tests/conftest.py): real databases, an
SQLite file and a fresh PostgreSQL database.

PostgreSQL comes from ``RADCALIPER_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``, the server ``.ci/run`` makes sure of). Each test
gets its own database, copied from a template that was migrated once per session. An unreachable
server fails the tests: the store must work on both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import Role, User
from db.users import add_user
from ingestion.phantoms import generate_phantom
from ingestion.volume import Volume
from model.measurer.inputs.data import phantom_volume

from tests.support.db import make_result, store_one

POSTGRES = os.environ.get(
    "RADCALIPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ["sqlite", "postgresql"]


def _admin(url: str) -> psycopg.Connection:
    parsed = make_url(url)
    return psycopg.connect(
        host=parsed.host,
        port=parsed.port or 5432,
        user=parsed.username,
        password=parsed.password,
        dbname=parsed.database,
        autocommit=True,
    )


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _copy_of(template: str) -> tuple[Store, str]:
    """A new PostgreSQL database copied from ``template``, opened; and its name."""
    name = f"radcaliper_test_{uuid.uuid4().hex[:10]}"
    with _admin(POSTGRES) as connection:
        connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return open_store(_with_database(POSTGRES, name)), name


def _drop(opened: Store, name: str) -> None:
    opened.dispose()
    with _admin(POSTGRES) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    name = f"radcaliper_template_{uuid.uuid4().hex[:8]}"
    with _admin(POSTGRES) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    upgrade(_with_database(POSTGRES, name))
    yield name
    with _admin(POSTGRES) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database without tables: ``request.param`` is the backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite3'}"
        return
    name = f"radcaliper_test_{uuid.uuid4().hex[:10]}"
    with _admin(POSTGRES) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield _with_database(POSTGRES, name)
    with _admin(POSTGRES) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty store on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
        upgrade(url)
        opened = open_store(url)
        yield opened
        opened.dispose()
        return
    opened, name = _copy_of(request.getfixturevalue("postgres_template"))
    yield opened
    _drop(opened, name)


@pytest.fixture(params=BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Make migrated, empty stores on each backend, as many as a test needs (to compare two
    databases); all are dropped at the end."""
    template = request.getfixturevalue("postgres_template") if request.param != "sqlite" else ""
    made: list[tuple[Store, str | None]] = []

    def make() -> Store:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / f'store{len(made)}.sqlite3'}"
            upgrade(url)
            made.append((open_store(url), None))
        else:
            made.append(_copy_of(template))
        return made[-1][0]

    yield make
    for opened, name in made:
        if name is None:
            opened.dispose()
        else:
            _drop(opened, name)


@pytest.fixture(scope="session")
def volume() -> Volume:
    return phantom_volume(generate_phantom(21))


@pytest.fixture
def stored(store: Store, volume: Volume) -> int:
    """The run id of one stored result."""
    return store_one(store, make_result(volume), volume).run_id


@pytest.fixture
def users(store: Store) -> dict[str, User]:
    out = {}
    with store.writer() as session:
        for name, role in (("alice", Role.REVIEWER), ("bob", Role.REVIEWER), ("ida", Role.AUDITOR)):
            out[name] = add_user(session, name, role, password="correct horse", actor="cli:test")
        session.commit()
    return out


@pytest.fixture(scope="module")
def postgres_factory(postgres_template: str) -> Iterator[Callable[[], Store]]:
    """Fresh migrated PostgreSQL stores shared by a module's tests (e.g. one reference run that
    several tests compare with); all are dropped at the module's end."""
    made: list[tuple[Store, str]] = []

    def make() -> Store:
        made.append(_copy_of(postgres_template))
        return made[-1][0]

    yield make
    for opened, name in made:
        _drop(opened, name)
