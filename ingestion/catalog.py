"""One file's entry in a batch catalog: an image with the attributes series selection needs, a
file skipped by design, or a file rejected with the reason. Headers only; pixels stay on disk.

The line between *skipped* and *rejected* (README "Batch processing"):

- **skipped**: readable, but not something to measure: DICOMDIR, SR / SEG / RTSTRUCT and other
  non-image objects, secondary captures, localizers, modalities other than CT/MR, NIfTI files
  (batch measures DICOM studies) and documents with a non-DICOM name (``.json``, ``.txt``,
  ``.html``, ...).
- **rejected**: meant to be an image but unusable: empty, truncated, gzip-compressed or
  non-DICOM content under a DICOM-like name, missing or contradictory geometry, pixel data too
  short, a file that cannot be read (permission denied: said so, with what to do).

Nothing here raises for a bad file.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ingestion.errors import (
    IngestionError,
    NotDicomError,
    UnreadableFileError,
    UnsupportedObjectError,
)
from ingestion.scan import is_nifti_path, is_nrrd_path, is_segmentation_path, segmentation_reason

if TYPE_CHECKING:  # pydicom is imported when a header is read (a batch with nothing new reads none)
    from pydicom.dataset import Dataset

__all__ = ["NON_DICOM_SUFFIXES", "FileRecord", "FileStatus", "ImageAttributes", "catalog_file"]

logger = logging.getLogger(__name__)

# Names that say "a document, not an image": skipped (not rejected) when the content is not DICOM.
NON_DICOM_SUFFIXES = frozenset(
    {
        ".bat",
        ".bmp",
        ".css",
        ".csv",
        ".dll",
        ".exe",
        ".gif",
        ".htm",
        ".html",
        ".inf",
        ".ini",
        ".jpeg",
        ".jpg",
        ".js",
        ".json",
        ".log",
        ".md",
        ".pdf",
        ".png",
        ".sh",
        ".txt",
        ".xml",
    }
)


class FileStatus(enum.StrEnum):
    """What a batch does with a file."""

    IMAGE = "image"
    SKIPPED = "skipped"
    REJECTED = "rejected"


@dataclass(frozen=True)
class ImageAttributes:
    """What series selection needs to know about one CT/MR image file (all its frames)."""

    study_instance_uid: str
    series_instance_uid: str
    sop_instance_uid: str
    modality: str
    series_number: int | None
    series_description: str
    image_type: str  # ImageType values joined with "\\", upper case
    rows: int
    columns: int
    planes: int  # image planes in the file (frames of a multi-frame object)
    normal: tuple[float, float, float]  # unit normal of the first plane (row x column)
    depth_min_mm: float  # plane positions projected on the normal, lowest and highest
    depth_max_mm: float
    pixel_spacing_mm: float  # the larger of the two PixelSpacing values
    nominal_thickness_mm: float | None  # SpacingBetweenSlices or SliceThickness

    @property
    def derived(self) -> bool:
        """ImageType says DERIVED (value 1) or SECONDARY (value 2)."""
        values = self.image_type.split("\\")
        return values[0] == "DERIVED" or (len(values) > 1 and values[1] == "SECONDARY")

    @property
    def axial(self) -> bool:
        """The image normal is closest to the patient's cranio-caudal axis."""
        x, y, z = (abs(v) for v in self.normal)
        return z >= x and z >= y


@dataclass(frozen=True)
class FileRecord:
    """One file of a batch tree and what became of its header.

    ``series_instance_uid`` is set for a rejected file whose series is known (so that the series
    counts as incomplete) and ``sop_instance_uid`` for one whose image is known (from its
    dataset, else its file meta group: a damaged copy of an image that is intact elsewhere does
    not make its series incomplete); ``image`` is set exactly when ``status`` is IMAGE.
    ``error`` is the exception class that rejected or skipped the file (empty for images).
    ``intact_copy`` is not the file's own: the work index sets it on a rejected file when
    another file of the tree holds the same image intact.
    """

    path: Path
    size: int
    mtime_ns: int
    status: FileStatus
    reason: str = ""
    error: str = ""
    series_instance_uid: str | None = None
    image: ImageAttributes | None = None
    sop_instance_uid: str | None = None
    intact_copy: Path | None = None

    @property
    def unreadable(self) -> bool:
        """The file could not be read at all (permission denied, I/O error)."""
        return self.error == UnreadableFileError.__name__

    def __post_init__(self) -> None:
        if (self.image is not None) != (self.status is FileStatus.IMAGE):
            raise ValueError(
                f"{self.path}: image attributes must be given exactly for status image"
            )
        if self.status is not FileStatus.IMAGE and not self.reason:
            raise ValueError(f"{self.path}: a {self.status} file needs a reason")


def _attributes(path: Path, ds: Dataset) -> ImageAttributes:
    from ingestion.dicom.header import dicom_object_from_dataset

    obj = dicom_object_from_dataset(path, ds)
    info, first = obj.info, obj.slices[0]
    normal = np.asarray(first.normal, dtype=np.float64)
    normal /= np.linalg.norm(normal)
    depths = np.array([s.position for s in obj.slices], dtype=np.float64) @ normal  # (planes,)
    values = ds.get("ImageType") or []
    values = [values] if isinstance(values, str) else list(values)  # one value: a plain string
    image_type = "\\".join(str(v).strip().upper() for v in values)
    return ImageAttributes(
        study_instance_uid=info.study_instance_uid,
        series_instance_uid=info.series_instance_uid,
        sop_instance_uid=first.sop_instance_uid,
        modality=str(info.modality),
        series_number=info.series_number,
        series_description=info.series_description,
        image_type=image_type,
        rows=first.rows,
        columns=first.columns,
        planes=len(obj.slices),
        normal=(float(normal[0]), float(normal[1]), float(normal[2])),
        depth_min_mm=float(depths.min()),
        depth_max_mm=float(depths.max()),
        pixel_spacing_mm=float(max(first.pixel_spacing)),
        nominal_thickness_mm=first.nominal_thickness,
    )


def catalog_file(path: Path) -> FileRecord:
    """Read ``path``'s header (never its pixels) and classify it; never raises for a bad file."""
    from ingestion.dicom.header import read_dicom_header

    try:
        stat = path.stat()
    except OSError as exc:
        reason = str(UnreadableFileError.from_os_error(path, exc))
        return FileRecord(path, 0, 0, FileStatus.REJECTED, reason, UnreadableFileError.__name__)
    size, mtime = stat.st_size, stat.st_mtime_ns

    def record(status: FileStatus, reason: str, error: type[BaseException]) -> FileRecord:
        return FileRecord(path, size, mtime, status, reason, error.__name__)

    if is_segmentation_path(path):
        return record(FileStatus.SKIPPED, segmentation_reason(path), UnsupportedObjectError)
    if is_nifti_path(path) or is_nrrd_path(path):
        kind = "NIfTI" if is_nifti_path(path) else "NRRD"
        return record(
            FileStatus.SKIPPED,
            f"{path}: {kind} file; batch measures DICOM studies (use radcaliper measure for "
            f"{kind})",
            UnsupportedObjectError,
        )
    try:
        ds = read_dicom_header(path)
    except NotDicomError as exc:
        if path.suffix.lower() in NON_DICOM_SUFFIXES:
            return record(
                FileStatus.SKIPPED, f"{path}: not DICOM (a {path.suffix} file)", NotDicomError
            )
        return record(FileStatus.REJECTED, str(exc), NotDicomError)
    except UnreadableFileError as exc:  # permission denied: said as such, never "corrupt"
        return record(FileStatus.REJECTED, str(exc), UnreadableFileError)
    try:
        image = _attributes(path, ds)
    except UnsupportedObjectError as exc:
        return record(FileStatus.SKIPPED, str(exc), type(exc))
    except IngestionError as exc:
        rejected = record(FileStatus.REJECTED, str(exc), type(exc))
        return replace(
            rejected,
            series_instance_uid=exc.series_instance_uid,
            sop_instance_uid=exc.sop_instance_uid,
        )
    except Exception as exc:  # a header pydicom parsed but that breaks our reading of it
        logger.debug("unexpected error reading %s", path, exc_info=True)
        return record(
            FileStatus.REJECTED,
            f"{path}: unreadable DICOM header ({type(exc).__name__}: {exc})",
            type(exc),
        )
    return FileRecord(path, size, mtime, FileStatus.IMAGE, image=image)
