"""Where radcaliper keeps private data: the data dir, an SQLite database file, the resident's
socket folder. Each is used only when no other local user can have put it there or can change it
(issue 41: a world-writable data dir and a 0666 database planted by another user were used as
they were, and that user read the password hashes). :func:`check_private_path` refuses, with a
``ConfigurationError`` naming the path, its owner and what to do:

- a path (when it exists; links followed) that does not belong to the user running radcaliper
  (its effective uid), or that its group or others may write;
- a path below a folder that others may write (as given, and after following links), unless the
  folder is sticky like ``/tmp``: there others may add entries but neither rename nor remove
  ours. Folders above that only their group may write are accepted: systems with a private
  group per user (Debian, Ubuntu) make folders so.

:func:`make_private_dirs` creates missing folders readable by their owner only (0700) whatever
the umask is.

It lives in ``db`` because the store checks its SQLite file itself (``db.engine.connect``), and
``app`` (the data dir, the resident's socket) may import ``db``, not the other way round.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path

from ingestion.errors import ConfigurationError

__all__ = ["check_private_path", "make_private_dirs"]


def check_private_path(path: Path, what: str) -> None:
    """Refuse ``path`` (the ``what``: "data dir", "database file", ...) when another local user
    owns it or may change it or the folders it lies in (module doc). A missing path is accepted
    when the folders it would be created in are safe.

    Raises:
        ConfigurationError: one line naming the path, its owner and what to do.
    """
    absolute = Path(os.path.abspath(path))
    real = Path(os.path.realpath(absolute))
    try:
        info = os.stat(real)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise ConfigurationError(
            f"{path}: cannot look at the {what} ({exc.strerror or exc}); check its permissions"
        ) from None
    if info is not None:
        _check_own(path, what, info)
    for folder in _folders_above(absolute, real):
        try:
            above = os.stat(folder)
        except OSError:  # missing (created owner-only later) or not ours to look into
            continue
        mode = above.st_mode
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            raise ConfigurationError(
                f"{path}: the folder {folder} above the {what} can be written by other users "
                f"(mode {stat.S_IMODE(mode):o}, not sticky; owned by {_user(above.st_uid)}), so "
                f"they could replace the {what}; radcaliper does not use it: put the {what} in "
                f"a folder of your own, or make {folder} sticky or not writable by others "
                f"(chmod o-w {folder})"
            )


def _check_own(path: Path, what: str, info: os.stat_result) -> None:
    me = os.geteuid()
    if info.st_uid != me:
        raise ConfigurationError(
            f"{path}: the {what} belongs to {_user(info.st_uid)}, not to {_user(me)} who runs "
            f"radcaliper, so that user could read or change what it holds; radcaliper does not "
            f"use it: use a {what} of your own (see RADCALIPER_DATA_DIR, --db), or give this "
            f"one to {_user(me)} (chown) once you have checked what it holds"
        )
    mode = stat.S_IMODE(info.st_mode)
    writers = [who for who, bit in (("its group", 0o020), ("others", 0o002)) if mode & bit]
    if writers:
        raise ConfigurationError(
            f"{path}: the {what} can be written by {' and '.join(writers)} (mode {mode:o}, "
            f"owned by {_user(info.st_uid)}), so another user could have changed it; "
            f"radcaliper does not use it: check what it holds, then make it writable by its "
            f"owner only (chmod go-w {path})"
        )


def _folders_above(absolute: Path, real: Path) -> list[Path]:
    """The folders above ``absolute`` (as given) and above ``real`` (links followed), from the
    root down, each once."""
    folders: list[Path] = []
    for path in (absolute, real):
        for folder in reversed(path.parents):
            if folder not in folders:
                folders.append(folder)
    return folders


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def make_private_dirs(path: Path) -> Path:
    """``path`` as a folder, creating it and its missing parents readable by their owner only
    (0700, whatever the umask); folders that exist are left as they are."""
    missing = []
    folder = path
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):
            created.mkdir(mode=0o700)
            os.chmod(created, 0o700)  # mkdir's mode is masked by the umask
    return path
