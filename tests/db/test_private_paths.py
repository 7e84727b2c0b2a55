"""``db.private_paths`` (issue 41, item 3): radcaliper refuses a data dir, an SQLite database
file or a socket folder that another local user owns or may change, and a place others could
swap it out of; a sticky folder like /tmp is a safe place to be in. The tests run as root: a
path of "another user" is one given to uid 65534 (nobody) with os.chown."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from db.engine import connect, open_store
from db.migrate import upgrade
from db.private_paths import check_private_path, make_private_dirs
from ingestion.errors import ConfigurationError

OTHER_UID = 65534


def _owned_by_another_user(path: Path) -> None:
    os.chown(path, OTHER_UID, OTHER_UID)


def test_an_own_folder_and_file_are_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    (folder / "radcaliper.sqlite3").touch(mode=0o644)
    check_private_path(folder, "data dir")
    check_private_path(folder / "radcaliper.sqlite3", "database file")
    check_private_path(folder / "not-there-yet", "data dir")  # created later, owner-only


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_path_of_another_user_is_refused_naming_its_owner(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "planted"
    if kind == "folder":
        path.mkdir(mode=0o700)
    else:
        path.touch(mode=0o600)
    _owned_by_another_user(path)
    with pytest.raises(ConfigurationError) as caught:
        check_private_path(path, "data dir")
    message = str(caught.value)
    assert str(path) in message and "nobody (uid 65534)" in message
    assert "\n" not in message


@pytest.mark.parametrize(("mode", "who"), [(0o770, "its group"), (0o707, "others")])
def test_a_folder_its_group_or_others_may_write_is_refused(
    tmp_path: Path, mode: int, who: str
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(ConfigurationError, match=f"can be written by {who}") as caught:
        check_private_path(folder, "data dir")
    assert str(folder) in str(caught.value) and "root (uid 0)" in str(caught.value)


def test_a_database_file_others_may_write_is_refused(tmp_path: Path) -> None:
    database = tmp_path / "radcaliper.sqlite3"
    database.touch()
    database.chmod(0o666)
    with pytest.raises(ConfigurationError, match="can be written by its group and others"):
        check_private_path(database, "database file")


def test_a_folder_above_that_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    data = shared / "deep" / "data"
    data.mkdir(parents=True, mode=0o700)
    shared.chmod(0o777)  # not sticky: anyone may rename deep/ and put their own in its place
    for path in (data, data / "radcaliper.sqlite3", shared / "new" / "data"):
        with pytest.raises(ConfigurationError) as caught:
            check_private_path(path, "data dir")
        message = str(caught.value)
        assert f"the folder {shared} above" in message and "not sticky" in message


def test_a_sticky_folder_above_like_tmp_is_accepted(tmp_path: Path) -> None:
    system_temp = tmp_path / "tmp"
    system_temp.mkdir()
    system_temp.chmod(0o1777)  # like /tmp
    data = system_temp / "data"
    data.mkdir(mode=0o700)
    check_private_path(data, "data dir")
    check_private_path(system_temp / "radcaliper.sqlite3", "database file")
    check_private_path(Path("/tmp") / "radcaliper-not-created", "data dir")  # /tmp itself


def test_a_link_is_judged_by_what_it_points_to_and_where_it_lies(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    _owned_by_another_user(theirs)
    link = tmp_path / "data"
    link.symlink_to(theirs)
    with pytest.raises(ConfigurationError, match="nobody"):
        check_private_path(link, "data dir")
    # a link to an own folder, lying in a folder anyone may write (and so re-point)
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (open_folder / "data").symlink_to(mine)
    with pytest.raises(ConfigurationError, match=re.escape(f"the folder {open_folder} above")):
        check_private_path(open_folder / "data", "data dir")


def test_missing_folders_are_made_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    mask = os.umask(0)
    try:
        made = make_private_dirs(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(mask)
    assert made == tmp_path / "a" / "b" / "c" and made.is_dir()
    for folder in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert make_private_dirs(made) == made  # there already: left as it is


def test_a_planted_database_file_is_refused_when_opened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    database = data / "radcaliper.sqlite3"
    upgrade(f"sqlite:///{database}")
    database.chmod(0o666)
    _owned_by_another_user(database)
    with pytest.raises(ConfigurationError, match="nobody"):
        open_store(f"sqlite:///{database}")
    with pytest.raises(ConfigurationError, match="nobody"):
        connect(f"sqlite:///{database}")
    assert stat.S_IMODE(database.stat().st_mode) == 0o666  # untouched


def test_a_planted_journal_beside_an_own_database_is_refused(tmp_path: Path) -> None:
    database = tmp_path / "radcaliper.sqlite3"
    upgrade(f"sqlite:///{database}")
    wal = tmp_path / "radcaliper.sqlite3-wal"
    wal.write_bytes(b"")
    _owned_by_another_user(wal)
    with pytest.raises(ConfigurationError, match=r"radcaliper\.sqlite3-wal"):
        open_store(f"sqlite:///{database}")
