"""The one exception hierarchy of radcaliper.

Every error radcaliper raises on purpose derives from :class:`RadcaliperError`. Libraries raise;
the edges translate: the CLI prints one line and exits non-zero, the UI shows ``gr.Error``, a batch
records a failed row and goes on. Messages say what was wrong, with which file or value, and what to
do about it.

It lives in ``ingestion`` because ingestion is the first pipeline stage, which every later stage
(``model``, ``db``, ``app``) may import; it imports nothing else of radcaliper::

    RadcaliperError
    ├── ConfigurationError          a setting or option has a value radcaliper cannot use
    ├── IngestionError              a file or folder cannot become a Volume
    │   ├── NotDicomError           not a DICOM (or NIfTI) file at all, or truncated
    │   ├── UnreadableFileError     the file exists but cannot be read (permission denied, I/O)
    │   ├── UnsupportedObjectError  a readable DICOM/NIfTI object that is not a CT/MR image
    │   ├── MissingGeometryError    PixelSpacing / ImagePositionPatient / orientation absent
    │   ├── InconsistentGeometryError  geometry present but contradictory (gaps, duplicates, ...)
    │   ├── PixelDataError          pixel data missing or cannot be decoded
    │   └── NoUsableSeriesError     nothing under a path could be loaded
    ├── PreparationError            a Volume cannot be turned into model inputs
    ├── ModelError                  the measurer cannot load or run
    └── StorageError                the database cannot store or return what was asked
        ├── SchemaVersionError      the database's schema is missing or not this version's
        ├── MigrationRefusedError   the audit log does not vouch for the database: no migration
        ├── StaleEditError          a review was based on an outdated measurement (refused)
        ├── AccessDeniedError       the user's role does not allow the action
        └── NothingToExportError    a stored study has no measurement a DICOM SR could carry
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "ConfigurationError",
    "InconsistentGeometryError",
    "IngestionError",
    "MigrationRefusedError",
    "MissingGeometryError",
    "ModelError",
    "NoUsableSeriesError",
    "NotDicomError",
    "NothingToExportError",
    "PixelDataError",
    "PreparationError",
    "RadcaliperError",
    "SchemaVersionError",
    "StaleEditError",
    "StorageError",
    "UnreadableFileError",
    "UnsupportedObjectError",
]


class RadcaliperError(Exception):
    """Base of every error radcaliper raises on purpose."""


class ConfigurationError(RadcaliperError):
    """A setting or command-line option has a value radcaliper cannot use."""


class IngestionError(RadcaliperError):
    """A file or folder cannot become a :class:`~ingestion.volume.Volume`.

    ``series_instance_uid`` is set when the file's series is known, so that a damaged file can
    mark its whole series as incomplete; ``sop_instance_uid`` when the image it was meant to be
    is known, so that a damaged copy of an image that is readable elsewhere can be told apart.
    """

    def __init__(
        self,
        message: str,
        *,
        series_instance_uid: str | None = None,
        sop_instance_uid: str | None = None,
    ) -> None:
        super().__init__(message)
        self.series_instance_uid = series_instance_uid
        self.sop_instance_uid = sop_instance_uid


class NotDicomError(IngestionError):
    """The file is neither DICOM nor NIfTI, or is truncated / empty."""


class UnreadableFileError(IngestionError):
    """A file that exists but cannot be read: permission denied, or an I/O error. Nothing is
    known about its content (not even its series)."""

    @classmethod
    def from_os_error(cls, path: object, exc: OSError) -> UnreadableFileError:
        """The error for ``exc`` raised while opening or reading ``path``, saying what to do."""
        if isinstance(exc, PermissionError):
            return cls(
                f"{path}: permission denied: the user running radcaliper may not read this file; "
                "make it readable (e.g. chmod a+r, or fix its owner) or run radcaliper as a user "
                "who can, then run again"
            )
        return cls(
            f"{path}: cannot read file ({exc.strerror or exc}); check the disk or network share, "
            "then run again"
        )


class UnsupportedObjectError(IngestionError):
    """A readable object that radcaliper does not measure (SR, SEG, RTDOSE, scout, ...)."""


class MissingGeometryError(IngestionError):
    """Geometry attributes that a measurement relies on are absent."""


class InconsistentGeometryError(IngestionError):
    """Geometry attributes are present but contradict each other."""


class PixelDataError(IngestionError):
    """Pixel data is missing or cannot be decoded."""


class NoUsableSeriesError(IngestionError):
    """Nothing under the given path could be loaded."""


class PreparationError(RadcaliperError):
    """A Volume cannot be turned into model inputs."""


class ModelError(RadcaliperError):
    """The measurer cannot be loaded or run."""


class StorageError(RadcaliperError):
    """The database cannot store or return what was asked."""


class SchemaVersionError(StorageError):
    """The database has no radcaliper tables, or tables of another schema version."""


class MigrationRefusedError(StorageError):
    """A migration was refused: the audit log does not vouch for what the database holds (a
    row that differs from the log, a broken chain, a schema version set back), and migrating
    would record unexplained rows as trusted ones."""


class StaleEditError(StorageError):
    """A reviewer's edit names a measurement version that is no longer current."""


class AccessDeniedError(StorageError):
    """The acting user's role does not allow the action (e.g. an auditor editing)."""


class NothingToExportError(StorageError):
    """A stored study has no finding with a measurement left to export (none found, all
    rejected or not measurable): no DICOM SR is written (TID 1500 needs a measurement group)."""
