"""``radcaliper users``: add, list, unlock, disable, enable, passwd and role on the command line
(issue 41, attack 2); each change an audit event by the OS user; refusals exit 2 with one line.
On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from app.cli import app
from app.console import cli_actor
from db.engine import Store
from db.logins import LoginLimits, record_failure
from db.models import AuditEvent, Role
from db.users import add_user, get_user, verify_password

runner = CliRunner()
PASSWORD = "correct horse"


def _run(store: Store, *args: str, stdin: str | None = None) -> tuple[int, str]:
    result = runner.invoke(app, ["users", *args, "--db", store.url], input=stdin)
    return result.exit_code, result.output


@pytest.fixture
def people(store: Store) -> Store:
    with store.writer() as session:
        add_user(session, "root", Role.ADMIN, password=PASSWORD, actor="cli:test")
        add_user(session, "alice", Role.REVIEWER, password=PASSWORD, actor="cli:test")
        session.commit()
    return store


def _last_event(store: Store) -> AuditEvent:
    with store.reader() as session:
        event = session.execute(select(AuditEvent).order_by(AuditEvent.id.desc())).scalars().first()
        assert event is not None
        return event


def test_the_help_lists_every_command() -> None:
    result = runner.invoke(app, ["users", "--help"])
    assert result.exit_code == 0
    for command in ("add", "list", "unlock", "disable", "enable", "passwd", "role"):
        assert f" {command} " in result.output, command
    for command in ("unlock", "disable", "enable", "passwd", "role"):
        assert runner.invoke(app, ["users", command, "--help"]).exit_code == 0


def test_each_change_is_made_and_audited(people: Store) -> None:
    actor = cli_actor()
    code, said = _run(people, "disable", "alice")
    assert code == 0 and "Disabled 'alice'" in said
    assert (_last_event(people).actor, _last_event(people).action) == (actor, "user.disabled")
    code, said = _run(people, "enable", "alice")
    assert code == 0 and _last_event(people).action == "user.enabled"
    code, said = _run(people, "role", "alice", "auditor")
    assert code == 0 and "'alice' is now auditor" in said
    event = _last_event(people)
    assert event.action == "user.role_changed"
    assert (event.details["before"], event.details["after"]) == ("reviewer", "auditor")
    code, said = _run(people, "passwd", "alice", "--password-stdin", stdin="a new secret\n")
    assert code == 0 and "must change it at the next login" in said
    assert _last_event(people).action == "user.password_reset"
    with people.reader() as session:
        alice = get_user(session, "alice")
        assert alice is not None and alice.must_change_password and alice.role is Role.AUDITOR
        assert verify_password(alice.password_hash, "a new secret")
    code, said = _run(people, "list")
    assert code == 0
    row = next(line for line in said.splitlines() if "alice" in line)
    assert "auditor" in row and row.count("True") == 3  # active, password, must change


def test_unlock_and_locks_in_the_list(people: Store) -> None:
    limits = LoginLimits()  # the settings' defaults: what `users list` reckons with
    with people.writer() as session:
        for _ in range(limits.free_failures):
            record_failure(session, "alice", "10.6.6.6", limits, datetime.now(UTC))
        session.commit()
    code, said = _run(people, "list")
    row = next(line for line in said.splitlines() if "alice" in line)
    assert code == 0 and "from 10.6.6.6 until" in row
    code, said = _run(people, "unlock", "alice", "--address", "10.6.6.6")
    assert code == 0 and "Unlocked 'alice' from 10.6.6.6: 5 failed login(s) forgotten" in said
    event = _last_event(people)
    assert (event.action, event.details["address"], event.details["failures"]) == (
        "user.unlocked",
        "10.6.6.6",
        5,
    )
    code, said = _run(people, "list")
    assert "10.6.6.6" not in said


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("disable", "root"), None, "'root' is the last enabled admin: cannot disable"),
        (("role", "root", "reviewer"), None, "last enabled admin: cannot demote"),
        (("role", "alice", "superuser"), None, "role 'superuser': use reviewer, auditor or admin"),
        (("disable", "nobody"), None, "there is no user 'nobody'"),
        (("passwd", "alice", "--password-stdin"), "short\n", "at least 8 characters"),
        (("passwd", "alice", "--password-stdin"), "alice-2026!\n", "must not contain the user"),
        (("passwd", "nobody", "--password-stdin"), "a fine secret\n", "no user 'nobody'"),
        (("add", "bob", "--role", "reviewer", "--password-stdin"), "bob12345\n", "user name"),
    ],
)
def test_refusals_exit_2_with_one_line_and_change_nothing(
    people: Store, args: tuple[str, ...], stdin: str | None, message: str
) -> None:
    before = _last_event(people).id
    code, said = _run(people, *args, stdin=stdin)
    assert code == 2, said
    assert message in said and "Traceback" not in said
    assert len([line for line in said.splitlines() if line.strip()]) <= 2  # one message
    assert _last_event(people).id == before


def test_passwd_asks_twice_without_stdin(people: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["a fine secret", "a different one"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    code, said = _run(people, "passwd", "alice")
    assert code == 2 and "the two passwords differ; nothing changed" in said
