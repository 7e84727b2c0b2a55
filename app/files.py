"""Folders that hold patient data: radcaliper's data dir and what it creates in it are readable
by their owner only."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["owner_only_dir"]

logger = logging.getLogger(__name__)


def owner_only_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter: created 0700 (with missing parents), or,
    when it exists and is ours, stripped of group and other permissions (with a warning)."""
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
        return path
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077 and info.st_uid == os.geteuid():
        os.chmod(path, mode & ~0o077)
        logger.warning(
            "%s was open to other users (mode %o); it is now owner-only (mode %o)",
            path,
            mode,
            mode & ~0o077,
        )
    return path
