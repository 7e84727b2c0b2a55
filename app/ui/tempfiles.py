"""The review UI's private folder for temporary files: rendered slices, uploads in transit and
audit exports, which hold patient data.

Gradio copies everything it serves (each rendered slice, each download) into its cache folder,
by default the world-readable ``/tmp/gradio``, and keeps it. The server points Gradio's cache
(``GRADIO_TEMP_DIR``) at this folder instead when it is built: ``DATA_DIR/ui-temp`` for
``radcaliper serve``, created owner-only (0700; an existing one is made so, one owned by another
user is refused), emptied when the server starts (what a killed server left) and when it stops,
and swept while it runs (files older than a session's lifetime are deleted). Exports are written
into their own 0700 folders inside it, as 0600 files. Without a configured folder the server
uses a fresh 0700 folder under the system temp dir, removed when it stops.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from app.files import owner_only_dir
from ingestion.errors import ConfigurationError

__all__ = ["PrivateFolder", "private_export"]

logger = logging.getLogger(__name__)

PRIVATE_FILE = 0o600


class PrivateFolder:
    """An owner-only folder whose content the UI may delete at any time."""

    def __init__(self, path: Path | None = None) -> None:
        self._own = path is None
        self.path = Path(tempfile.mkdtemp(prefix="radcaliper-ui-")) if path is None else path

    def prepare(self) -> Path:
        """Create the folder owner-only (or make an existing one so) and empty it.

        Raises ``ConfigurationError`` for a link, a file, a folder of another user, or one
        that others may change (``app.files.owner_only_dir``).
        """
        path = self.path
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise ConfigurationError(
                f"{path}: the UI's temporary folder is a link or a file; remove it (radcaliper "
                "creates the folder itself)"
            )
        if path.exists() and path.stat().st_uid != os.geteuid():
            raise ConfigurationError(
                f"{path}: the UI's temporary folder belongs to another user; remove it or give "
                "it to the user running radcaliper"
            )
        owner_only_dir(path, "UI's temporary folder")
        self.clear()
        return path

    @staticmethod
    def write_text(path: Path, text: str) -> Path:
        """Write a new owner-only (0600) file."""
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as file:
            file.write(text)
        return path

    def sweep(self, max_age_s: float) -> int:
        """Delete files last changed more than ``max_age_s`` ago, then empty folders; the number
        of files deleted."""
        deadline = time.time() - max_age_s
        deleted = 0
        for folder, dirs, files in os.walk(self.path, topdown=False):
            for name in files:
                file = Path(folder, name)
                try:
                    if file.lstat().st_mtime < deadline:
                        file.unlink()
                        deleted += 1
                except FileNotFoundError:  # Gradio's own sweep was first
                    continue
            for name in dirs:
                sub = Path(folder, name)
                try:
                    if stat.S_ISDIR(sub.lstat().st_mode) and sub.lstat().st_mtime < deadline:
                        sub.rmdir()
                except OSError:  # not empty, or gone
                    continue
        if deleted:
            logger.info("deleted %d temporary UI file(s) older than %.0f s", deleted, max_age_s)
        return deleted

    def clear(self) -> None:
        """Delete everything inside (the folder stays)."""
        if not self.path.is_dir():
            return
        for entry in self.path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def close(self) -> None:
        """Empty the folder; one this object made itself is removed."""
        self.clear()
        if self._own:
            shutil.rmtree(self.path, ignore_errors=True)


def private_export(folder: Path | None, name: str, text: str) -> Path:
    """Write ``text`` as ``name`` into a new owner-only folder inside ``folder`` (the UI's
    private folder; the system temp dir without one), as a 0600 file; its path."""
    inside = Path(tempfile.mkdtemp(prefix="radcaliper-export-", dir=folder))
    return PrivateFolder.write_text(inside / name, text)
