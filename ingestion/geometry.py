"""Voxel geometry in DICOM patient space (LPS, millimetres).

A :class:`Geometry` maps array indices of a volume stored as ``voxels[slice, row, column]`` to
patient coordinates. The axes are named after the array, so that ``index_to_lps`` takes
``(slice, row, column)`` in the same order as the array does:

- ``row_direction``: the unit vector along a row, i.e. the direction in which the *column* index
  grows (DICOM ImageOrientationPatient[0:3]);
- ``column_direction``: the direction in which the *row* index grows (IOP[3:6]);
- ``slice_direction``: the direction in which the slice index grows. For DICOM it is the unit
  vector from one slice position to the next; it is the image normal unless the gantry was tilted.

``spacing`` is in array order too: (slice, row, column), where ``row`` spacing is the distance
between adjacent rows (PixelSpacing[0]) and ``column`` spacing between adjacent columns
(PixelSpacing[1]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["Geometry", "PlaneLabel", "Vector3"]

Vector3 = tuple[float, float, float]
PlaneLabel = Literal["axial", "coronal", "sagittal", "oblique"]

_UNIT_TOLERANCE = 1e-3
# A plane is labelled axial/coronal/sagittal when its normal is within this angle of an axis.
_PLANE_TOLERANCE_DEG = 10.0


def _vector(name: str, value: object) -> Vector3:
    arr = np.asarray(value, dtype=np.float64)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be three finite numbers, got {value!r}")
    return (float(arr[0]), float(arr[1]), float(arr[2]))


def _unit(name: str, value: object) -> Vector3:
    vec = _vector(name, value)
    norm = math.sqrt(sum(c * c for c in vec))
    if abs(norm - 1.0) > _UNIT_TOLERANCE:
        raise ValueError(f"{name} must be a unit vector, got {vec} with length {norm:.6f}")
    return (vec[0] / norm, vec[1] / norm, vec[2] / norm)


@dataclass(frozen=True)
class Geometry:
    """Where every voxel of a ``(slice, row, column)`` array lies in LPS patient space.

    Args:
        origin: LPS position (mm) of the centre of voxel ``[0, 0, 0]``.
        row_direction: unit vector in which the column index grows (IOP[0:3]).
        column_direction: unit vector in which the row index grows (IOP[3:6]).
        slice_direction: unit vector in which the slice index grows.
        spacing: (slice, row, column) spacing in mm, all > 0.
    """

    origin: Vector3
    row_direction: Vector3
    column_direction: Vector3
    slice_direction: Vector3
    spacing: Vector3

    def __post_init__(self) -> None:
        object.__setattr__(self, "origin", _vector("origin", self.origin))
        for name in ("row_direction", "column_direction", "slice_direction"):
            object.__setattr__(self, name, _unit(name, getattr(self, name)))
        spacing = _vector("spacing", self.spacing)
        if min(spacing) <= 0:
            raise ValueError(f"spacing must be > 0 mm along every axis, got {spacing}")
        object.__setattr__(self, "spacing", spacing)
        if abs(float(np.linalg.det(self.direction))) < 1e-3:
            raise ValueError(
                "row_direction, column_direction and slice_direction are (nearly) coplanar: "
                f"{self.row_direction}, {self.column_direction}, {self.slice_direction}"
            )

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def from_affine(cls, affine: npt.ArrayLike) -> Geometry:
        """Build from a 4x4 LPS affine over ``(slice, row, column)`` indices."""
        mat = np.asarray(affine, dtype=np.float64)
        if mat.shape != (4, 4) or not np.all(np.isfinite(mat)):
            raise ValueError(f"affine must be a finite 4x4 matrix, got shape {mat.shape}")
        spacing = np.linalg.norm(mat[:3, :3], axis=0)
        if np.any(spacing <= 0):
            raise ValueError(f"affine has a zero-length axis: column norms {spacing.tolist()}")
        direction = mat[:3, :3] / spacing
        return cls(
            origin=_vector("origin", mat[:3, 3]),
            slice_direction=_vector("slice_direction", direction[:, 0]),
            column_direction=_vector("column_direction", direction[:, 1]),
            row_direction=_vector("row_direction", direction[:, 2]),
            spacing=_vector("spacing", spacing[[0, 1, 2]]),
        )

    # -- derived values -----------------------------------------------------------------------
    @property
    def slice_spacing(self) -> float:
        """Distance (mm) between the centres of adjacent slices along ``slice_direction``."""
        return self.spacing[0]

    @property
    def row_spacing(self) -> float:
        """Distance (mm) between the centres of adjacent rows (PixelSpacing[0])."""
        return self.spacing[1]

    @property
    def column_spacing(self) -> float:
        """Distance (mm) between the centres of adjacent columns (PixelSpacing[1])."""
        return self.spacing[2]

    @property
    def direction(self) -> npt.NDArray[np.float64]:
        """3x3 matrix whose columns are the unit vectors of the (slice, row, column) axes."""
        return np.array(
            [self.slice_direction, self.column_direction, self.row_direction], dtype=np.float64
        ).T

    @property
    def affine(self) -> npt.NDArray[np.float64]:
        """4x4 matrix: ``lps = affine @ [slice, row, column, 1]``."""
        mat = np.eye(4)
        mat[:3, :3] = self.direction * np.asarray(self.spacing)
        mat[:3, 3] = self.origin
        return mat

    @property
    def normal(self) -> Vector3:
        """Unit normal of the image plane: row_direction x column_direction."""
        n = np.cross(self.row_direction, self.column_direction)
        n = n / np.linalg.norm(n)
        return (float(n[0]), float(n[1]), float(n[2]))

    @property
    def slice_plane_distance(self) -> float:
        """Distance (mm) between adjacent image planes (slice step projected on the normal)."""
        return abs(float(np.dot(self.normal, self.slice_direction))) * self.slice_spacing

    @property
    def tilt_degrees(self) -> float:
        """Angle between the slice axis and the image normal (gantry tilt; 0 for a plain stack)."""
        cos = abs(float(np.dot(self.normal, self.slice_direction)))
        return math.degrees(math.acos(min(1.0, cos)))

    @property
    def plane(self) -> PlaneLabel:
        """axial / coronal / sagittal: normal within 10 degrees of that axis; else oblique."""
        n = np.abs(np.asarray(self.normal))
        axis = int(np.argmax(n))
        if n[axis] < math.cos(math.radians(_PLANE_TOLERANCE_DEG)):
            return "oblique"
        labels: tuple[PlaneLabel, PlaneLabel, PlaneLabel] = ("sagittal", "coronal", "axial")
        return labels[axis]

    # -- transforms ---------------------------------------------------------------------------
    def index_to_lps(self, index: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Map ``(..., 3)`` (slice, row, column) indices (fractional allowed) to LPS mm."""
        idx = np.asarray(index, dtype=np.float64)
        if idx.shape[-1:] != (3,):
            raise ValueError(f"index must have a last axis of size 3, got shape {idx.shape}")
        mat = self.affine
        return np.asarray(idx @ mat[:3, :3].T + mat[:3, 3], dtype=np.float64)

    def lps_to_index(self, points: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Map ``(..., 3)`` LPS points (mm) to fractional (slice, row, column) indices."""
        pts = np.asarray(points, dtype=np.float64)
        if pts.shape[-1:] != (3,):
            raise ValueError(f"points must have a last axis of size 3, got shape {pts.shape}")
        mat = self.affine
        inv = np.linalg.inv(mat[:3, :3])
        return np.asarray((pts - mat[:3, 3]) @ inv.T, dtype=np.float64)
