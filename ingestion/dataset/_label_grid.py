"""A label map read onto its image's voxel grid: only when the two grids are the same up to
axis order and flips (nothing is resampled); otherwise the reason they differ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry
from ingestion.nifti import RAS_TO_LPS, nifti_affine_to_lps

__all__ = [
    "GRID_TOLERANCE_COS",
    "GRID_TOLERANCE_MM",
    "GridMismatch",
    "on_image_grid",
    "read_label_map",
]

GRID_TOLERANCE_MM = 1e-3
"""A label map is on its image's grid when its voxels lie within this distance (mm) of the
image's, with the same spacing (within this tolerance too) ..."""
GRID_TOLERANCE_COS = 1e-4
"""... and axes along the image's (direction cosines within this), up to order and flips."""
_AXES = ("slice", "row", "column")


class GridMismatch(Exception):
    pass


def read_label_map(path: Path) -> tuple[npt.NDArray[np.int64], Geometry]:
    """The label map as (slices, rows, columns) integers with its LPS geometry, read with
    MONAI's NibabelReader (NIfTI) or NrrdReader (NRRD: through ``ingestion.nrrd.load_nrrd``,
    which takes the geometry from the file's named space and refuses a file without one)."""
    import warnings

    if path.name.endswith(".nrrd"):
        from ingestion.nrrd import load_nrrd

        volume = load_nrrd(path)  # IngestionError: the caller reports it as unreadable
        voxels = volume.voxels
        if not np.array_equal(voxels, np.round(voxels)):
            raise GridMismatch("label map values are not integers (a probability map?)")
        return voxels.astype(np.int64), volume.geometry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from monai.data.image_reader import NibabelReader
        from monai.transforms.io.array import LoadImage

        reader = NibabelReader()
        data, meta = LoadImage(reader=reader, image_only=False, dtype=None)(str(path))
    array = np.asarray(data)
    if array.ndim == 4 and array.shape[3] == 1:
        array = array[..., 0]
    if array.ndim != 3:
        raise GridMismatch(f"label map of shape {array.shape}: a 3-D label map is needed")
    if not np.all(np.isfinite(array)) or not np.array_equal(array, np.round(array)):
        raise GridMismatch("label map values are not integers (a probability map?)")
    space = str(meta.get("space", "RAS"))
    affine = np.asarray(meta["affine"], dtype=np.float64)
    if space.upper() not in ("RAS", "LPS"):
        raise GridMismatch(f"label map in space {space!r}, neither RAS nor LPS")
    if space.upper() == "LPS":  # MONAI reports the NIfTI-style (RAS) affine unless told not to
        affine = RAS_TO_LPS @ affine
    try:
        geometry = Geometry.from_affine(nifti_affine_to_lps(affine))
    except ValueError as error:
        raise GridMismatch(f"unusable label map affine ({error})") from error
    return np.ascontiguousarray(array.transpose(2, 1, 0)).astype(np.int64), geometry


def on_image_grid(
    labels: npt.NDArray[np.int64], grid: Geometry, image_shape: tuple[int, ...], image: Geometry
) -> npt.NDArray[np.int64]:
    """``labels`` (on ``grid``) on the image's grid, when the two are the same grid up to axis
    order and flips (positions within GRID_TOLERANCE_MM, directions within
    GRID_TOLERANCE_COS); else GridMismatch saying how they differ."""
    lab_dirs, img_dirs = grid.direction, image.direction  # columns: (slice, row, column)
    perm: list[int] = []
    flips: list[bool] = []
    for i in range(3):
        dots = img_dirs[:, i] @ lab_dirs
        j = int(np.argmax(np.abs(dots)))
        sign = 1.0 if dots[j] > 0 else -1.0
        if np.linalg.norm(img_dirs[:, i] - sign * lab_dirs[:, j]) > GRID_TOLERANCE_COS:
            raise GridMismatch(
                f"image axis {_AXES[i]} {np.round(img_dirs[:, i], 5).tolist()} is along no label "
                f"map axis (directions {np.round(lab_dirs.T, 5).tolist()})"
            )
        if abs(image.spacing[i] - grid.spacing[j]) > GRID_TOLERANCE_MM:
            raise GridMismatch(
                f"spacing along the image's {_AXES[i]} axis is {image.spacing[i]:.4f} mm, the "
                f"label map's {grid.spacing[j]:.4f} mm"
            )
        if image_shape[i] != labels.shape[j]:
            raise GridMismatch(
                f"image of {image_shape[i]} voxels along its {_AXES[i]} axis, label map of "
                f"{labels.shape[j]}"
            )
        perm.append(j)
        flips.append(sign < 0)
    if sorted(perm) != [0, 1, 2]:
        raise GridMismatch("two image axes lie along one label map axis")
    moved = labels.transpose(perm)
    for axis, flip in enumerate(flips):
        if flip:
            moved = np.flip(moved, axis=axis)
    start = np.array([labels.shape[j] - 1 if f else 0 for j, f in zip(perm, flips, strict=True)])
    corner = np.zeros(3)
    corner[perm] = start
    offset = float(np.linalg.norm(grid.index_to_lps(corner) - np.asarray(image.origin)))
    if offset > GRID_TOLERANCE_MM:
        raise GridMismatch(
            f"the label map's voxels lie {offset:.3f} mm from the image's "
            f"(image origin {np.round(image.origin, 3).tolist()} mm LPS)"
        )
    return np.ascontiguousarray(moved)
