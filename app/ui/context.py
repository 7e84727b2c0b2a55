"""What every UI handler needs: the store, the measurer (loaded on first use), volumes of the
studies being viewed (a small cache), and the acting user checked on every call."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from db.engine import Store
from db.logins import LoginLimits
from db.models import Role, User
from db.review import CorrectionLimits
from ingestion.errors import AccessDeniedError, ModelError
from ingestion.volume import Modality, Volume

if TYPE_CHECKING:
    from model.measurer.protocol import Measurer

__all__ = ["UiContext"]

VOLUMES_KEPT = 4


@dataclass
class UiContext:
    store: Store
    model_dir: Path | None
    nifti_modality: Modality | None
    upload_dir: Path
    pseudonym_key: str | None = None
    max_upload_bytes: int = 2 * 1024**3
    correction_limits: CorrectionLimits = field(default_factory=CorrectionLimits)
    # the UI's private temporary folder (app.ui.tempfiles); the server sets it when built
    temp_dir: Path | None = None
    # the login back-off (the admin page shows its locks) and a way to end a user's sessions
    # in this server at once (the server sets both; other servers end them at the next request)
    login_limits: LoginLimits = field(default_factory=LoginLimits)
    end_sessions: Callable[[str], int] = field(default=lambda _: 0, repr=False)
    _measurer: Measurer | None = field(default=None, repr=False)
    _volumes: OrderedDict[tuple[str, str], Volume] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- who is acting --------------------------------------------------------------------------

    def user(self, name: str | None, *roles: Role) -> User:
        """The active user ``name``; with ``roles``, one of them is required.

        Raises ``AccessDeniedError`` otherwise (the handlers turn it into a ``gr.Error``).
        """
        from db.users import get_user

        if not name:
            raise AccessDeniedError("not logged in")
        with self.store.reader() as session:
            user = get_user(session, name)
        if user is None or not user.active:
            raise AccessDeniedError(f"user {name!r} is not an active user")
        if roles and user.role not in roles:
            allowed = " or ".join(r.value for r in roles)
            raise AccessDeniedError(
                f"{user.name} is {user.role.value}: this needs the {allowed} role"
            )
        return user

    # --- the model and the images ---------------------------------------------------------------

    def measurer(self) -> Measurer:
        """The model the UI measures with (loaded at the first call)."""
        with self._lock:
            if self._measurer is None:
                from model.measurer.checkpoint.settings import default_checkpoint
                from model.measurer.infer.pipeline import CheckpointMeasurer

                self._measurer = CheckpointMeasurer.load(self.model_dir or default_checkpoint())
            return self._measurer

    def volume(self, source: str, series_uid: str) -> Volume:
        """The series ``series_uid`` read from ``source`` (kept for the next views)."""
        from ingestion.load import load_path

        key = (source, series_uid)
        with self._lock:
            if key in self._volumes:
                self._volumes.move_to_end(key)
                return self._volumes[key]
        path = Path(source)
        if not path.exists():
            raise ModelError(f"the images of this study are no longer at {source}")
        loaded = load_path(path, self.nifti_modality)
        for volume in loaded.volumes:
            if volume.identifiers.series_key == series_uid:  # the store's key of the stack
                with self._lock:
                    self._volumes[key] = volume
                    while len(self._volumes) > VOLUMES_KEPT:
                        self._volumes.popitem(last=False)
                return volume
        raise ModelError(f"series {series_uid} is not among the images at {source}")
