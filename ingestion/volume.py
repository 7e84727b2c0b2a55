"""The Volume: voxels, their geometry in patient space, and where they came from."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry

__all__ = ["SERIES_KEY_LENGTH", "Identifiers", "Modality", "SourceFormat", "Volume", "stack_key"]

#: the longest series key: a DICOM UID's length (64), the store's column
SERIES_KEY_LENGTH = 64
_STACK_DIGEST_HEX = 12  # 48 bits: two stacks of one series never share a key in practice


class Modality(enum.StrEnum):
    """Imaging modalities radcaliper measures."""

    CT = "CT"
    MR = "MR"


class SourceFormat(enum.StrEnum):
    """File format a volume was read from."""

    DICOM = "dicom"
    NIFTI = "nifti"
    NRRD = "nrrd"
    SYNTHETIC = "synthetic"  # built in memory (a phantom), not read from a file


def stack_key(
    series_instance_uid: str,
    sop_instance_uids: Sequence[str | None],
    frame_numbers: Sequence[int | None],
) -> str:
    """The key of one stack of a series that holds several (``ingestion.scan``): the UID, ``#``
    and 12 hex digits of the sha256 of the UID and the stack's images (SOP instance and frame,
    in slice order), at most :data:`SERIES_KEY_LENGTH` characters: a UID too long for both
    keeps its beginning (the digest covers all of it). A key made of the images, not of the
    order the scan met the stacks in, names the same stack whenever it is loaded; ``#`` is no
    UID character, so no key is a series' own UID."""
    text = "\x1f".join(
        [
            series_instance_uid,
            *(
                f"{sop}:{frame}"
                for sop, frame in zip(sop_instance_uids, frame_numbers, strict=True)
            ),
        ]
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:_STACK_DIGEST_HEX]
    head = series_instance_uid[: SERIES_KEY_LENGTH - _STACK_DIGEST_HEX - 1]
    return f"{head}#{digest}"


@dataclass(frozen=True)
class Identifiers:
    """Identifiers that let a result point back to the study, series and image it came from.

    ``sop_instance_uids`` and ``frame_numbers`` have one entry per slice, in slice order. A frame
    number is the 1-based DICOM frame within a multi-frame object, ``None`` for single-frame images.
    For NIfTI and NRRD, which carry no UIDs, study and series UIDs are derived from the file's
    content (``uids_derived`` is True) and per-slice UIDs are ``None``. ``stack`` is the part
    number when the series holds several stacks (e.g. axial and coronal reconstructions under
    one SeriesInstanceUID: ``ingestion.scan`` splits it) and this volume is one of them; None
    for a series that is one stack. :attr:`series_key` tells the stacks apart.
    """

    study_instance_uid: str
    series_instance_uid: str
    sop_instance_uids: tuple[str | None, ...]
    frame_numbers: tuple[int | None, ...]
    patient_id: str | None = None
    patient_name: str | None = None  # DICOM PN as text (``Family^Given``), decoded
    study_date: str | None = None
    series_number: int | None = None
    series_description: str = ""
    uids_derived: bool = False
    stack: int | None = None  # the part number of a series split into stacks (class doc)

    def __post_init__(self) -> None:
        if not self.study_instance_uid or not self.series_instance_uid:
            raise ValueError("study_instance_uid and series_instance_uid must be non-empty")
        if len(self.sop_instance_uids) != len(self.frame_numbers):
            raise ValueError(
                f"sop_instance_uids ({len(self.sop_instance_uids)}) and frame_numbers "
                f"({len(self.frame_numbers)}) must have one entry per slice"
            )
        if self.stack is not None and (isinstance(self.stack, bool) or self.stack < 1):
            raise ValueError(f"stack must be a part number >= 1 or None, got {self.stack!r}")

    @property
    def series_key(self) -> str:
        """What tells this series from every other one (the store keys a series by it): the
        SeriesInstanceUID for a series that is one stack, else :func:`stack_key`."""
        if self.stack is None:
            return self.series_instance_uid
        return stack_key(self.series_instance_uid, self.sop_instance_uids, self.frame_numbers)


@dataclass(frozen=True, eq=False)
class Volume:
    """A 3-D image in ``voxels[slice, row, column]`` order with exact patient geometry.

    Args:
        voxels: float32 array (slices, rows, columns); Hounsfield units for CT.
        geometry: maps indices to LPS mm.
        identifiers: study/series/image identifiers, one SOP instance per slice.
        modality: CT or MR; ``None`` when the file format does not record it (NIfTI, NRRD).
        source_format: DICOM, NIfTI, NRRD or synthetic (built in memory).
        sources: the files the voxels were read from.
        warnings: things a reader should know that did not stop loading (e.g. gantry tilt).
        gantry_tilt_degrees: the gantry tilt with the sign of the GantryDetectorTilt tag (its
            size from the geometry); None when there is no tilt or no tag to sign it
            (``geometry.tilt_degrees`` is the size).
    """

    voxels: npt.NDArray[np.float32]
    geometry: Geometry
    identifiers: Identifiers
    modality: Modality | None
    source_format: SourceFormat
    sources: tuple[Path, ...]
    warnings: tuple[str, ...] = field(default=())
    gantry_tilt_degrees: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.voxels, np.ndarray) or self.voxels.ndim != 3:
            shape = getattr(self.voxels, "shape", None)
            raise ValueError(f"voxels must be a 3-D array (slices, rows, columns), got {shape}")
        if self.voxels.dtype != np.float32:
            raise ValueError(f"voxels must be float32, got {self.voxels.dtype}; use .astype")
        if min(self.voxels.shape) < 1:
            raise ValueError(f"voxels must not be empty, got shape {self.voxels.shape}")
        n = self.voxels.shape[0]
        if len(self.identifiers.sop_instance_uids) != n:
            raise ValueError(
                f"identifiers name {len(self.identifiers.sop_instance_uids)} slices "
                f"but voxels have {n}"
            )
        if not self.sources:
            raise ValueError("sources must name at least one file")

    @classmethod
    def in_memory(
        cls,
        voxels: npt.ArrayLike,
        geometry: Geometry,
        identifiers: Identifiers | None = None,
        *,
        name: str = "synthetic",
    ) -> Volume:
        """A CT volume built in memory (phantoms, patches, tests), ``SourceFormat.SYNTHETIC``.

        ``voxels`` are copied to float32; without ``identifiers`` the UIDs are placeholders
        ("1.2.3", "1.2.3.4", "1.2.3.4.<slice>"). ``name`` stands in for the source file.
        """
        array = np.array(voxels, dtype=np.float32)
        if identifiers is None:
            n = array.shape[0] if array.ndim else 0
            identifiers = Identifiers(
                study_instance_uid="1.2.3",
                series_instance_uid="1.2.3.4",
                sop_instance_uids=tuple(f"1.2.3.4.{i}" for i in range(n)),
                frame_numbers=(None,) * n,
            )
        return cls(
            voxels=array,
            geometry=geometry,
            identifiers=identifiers,
            modality=Modality.CT,
            source_format=SourceFormat.SYNTHETIC,
            sources=(Path(name),),
        )

    @property
    def shape(self) -> tuple[int, int, int]:
        """(slices, rows, columns)."""
        s = self.voxels.shape
        return (int(s[0]), int(s[1]), int(s[2]))

    @property
    def affine(self) -> npt.NDArray[np.float64]:
        """4x4 LPS affine over (slice, row, column) indices."""
        return self.geometry.affine
