"""The one settings object: command line over environment (``RADCALIPER_*``) over defaults."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from platformdirs import user_data_path
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from db.logins import LoginLimits
    from db.review import CorrectionLimits

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
        description="Modality recorded for NIfTI and NRRD inputs, which do not store one.",
    )
    pseudonym_key: str | None = Field(
        default=None,
        description="Site secret: when set, patient IDs are stored as keyed pseudonyms.",
        repr=False,
    )
    # the plausible range of corrected values (db.review.CorrectionLimits, whose docstring
    # justifies the defaults): finite, > 0 and at most this many mm
    max_long_axis_mm: float = Field(
        default=500.0,
        gt=0,
        le=10_000,  # db.review.MAX_LIMIT_MM
        allow_inf_nan=False,
        description="Largest plausible long axis in mm (corrections above it are refused).",
    )
    max_short_axis_mm: float = Field(
        default=500.0,
        gt=0,
        le=10_000,  # db.review.MAX_LIMIT_MM
        allow_inf_nan=False,
        description="Largest plausible short axis in mm (corrections above it are refused).",
    )
    max_diameter_mm: float = Field(
        default=100.0,
        gt=0,
        le=10_000,  # db.review.MAX_LIMIT_MM
        allow_inf_nan=False,
        description="Largest plausible vessel diameter in mm (corrections above it are refused).",
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

    @property
    def correction_limits(self) -> CorrectionLimits:
        """The ``max_*_mm`` settings as the store's :class:`~db.review.CorrectionLimits`."""
        from db.review import CorrectionLimits

        return CorrectionLimits(
            long_axis_mm=self.max_long_axis_mm,
            short_axis_mm=self.max_short_axis_mm,
            diameter_mm=self.max_diameter_mm,
        )

    # --- the review UI's web server (radcaliper serve; app.ui.server; db.logins) --------------
    login_max_failures: int = Field(
        default=5,
        ge=0,
        description="Failed logins of one user name from one client address before that name "
        "backs off from that address: locked login_first_lock_seconds, doubled with each further "
        "failure up to login_lockout_minutes (0: no limit). Other addresses are not locked.",
    )
    login_address_max_failures: int = Field(
        default=30,
        ge=0,
        description="Failed logins from one client address (any names) before the address "
        "backs off for every name, the same way (0: no limit).",
    )
    login_name_max_failures: int = Field(
        default=10,
        ge=0,
        description="Failed logins of one user name from anywhere within login_window_minutes "
        "after which its logins from other addresses are answered after "
        "login_name_delay_seconds (slowed, never locked; 0: no limit).",
    )
    login_first_lock_seconds: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="The first lock of a backing-off name or address.",
    )
    login_window_minutes: float = Field(
        default=15.0,
        gt=0,
        allow_inf_nan=False,
        description="How long a failed login counts towards slowing its user name.",
    )
    login_lockout_minutes: float = Field(
        default=15.0,
        gt=0,
        allow_inf_nan=False,
        description="The longest lock of a backing-off name or address.",
    )
    login_name_delay_seconds: float = Field(
        default=3.0,
        ge=0,
        le=60,
        allow_inf_nan=False,
        description="How long a login of a user name under attack waits.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses of reverse proxies whose X-Forwarded-For header names the client, "
        "as JSON: '[\"127.0.0.1\"]'. From any other peer the header is ignored (the peer's "
        "address is the client's).",
    )
    secure_cookies: bool = Field(
        default=False,
        description="Send the session cookie over HTTPS only (turn on behind an HTTPS proxy).",
    )
    trusted_origins: list[str] = Field(
        default_factory=list,
        description="Origins (https://host[:port]) besides the server's own Host whose pages "
        "may send state-changing requests, as JSON: '[\"https://radcaliper.example.org\"]'.",
    )

    @property
    def login_limits(self) -> LoginLimits:
        """The ``login_*`` settings as :class:`~db.logins.LoginLimits`."""
        from db.logins import LoginLimits

        return LoginLimits(
            free_failures=self.login_max_failures,
            address_failures=self.login_address_max_failures,
            name_failures=self.login_name_max_failures,
            first_lock_s=self.login_first_lock_seconds,
            max_lock_s=max(self.login_lockout_minutes * 60.0, self.login_first_lock_seconds),
            window_s=self.login_window_minutes * 60.0,
            name_delay_s=self.login_name_delay_seconds,
        )
