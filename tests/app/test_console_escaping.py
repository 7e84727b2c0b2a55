"""Text from the database is printed as text: rich markup in a stored user name or audit actor
is shown, not applied, and terminal control sequences are shown as escapes, never sent."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.console import printable, safe
from db.audit import append_event
from db.engine import open_store
from db.migrate import upgrade
from db.models import Role, User

runner = CliRunner()

MARKUP_NAME = "[reverse]root[/reverse]"
# clear the screen, set the window title, ring the bell, return to the line start, and turn
# the rest right-to-left: all of it must arrive as visible escapes
CONTROL_NAME = "eve\x1b[2J\x1b]0;pwned\x07\rX\u202etxt"


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A database whose user table and audit log hold names radcaliper would never write: the
    user table was edited directly (``users add`` refuses such names), and the audit actor came
    from a failed login, which may be any text."""
    url = f"sqlite:///{tmp_path / 'site.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    with store.writer() as session:
        for name in (MARKUP_NAME, CONTROL_NAME):
            session.add(User(name=name, role=Role.ADMIN, active=True, created_at=datetime.now(UTC)))
            append_event(
                session,
                actor=name,
                action="login.refused",
                object_type="session",
                object_id=None,
                details={},
            )
        session.commit()
    store.dispose()
    return url


def _no_controls(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "\u202e" not in text


def test_stored_names_are_printed_as_text(url: str) -> None:
    for command in (["users", "list"], ["audit", "log"]):
        result = runner.invoke(app, [*command, "--db", url], env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        assert MARKUP_NAME in result.stdout, command  # shown, not turned into reverse video
        _no_controls(result.stdout)
        assert "eve\\x1b[2J\\x1b]0;pwned\\x07\\x0dX\\u202etxt" in result.stdout, command


def test_csv_output_carries_no_terminal_controls(url: str) -> None:
    result = runner.invoke(app, ["audit", "log", "--format", "csv", "--db", url])
    assert result.exit_code == 0, result.output
    assert MARKUP_NAME in result.stdout
    _no_controls(result.stdout.replace("\r\n", "\n"))


def test_errors_quoting_input_show_it_as_text(url: str) -> None:
    result = runner.invoke(app, ["audit", "log", "--since", MARKUP_NAME, "--db", url])
    assert result.exit_code == 2
    assert MARKUP_NAME in result.output


def test_the_helpers() -> None:
    assert printable(None) == ""
    assert printable("PAT-Ünïcödé-日本") == "PAT-Ünïcödé-日本"  # text is kept
    assert printable("a\nb\tc\x9b") == "a\\x0ab\\x09c\\x9b"
    assert safe("[bold]x[/bold]") == "\\[bold]x\\[/bold]"
