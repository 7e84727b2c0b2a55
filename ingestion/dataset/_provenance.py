"""Where a dataset's line came from and which image it names, for
:mod:`ingestion.dataset.format` (import these names from there): the source types, the finding
labels, :class:`Provenance`, :class:`ImageRef`, a finding's readers' :class:`Read` and its
:class:`MaskRef`, and the checks of the values read back from a dataset's files (:func:`_text`,
:func:`_number`, ...).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "KINDS",
    "READ_TOLERANCE_MM",
    "ImageRef",
    "KindName",
    "Label",
    "MaskRef",
    "Provenance",
    "Read",
    "Segment",
    "SourceType",
    "Vector3",
]

Vector3 = tuple[float, float, float]
Segment = tuple[Vector3, Vector3]
KindName = Literal["lesion", "vessel"]
KINDS: tuple[KindName, ...] = ("lesion", "vessel")


class SourceType(enum.StrEnum):
    """Where truth comes from."""

    MASKS = "masks"  # image + label map (NIfTI / NRRD)
    SEG = "seg"  # DICOM Segmentation + its referenced series
    SR = "sr"  # DICOM SR TID 1500 measurement groups
    STORE = "store"  # reviewed measurements in radcaliper's store
    PHANTOMS = "phantoms"  # `radcaliper phantoms` folders
    READS = "reads"  # image crops + masks + each reader's long and short axis (reads.csv)


class Label(enum.StrEnum):
    """A row is a true finding, or a place a reviewer said holds none (a rejected finding)."""

    FINDING = "finding"
    NEGATIVE = "negative"


def _text(name: str, value: object, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise ValueError(f"{name} must be {'a' if empty else 'a non-empty'} string, got {value!r}")
    return value


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _positive(name: str, value: object) -> float | None:
    if value is None:
        return None
    number = _number(name, value)
    if number <= 0:
        raise ValueError(f"{name} must be > 0 mm, got {number}")
    return number


def _point(name: str, value: object) -> Vector3:
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError(f"{name} must be three numbers (LPS mm), got {value!r}")
    x, y, z = (_number(name, v) for v in value)
    return (x, y, z)


def _segment(name: str, value: object) -> Segment | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"{name} must be two points (LPS mm), got {value!r}")
    return (_point(name, value[0]), _point(name, value[1]))


@dataclass(frozen=True)
class Provenance:
    """Where a row came from.

    Args:
        source: the kind of input.
        path: the input as imported (a file or folder, resolved).
        item: where in the input, e.g. "label 2 (cancer), component 1", "measurement group 3".
        annotator: who made the truth ("TotalSegmentator", "reviewer alice", "phantom generator").
        licence: the input's licence or terms of use ("unknown" when not given).
        annotated_at: when the truth was made, ISO 8601, where known (a review's time).
    """

    source: SourceType
    path: str
    item: str = ""
    annotator: str = "unknown"
    licence: str = "unknown"
    annotated_at: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", SourceType(self.source))
        _text("provenance path", self.path)
        _text("provenance item", self.item, empty=True)
        _text("annotator", self.annotator)
        _text("licence", self.licence)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source.value,
            "path": self.path,
            "item": self.item,
            "annotator": self.annotator,
            "licence": self.licence,
            "annotated_at": self.annotated_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Provenance:
        return cls(
            SourceType(data["source"]),
            data["path"],
            data.get("item", ""),
            data.get("annotator", "unknown"),
            data.get("licence", "unknown"),
            data.get("annotated_at"),
        )


@dataclass(frozen=True)
class ImageRef:
    """The image a study's truth refers to, as ``ingestion.load.load_path`` reads it.

    Args:
        path: a DICOM folder or file, or a NIfTI or NRRD file; relative paths are relative to
            the dataset folder.
        format: "dicom", "nifti", "nrrd" or "phantom" (a `radcaliper phantoms` study folder).
        modality: "CT" or "MR" where known (NIfTI and NRRD do not record it).
    """

    path: str
    format: str
    modality: str | None = None

    def __post_init__(self) -> None:
        _text("image path", self.path)
        if self.format not in ("dicom", "nifti", "nrrd", "phantom"):
            raise ValueError(
                f"image format must be dicom, nifti, nrrd or phantom, got {self.format!r}"
            )

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "modality": self.modality}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageRef:
        return cls(data["path"], data["format"], data.get("modality"))

    def resolve(self, root: Path) -> Path:
        """The image's path (relative paths are taken from the dataset folder ``root``)."""
        path = Path(self.path)
        return path if path.is_absolute() else root / path


READ_TOLERANCE_MM = 0.01
"""A read's short axis may exceed its long axis by this much (mm): the rounding of values
written to two decimals; more is a wrong read."""


@dataclass(frozen=True)
class Read:
    """One reader's measurement of a lesion: long axis and the short axis perpendicular to it
    (mm). A finding keeps every reader's (``DatasetFinding.reads``); its own long and short
    axis are the readers' median, the truth to score against."""

    long_axis_mm: float
    short_axis_mm: float

    def __post_init__(self) -> None:
        for name in ("long_axis_mm", "short_axis_mm"):
            number = _number(f"read {name}", getattr(self, name))
            if number <= 0:
                raise ValueError(f"read {name} must be > 0 mm, got {number}")
            object.__setattr__(self, name, number)
        if self.short_axis_mm > self.long_axis_mm + READ_TOLERANCE_MM:
            raise ValueError(
                f"read short axis {self.short_axis_mm} mm exceeds its long axis "
                f"{self.long_axis_mm} mm"
            )

    def to_json(self) -> dict[str, float]:
        return {"long_axis_mm": self.long_axis_mm, "short_axis_mm": self.short_axis_mm}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Read:
        return cls(data["long_axis_mm"], data["short_axis_mm"])


@dataclass(frozen=True)
class MaskRef:
    """The label map a finding came from, on its image's grid: the voxels of value ``label``
    are the finding (a click evaluation places clicks inside them and negatives outside).

    Args:
        path: a NIfTI or NRRD label map; relative paths are relative to the dataset folder.
        label: the finding's label value (>= 1).
    """

    path: str
    label: int

    def __post_init__(self) -> None:
        _text("mask path", self.path)
        label = self.label
        if isinstance(label, bool) or not isinstance(label, int) or label < 1:
            raise ValueError(f"mask label must be an integer >= 1, got {label!r}")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "label": self.label}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MaskRef:
        return cls(data["path"], data["label"])

    def resolve(self, root: Path) -> Path:
        """The label map's path (relative paths are taken from the dataset folder ``root``)."""
        path = Path(self.path)
        return path if path.is_absolute() else root / path
