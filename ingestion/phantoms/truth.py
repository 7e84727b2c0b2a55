"""What a phantom is: its voxels, geometry, identifiers and the ground truth of its content."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry, Vector3

__all__ = ["BodyTruth", "FindingKindName", "Phantom", "TruthFinding", "derived_uid"]

FindingKindName = Literal["lesion", "vessel"]
TRUTH_FORMAT_VERSION = 1
_LESION_FIELDS = ("long_axis_mm", "short_axis_mm", "cc_extent_mm", "rotation_deg", "contrast_hu")
_VESSEL_FIELDS = ("diameter_mm",)


def derived_uid(*parts: object) -> str:
    """A deterministic DICOM UID under the 2.25 root (ISO/IEC 9834-8) from a hash of ``parts``."""
    text = "radcaliper-phantom/" + "/".join(str(p) for p in parts)
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "big") or 1
    return f"2.25.{value}"  # 128 bits: at most 39 digits, 44 characters (DICOM allows 64)


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _point(name: str, value: object) -> Vector3:
    arr = np.asarray(value, dtype=np.float64)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be three finite numbers (LPS mm), got {value!r}")
    return (float(arr[0]), float(arr[1]), float(arr[2]))


@dataclass(frozen=True)
class TruthFinding:
    """One true finding of a phantom.

    Args:
        kind: "lesion" or "vessel".
        center_lps_mm: lesion: the ellipsoid centre; vessel: the centre of its cross-section on
            slice ``slice_index``. DICOM patient coordinates (LPS, mm).
        slice_index: the slice nearest to the centre (0-based, in slice order).
        long_axis_mm, short_axis_mm: lesion only: axes of the axial cross-section through the
            centre (the ellipse's full axes).
        cc_extent_mm: lesion only: cranio-caudal extent (full axis along z).
        rotation_deg: lesion only: angle of the long axis from +x (patient left) towards +y
            (posterior), in [0, 180).
        contrast_hu: lesion only: lesion HU minus soft-tissue HU (negative for hypodense).
        diameter_mm: vessel only: diameter of the circular cross-section.
        hu: the object's HU before noise (lesion: soft tissue + contrast; vessel: its HU).
    """

    kind: FindingKindName
    center_lps_mm: Vector3
    slice_index: int
    long_axis_mm: float | None = None
    short_axis_mm: float | None = None
    cc_extent_mm: float | None = None
    rotation_deg: float | None = None
    contrast_hu: float | None = None
    diameter_mm: float | None = None
    hu: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("lesion", "vessel"):
            raise ValueError(f"kind must be 'lesion' or 'vessel', got {self.kind!r}")
        object.__setattr__(self, "center_lps_mm", _point("center_lps_mm", self.center_lps_mm))
        index = self.slice_index
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"slice_index must be an integer >= 0, got {index!r}")
        required = _LESION_FIELDS if self.kind == "lesion" else _VESSEL_FIELDS
        forbidden = _VESSEL_FIELDS if self.kind == "lesion" else _LESION_FIELDS
        for name in required:
            object.__setattr__(self, name, _finite(name, getattr(self, name)))
        for name in forbidden:
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is for the other kind of finding, not a {self.kind}")
        if self.hu is not None:
            object.__setattr__(self, "hu", _finite("hu", self.hu))
        if self.kind == "vessel" and self.hu is None:
            raise ValueError("hu is required for a vessel")

    @property
    def z_range_lps_mm(self) -> tuple[float, float] | None:
        """A lesion's extent along z (centre +- half its cranio-caudal extent); None for a
        vessel, which runs through the whole phantom."""
        if self.kind != "lesion" or self.cc_extent_mm is None:
            return None
        z, half = self.center_lps_mm[2], self.cc_extent_mm / 2.0
        return (z - half, z + half)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict; only the fields of this kind of finding."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "center_lps_mm": list(self.center_lps_mm),
            "slice_index": self.slice_index,
        }
        names = _LESION_FIELDS if self.kind == "lesion" else _VESSEL_FIELDS
        for name in (*names, "hu"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


@dataclass(frozen=True)
class BodyTruth:
    """The body of a phantom: an elliptic cylinder along z with a fat rim around soft tissue.

    Args:
        center_lps_mm: (x, y) of the ellipse centre (the centre of the field of view).
        semi_axes_mm: semi-axes along x (row direction) and y (column direction).
        fat_thickness_mm: thickness of the fat rim (distance from the outline to soft tissue).
        air_hu, fat_hu, soft_tissue_hu: intensities before noise.
        noise_sd_hu: standard deviation of the Gaussian noise inside the body.
    """

    center_lps_mm: tuple[float, float]
    semi_axes_mm: tuple[float, float]
    fat_thickness_mm: float
    air_hu: float
    fat_hu: float
    soft_tissue_hu: float
    noise_sd_hu: float

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "center_lps_mm": list(self.center_lps_mm),
            "semi_axes_mm": list(self.semi_axes_mm),
            "fat_thickness_mm": self.fat_thickness_mm,
            "air_hu": self.air_hu,
            "fat_hu": self.fat_hu,
            "soft_tissue_hu": self.soft_tissue_hu,
            "noise_sd_hu": self.noise_sd_hu,
        }


@dataclass(frozen=True, eq=False)
class Phantom:
    """A synthetic CT study in memory.

    Args:
        hu: int16 Hounsfield units, ``(slices, rows, columns)`` (radcaliper's array order).
        geometry: LPS geometry of ``hu`` (axial: rows along +x, columns along +y, slices along +z).
        findings: ground truth, lesions first, then the vessel if there is one.
        body: the body's parameters (outline, fat rim, intensities, noise).
        study_instance_uid, series_instance_uid: DICOM UIDs, deterministic from ``seed``.
        sop_instance_uids: one per slice, in slice order.
        patient_id: synthetic, e.g. "PHANTOM-<seed>" or "PHANTOM-<seed>-<index>".
        seed: the seed the phantom was generated from.
    """

    hu: npt.NDArray[np.int16]
    geometry: Geometry
    findings: tuple[TruthFinding, ...]
    body: BodyTruth
    study_instance_uid: str
    series_instance_uid: str
    sop_instance_uids: tuple[str, ...]
    patient_id: str
    seed: int

    def __post_init__(self) -> None:
        if not isinstance(self.hu, np.ndarray) or self.hu.ndim != 3 or self.hu.dtype != np.int16:
            shape = getattr(self.hu, "shape", None)
            dtype = getattr(self.hu, "dtype", None)
            raise ValueError(f"hu must be a 3-D int16 array, got shape {shape} and dtype {dtype}")
        if len(self.sop_instance_uids) != self.hu.shape[0]:
            raise ValueError(
                f"sop_instance_uids has {len(self.sop_instance_uids)} UIDs for "
                f"{self.hu.shape[0]} slices; give one per slice"
            )
        if not self.patient_id:
            raise ValueError("patient_id must be non-empty")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(slices, rows, columns)."""
        s = self.hu.shape
        return (int(s[0]), int(s[1]), int(s[2]))

    def truth_json(self) -> dict[str, Any]:
        """Ground truth and identifiers as a JSON-ready dict (what ``truth.json`` holds)."""
        g = self.geometry
        return {
            "format_version": TRUTH_FORMAT_VERSION,
            "seed": self.seed,
            "patient_id": self.patient_id,
            "study_instance_uid": self.study_instance_uid,
            "series_instance_uid": self.series_instance_uid,
            "sop_instance_uids": list(self.sop_instance_uids),
            "geometry": {
                "array_order": ["slice", "row", "column"],
                "shape": list(self.shape),
                "origin_lps_mm": list(g.origin),
                "spacing_mm": list(g.spacing),
                "row_direction": list(g.row_direction),
                "column_direction": list(g.column_direction),
                "slice_direction": list(g.slice_direction),
            },
            "body": self.body.to_json(),
            "findings": [f.to_json() for f in self.findings],
        }
