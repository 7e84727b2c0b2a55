"""Where a simulated reader clicks on a lesion, for the click task (``evaluate --task click``)
and the click-seeded baseline: one rule, so every scorer clicks the same points.

- :func:`lesion_clicks`: the lesion's largest slice (``ingestion.dataset.recist``'s rule: the
  largest cross-section, ties to the slice nearest the centroid slice, then the lower index);
  the primary click is the voxel of that section deepest inside it (the largest in-plane
  distance to the outside, in mm with the real pixel spacing; ties to the voxel nearest the
  section's centroid), where a reader aiming at "the middle of the nodule" clicks; the extra
  clicks are drawn at random among the section's voxels at least one pixel inside its edge
  (a reader's aim varies, but a click on the edge is a click on the background too).
- :func:`negative_click`: a point in the lung near the lesion but clearly outside it, where a
  measurer should answer "nothing here".

Points are voxel centres mapped to LPS mm through the geometry. Pure numpy/scipy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingestion.dataset.recist import measured_slice
from ingestion.geometry import Geometry, Vector3

__all__ = ["LUNG_HU", "ClickPoints", "lesion_clicks", "negative_click"]

LUNG_HU = (-950.0, -500.0)
"""Hounsfield units of aerated lung parenchyma (inclusive): normal lung is about -900 to -700
HU; above -500 lie ground glass, vessels, partial volume at tissue edges and soft tissue; below
-950 lie air in airways, emphysema and the air outside the body. A negative click in this range
is on lung, not on another structure a measurer could rightly name."""


@dataclass(frozen=True)
class ClickPoints:
    """The clicks on one lesion.

    Args:
        slice_index: the lesion's largest slice (0-based, array order), where all clicks lie.
        primary_lps_mm: the click deepest inside the section (LPS mm).
        extra_lps_mm: further clicks inside the section, distinct voxels (LPS mm).
    """

    slice_index: int
    primary_lps_mm: Vector3
    extra_lps_mm: tuple[Vector3, ...]


def _mask(mask: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    array = np.asarray(mask, dtype=bool)
    if array.ndim != 3 or not array.any():
        raise ValueError(
            f"mask must be a non-empty boolean (slices, rows, columns) array, got shape "
            f"{array.shape} with {int(array.sum())} voxels set"
        )
    return array


def _lps(
    geometry: Geometry, slice_index: int, rows: npt.ArrayLike, cols: npt.ArrayLike
) -> list[Vector3]:
    rows, cols = np.asarray(rows, dtype=np.float64), np.asarray(cols, dtype=np.float64)
    index = np.column_stack([np.full(len(rows), float(slice_index)), rows, cols])
    return [(float(p[0]), float(p[1]), float(p[2])) for p in geometry.index_to_lps(index)]


def _inplane_mm(geometry: Geometry) -> npt.NDArray[np.float64]:
    """(3, 2) matrix from (row, column) index offsets to LPS offsets in mm: its columns are
    one row's step and one column's step (oblique and sheared grids included)."""
    return np.column_stack(
        [
            np.asarray(geometry.column_direction) * geometry.row_spacing,
            np.asarray(geometry.row_direction) * geometry.column_spacing,
        ]
    )  # (3, 2)


def lesion_clicks(
    mask: npt.ArrayLike, geometry: Geometry, *, extra: int = 2, rng: np.random.Generator
) -> ClickPoints:
    """The primary and ``extra`` random clicks on a lesion mask (module doc).

    Fewer than ``extra`` extra clicks come back only where the section has fewer voxels
    besides the primary one. The primary click does not depend on ``rng``.

    Args:
        mask: boolean (slices, rows, columns) array of one lesion, on ``geometry``'s grid.
        geometry: the mask's grid.
        extra: how many extra clicks (>= 0).
        rng: draws the extra clicks.

    Raises:
        ValueError: the mask is not 3-D or is empty, or ``extra`` is negative.
    """
    from scipy import ndimage

    array = _mask(mask)
    if extra < 0:
        raise ValueError(f"extra must be >= 0, got {extra}")
    s = measured_slice(array)
    section = array[s]
    # depth in mm with the real pixel spacing (rows and columns are orthogonal in DICOM);
    # the outside includes what lies beyond the crop: pad by one pixel of background
    depth = ndimage.distance_transform_edt(
        np.pad(section, 1), sampling=(geometry.row_spacing, geometry.column_spacing)
    )[1:-1, 1:-1]
    rows, cols = np.nonzero(section)
    deepest = depth[rows, cols] >= depth[rows, cols].max() - 1e-9
    offsets = np.column_stack([rows - rows.mean(), cols - cols.mean()]) @ _inplane_mm(geometry).T
    off_centre = np.linalg.norm(offsets, axis=1)  # (N,) mm from the section's centroid
    order = np.lexsort((cols, rows, off_centre, ~deepest))  # deepest, then central, then index
    primary = int(order[0])

    interior = ndimage.binary_erosion(section, structure=np.ones((3, 3), bool), border_value=0)
    interior[rows[primary], cols[primary]] = False
    others = section.copy()
    others[rows[primary], cols[primary]] = False
    pool_rows, pool_cols = np.nonzero(interior if interior.any() else others)
    chosen = rng.choice(len(pool_rows), size=min(extra, len(pool_rows)), replace=False)
    return ClickPoints(
        slice_index=s,
        primary_lps_mm=_lps(geometry, s, [rows[primary]], [cols[primary]])[0],
        extra_lps_mm=tuple(_lps(geometry, s, pool_rows[chosen], pool_cols[chosen])),
    )


def negative_click(
    image_hu: npt.ArrayLike,
    mask: npt.ArrayLike,
    geometry: Geometry,
    *,
    rng: np.random.Generator,
    margin_mm: float = 5.0,
) -> Vector3 | None:
    """A random point in the lung near a lesion but clear of it (module doc), or None.

    The point is a voxel centre whose HU lies in :data:`LUNG_HU`, at least ``margin_mm`` (3-D,
    to the nearest mask voxel centre) from the lesion and at least ``margin_mm`` in-plane from
    the crop's first and last rows and columns (a measurer sees context around it). It lies on
    the lesion's largest slice, else on the nearest slice that has such a voxel (the nearer
    below first); the voxel is drawn uniformly among that slice's candidates.

    Args:
        image_hu: (slices, rows, columns) Hounsfield units.
        mask: boolean lesion mask on the same grid.
        geometry: their grid.
        rng: draws the point.
        margin_mm: clearance from the lesion and the in-plane edge (> 0).

    Raises:
        ValueError: the arrays differ in shape, the mask is empty, or ``margin_mm`` <= 0.
    """
    from scipy.spatial import cKDTree

    array = _mask(mask)
    image = np.asarray(image_hu, dtype=np.float64)
    if image.shape != array.shape:
        raise ValueError(f"image_hu of shape {image.shape} and mask of {array.shape} differ")
    if not margin_mm > 0:
        raise ValueError(f"margin_mm must be > 0, got {margin_mm}")
    n_slices, n_rows, n_cols = array.shape
    edge_rows = int(np.ceil(margin_mm / geometry.row_spacing - 1e-9))
    edge_cols = int(np.ceil(margin_mm / geometry.column_spacing - 1e-9))
    inner = np.zeros((n_rows, n_cols), dtype=bool)
    inner[edge_rows : n_rows - edge_rows, edge_cols : n_cols - edge_cols] = True
    lesion = cKDTree(geometry.index_to_lps(np.argwhere(array).astype(np.float64)))
    s0 = measured_slice(array)
    for s in sorted(range(n_slices), key=lambda k: (abs(k - s0), k)):
        lung = inner & (image[s] >= LUNG_HU[0]) & (image[s] <= LUNG_HU[1])
        rows, cols = np.nonzero(lung)
        if len(rows) == 0:
            continue
        index = np.column_stack([np.full(len(rows), float(s)), rows, cols])
        distance, _ = lesion.query(geometry.index_to_lps(index))
        clear = np.flatnonzero(distance >= margin_mm)
        if len(clear):
            k = int(clear[rng.integers(len(clear))])
            return _lps(geometry, s, [rows[k]], [cols[k]])[0]
    return None
