"""Issue 41, item 3: a data dir, database file or socket folder that another local user owns or
may write is refused by every command that opens it, with one line naming the path and its
owner and exit status 2 (it was used as it was, and the other user read the password hashes).
The tests run as root: "another user" is uid 65534 (nobody), given the path with os.chown."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from db.migrate import upgrade

runner = CliRunner()
OTHER_UID = 65534


def _refused(args: list[str], data: Path, *names: str) -> None:
    """``radcaliper ARGS`` with DATA as the data dir exits 2 with one line naming ``names``."""
    result = runner.invoke(app, args, env={"RADCALIPER_DATA_DIR": str(data)})
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), args
    lines = [line for line in result.output.splitlines() if line.strip()]
    flat = " ".join(result.output.split())
    assert lines[0].startswith("error:"), (args, result.output)
    for name in names:
        assert name in flat, (args, name, result.output)
    assert "Traceback" not in result.output


@pytest.fixture
def planted_data_dir(tmp_path: Path) -> Path:
    """A data dir another user made, world-writable, with a 0666 database in it."""
    data = tmp_path / "data"
    data.mkdir()
    database = data / "radcaliper.sqlite3"
    upgrade(f"sqlite:///{database}")
    data.chmod(0o777)
    database.chmod(0o666)
    for path in (data, database):
        os.chown(path, OTHER_UID, OTHER_UID)
    return data


@pytest.mark.parametrize(
    "args",
    [
        ["users", "list"],
        ["users", "add", "mallory", "--role", "admin"],
        ["audit", "log"],
        ["audit", "verify"],
        ["batch", "no-such-root-is-looked-at-after"],
        ["resident", "--idle-exit", "0.01"],
        ["serve", "--no-demo"],
        ["measure", "no-such-study", "--no-store"],
    ],
)
def test_a_data_dir_of_another_user_is_refused(
    planted_data_dir: Path, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda app, **_: None)  # serve: never listens
    if args[0] == "batch":  # a root that exists: the data dir is checked before the scan
        args = ["batch", str(planted_data_dir.parent)]
    _refused(args, planted_data_dir, str(planted_data_dir), "nobody (uid 65534)")


def test_a_database_of_another_user_in_an_own_data_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    database = data / "radcaliper.sqlite3"
    upgrade(f"sqlite:///{database}")
    database.chmod(0o666)
    os.chown(database, OTHER_UID, OTHER_UID)
    for args in (["users", "list"], ["db", "upgrade"], ["db", "current"]):
        _refused(args, data, str(database), "nobody (uid 65534)")
    url = f"sqlite:///{database}"
    _refused(["audit", "log", "--db", url], tmp_path / "elsewhere", str(database), "nobody")


def test_an_own_database_others_may_write_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    database = data / "radcaliper.sqlite3"
    upgrade(f"sqlite:///{database}")
    database.chmod(0o666)
    _refused(["users", "list"], data, str(database), "its group and others", "root (uid 0)")


@pytest.mark.parametrize(("mode", "who"), [(0o770, "its group"), (0o757, "others")])
def test_an_own_data_dir_its_group_or_others_may_write_is_refused(
    tmp_path: Path, mode: int, who: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(mode)
    _refused(["users", "list"], data, str(data), f"can be written by {who}")
    _refused(["resident", "--idle-exit", "0.01"], data, str(data), f"can be written by {who}")


def test_a_data_dir_in_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    data = shared / "data"  # not there yet: radcaliper would create it
    _refused(["users", "list"], data, str(data), f"the folder {shared} above", "not sticky")
    assert not data.exists()


def test_a_data_dir_in_a_sticky_folder_like_tmp_is_used(tmp_path: Path) -> None:
    system_temp = tmp_path / "tmp"
    system_temp.mkdir()
    system_temp.chmod(0o1777)
    data = system_temp / "data"
    result = runner.invoke(app, ["users", "list"], env={"RADCALIPER_DATA_DIR": str(data)})
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "radcaliper.sqlite3").stat().st_mode) == 0o600


def test_the_installed_command_prints_one_line_and_exits_2(planted_data_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADCALIPER_")}
    env["RADCALIPER_DATA_DIR"] = str(planted_data_dir)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "users", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(planted_data_dir) in done.stderr and "nobody (uid 65534)" in done.stderr
