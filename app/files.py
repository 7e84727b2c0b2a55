"""Folders and files that hold patient data: radcaliper's data dir and what it creates in it,
exported SRs and uploads are readable by their owner only (0700 folders, 0600 files; missing
folders are made with ``db.private_paths.make_private_dirs``), and a data dir that another local
user owns or may change is refused (``db.private_paths.check_private_path``)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

from db.private_paths import check_private_path, make_private_dirs
from ingestion.errors import ConfigurationError

__all__ = ["owner_only_dir", "private_file"]

logger = logging.getLogger(__name__)


def owner_only_dir(path: Path, what: str = "data dir") -> Path:
    """``path`` as a folder only its owner can enter: created 0700 (with missing parents), or,
    when it exists, stripped of group and other permissions (with a warning).

    Raises:
        ConfigurationError: the folder (``what``) belongs to another user, its group or others
            may write it, or a folder above it others may write (not sticky like /tmp); or it
            is not a folder.
    """
    check_private_path(path, what)
    if not path.exists():
        return make_private_dirs(path)
    if not path.is_dir():
        raise ConfigurationError(f"{path}: the {what} is not a folder; give a folder")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, mode & ~0o077)
        logger.warning(
            "%s was open to other users (mode %o); it is now owner-only (mode %o)",
            path,
            mode,
            mode & ~0o077,
        )
    return path


def private_file(path: Path) -> BinaryIO:
    """``path`` opened for writing (emptied) as a file only its owner can read or write (0600,
    whatever the umask; an existing file is made so); never through a link."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        return os.fdopen(descriptor, "wb")
    except BaseException:
        os.close(descriptor)
        raise
