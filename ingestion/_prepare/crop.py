"""Resample a :class:`~ingestion.volume.Volume` onto any grid in patient space: a crop.

:func:`crop_volume` is :mod:`ingestion.prepare`'s resampling step applied to a small, arbitrary
grid instead of the whole volume: trilinear interpolation of the HU voxels through the full
affine (obliquity and gantry-tilt shear included), with air outside the volume. The measurer's
crops (``model.measurer.inputs.images.crop_around``) are made by it.

How it is done, with MONAI
--------------------------
1. The crop's affine relative to the volume's (both LPS, over ``(slice, row, column)``) maps a
   crop index to a volume index. The volume voxels that trilinear interpolation can reach from
   the crop (its eight corners' bounding box plus one voxel) are the only ones read: a crop
   costs the same in a 20-slice and in a 600-slice series.
2. Those voxels are shifted by ``-pad_value`` so that MONAI's zero padding is ``pad_value`` HU
   (as ``ShiftIntensityd`` around ``Spacingd`` does in ``build_preparation``).
3. The same affine, in float64, gives each crop voxel's position in the block, normalised to
   [-1, 1] between the block's first and last voxel centres; MONAI's ``Resample`` (bilinear =
   trilinear in 3-D, ``padding_mode="zeros"``, ``align_corners=True``) samples the block there,
   in float32. The result is shifted back by ``pad_value``.

A voxel is a point at its centre: a crop point between the volume's last voxel and one voxel
beyond it is blended with air; further out it is air. A crop grid that coincides with the
volume's voxels returns them unchanged (up to float32 rounding).

Cost: MONAI's ``Resample`` wraps its image, grid and output in ``MetaTensor`` objects, about
0.1 ms a call on one CPU core; the sampling itself (torch ``grid_sample``) costs about 0.2 ms for a
112 x 112 frame.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
from monai.data.meta_tensor import MetaTensor
from monai.transforms.spatial.array import Resample

from ingestion.geometry import Geometry
from ingestion.volume import Volume

__all__ = ["crop_volume"]

_F64 = npt.NDArray[np.float64]

_AIR_HU = -1000.0  # the default pad_value: air


def _grid_shape(shape: object) -> tuple[int, int, int]:
    if isinstance(shape, str) or not isinstance(shape, Sequence) or len(shape) != 3:
        raise ValueError(f"shape must be three integers (frames, rows, columns), got {shape!r}")
    sides: list[int] = []
    for n in shape:
        try:
            side = operator.index(n)
        except TypeError:
            side = 0
        if isinstance(n, bool) or side < 1:
            raise ValueError(
                f"shape must be three integers >= 1 (frames, rows, columns), got {shape!r}"
            )
        sides.append(side)
    return (sides[0], sides[1], sides[2])


def _block(
    to_index: _F64, shape: tuple[int, int, int], volume_shape: tuple[int, int, int]
) -> tuple[slice, ...] | None:
    """The volume voxels trilinear interpolation can reach from the crop grid: the bounding box
    of its corners in volume indices, widened to whole voxels, clipped to the volume; ``None``
    when that is empty (the crop lies more than a voxel outside the volume)."""
    block = []
    for axis in range(3):  # three numbers per axis: plain floats beat numpy here
        low = high = float(to_index[axis, 3])
        for j in range(3):
            step = float(to_index[axis, j]) * (shape[j] - 1)
            if step < 0:
                low += step
            else:
                high += step
        first = max(math.floor(low), 0)
        last = min(math.floor(high) + 1, volume_shape[axis] - 1)
        if first > last:
            return None
        block.append(slice(first, last + 1))
    return tuple(block)


@functools.cache
def _resample() -> Resample:
    """MONAI's resampler of the crop (made once, on first use): trilinear, zero padding, grid
    normalised to [-1, 1] from the block's first to last voxel centre (``align_corners=True``)."""
    return Resample(
        mode="bilinear",
        padding_mode="zeros",
        norm_coords=False,
        align_corners=True,
        dtype=np.float32,  # as the volume; MONAI's default would copy the block to float64
    )


def _normalised_grid(
    to_block: _F64, shape: tuple[int, int, int], block_shape: tuple[int, ...]
) -> torch.Tensor:
    """(3, F, R, C) float32: for each crop voxel, its block position normalised as
    ``grid_sample(align_corners=True)`` reads it: index ``i`` of ``n`` -> ``2 i / (n - 1) - 1``.

    The map is affine, so the grid is a sum of one table per crop axis (each computed in float64
    and rounded once), broadcast: no (4, N) base grid is built.
    """
    scale = 2.0 / (np.asarray(block_shape, dtype=np.float64) - 1.0)  # n >= 2 on every axis
    linear = to_block[:3, :3] * scale[:, None]  # (3 block axes, 3 crop axes)
    offset = to_block[:3, 3] * scale - 1.0  # (3,)
    tables = [
        torch.from_numpy((linear[:, axis, None] * np.arange(k)).astype(np.float32))
        for axis, k in enumerate(shape)
    ]  # (3, F), (3, R), (3, C)
    tables[0] += torch.from_numpy(offset.astype(np.float32))[:, None]
    return tables[0][:, :, None, None] + tables[1][:, None, :, None] + tables[2][:, None, None, :]


def crop_volume(
    volume: Volume,
    crop_geometry: Geometry,
    shape: Sequence[int],
    *,
    pad_value: float = _AIR_HU,
) -> torch.Tensor:
    """The HU of ``volume`` at every voxel centre of a crop grid, trilinearly interpolated.

    Args:
        volume: the source volume.
        crop_geometry: the crop grid: its ``(frame, row, column)`` index -> LPS mm. Any
            orientation, spacing or position; it may reach beyond the volume.
        shape: ``(frames, rows, columns)`` of the crop grid, each >= 1.
        pad_value: the intensity of everything outside the volume (default air, -1000 HU).

    Returns:
        float32 ``(frames, rows, columns)``; crop voxel ``(f, r, c)`` holds the volume sampled
        at ``crop_geometry.index_to_lps((f, r, c))``.

    Raises:
        ValueError: ``shape`` is not three integers >= 1, or ``pad_value`` is not finite.
    """
    grid_shape = _grid_shape(shape)
    if (
        isinstance(pad_value, bool)
        or not isinstance(pad_value, numbers.Real)
        or not math.isfinite(pad_value)
    ):
        raise ValueError(f"pad_value must be a finite number (HU), got {pad_value!r}")
    pad = float(pad_value)
    to_index = np.linalg.solve(volume.affine, crop_geometry.affine)  # crop index -> volume index
    inner = _block(to_index, grid_shape, volume.shape)
    if inner is None:  # nothing of the volume within reach: all padding
        return torch.full(grid_shape, pad, dtype=torch.float32)

    block = volume.voxels[inner] - np.float32(pad)  # (Sb, Rb, Cb): zero padding = pad_value
    # A one-voxel axis cannot be normalised (align_corners=True maps every position onto it):
    # append a padding voxel, which lies beyond the volume or beyond what the crop reaches.
    if 1 in block.shape:
        block = np.pad(block, [(0, int(n == 1)) for n in block.shape])
    to_block = to_index.copy()  # crop index -> block index
    to_block[:3, 3] -= [part.start for part in inner]
    grid = _normalised_grid(to_block, grid_shape, block.shape)  # (3, F, R, C)
    sampled = _resample()(torch.from_numpy(block)[None], grid)  # (1, F, R, C)
    out = sampled.as_tensor() if isinstance(sampled, MetaTensor) else sampled  # (1, F, R, C)
    return out[0].add_(pad)
