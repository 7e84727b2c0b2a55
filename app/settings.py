"""The one settings object: command line over environment (``RADCALIPER_*``) over defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from platformdirs import user_data_path
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _default_data_dir() -> Path:
    return user_data_path("radcaliper", appauthor=False)


class Settings(BaseSettings):
    """radcaliper's configuration. Build it once at the entry point and pass it down.

    Every field can be set in the environment with the ``RADCALIPER_`` prefix, e.g.
    ``RADCALIPER_LOG_LEVEL=DEBUG``; command-line options override the environment.
    """

    model_config = SettingsConfigDict(env_prefix="RADCALIPER_", extra="ignore", frozen=True)

    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Where radcaliper keeps its database, models and caches.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default: an SQLite file in data_dir.",
    )
    log_level: LogLevel = Field(default="WARNING", description="Logging level on stderr.")
    nifti_modality: Literal["CT", "MR"] | None = Field(
        default=None,
        description="Modality recorded for NIfTI inputs, which do not store one.",
    )
    pseudonym_key: str | None = Field(
        default=None,
        description="Site secret: when set, patient IDs are stored as keyed pseudonyms.",
        repr=False,
    )

    @property
    def default_database(self) -> bool:
        """True when no database was configured (the SQLite file in ``data_dir``)."""
        return not self.database_url

    @property
    def effective_database_url(self) -> str:
        """``database_url`` or the default SQLite file under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'radcaliper.sqlite3'}"
