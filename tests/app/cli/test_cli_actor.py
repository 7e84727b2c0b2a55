"""Issue 41, item 7: the audit log's actor for a command is the user the process runs as (its
real uid's name), never what ``$USER`` or ``$LOGNAME`` claim: ``USER=dr_smith radcaliper users
add`` was logged as ``cli:dr_smith``."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.console import cli_actor

runner = CliRunner()


def test_the_actor_is_the_real_user_whatever_the_environment_says(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'site.sqlite3'}"
    me = pwd.getpwuid(os.getuid()).pw_name
    claims = {"USER": "dr_smith", "LOGNAME": "dr_smith", "LNAME": "dr_smith", "USERNAME": "x"}
    added = runner.invoke(
        app, ["users", "add", "alice", "--role", "reviewer", "--db", url], env=claims
    )
    assert added.exit_code == 0, added.output
    log = runner.invoke(app, ["audit", "log", "--format", "json", "--db", url])
    assert log.exit_code == 0, log.output
    actors = {row["actor"] for row in json.loads(log.stdout)}
    assert f"cli:{me}" in actors and not any("dr_smith" in a for a in actors), actors


def test_a_uid_without_a_name_is_named_by_its_number(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_name(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_name)
    monkeypatch.setenv("USER", "dr_smith")
    assert cli_actor() == f"cli:uid={os.getuid()}"
