"""Turn a :class:`Layout` into int16 HU voxels with partial volume and noise.

Objects nest (lesions and the vessel lie in soft tissue, soft tissue in the body) and lesions and
the vessel do not touch, so the volume-weighted mix of a voxel is a sum of layers, each adding its
covered fraction times its step over the layer below::

    air + f_body (fat - air) + f_soft (soft - fat) + f_vessel (vessel - soft)
        + sum over lesions of f_lesion * contrast

The body, the fat/soft-tissue boundary and the vessel do not change along z: their fractions are
computed once per pixel and broadcast to every slice.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ingestion.phantoms.layout import Layout, body_depth_above
from ingestion.phantoms.shapes import (
    LATTICE_2D_COARSE,
    BoolArray,
    FloatArray,
    area_fraction,
    ellipsoid_fraction,
)

__all__ = ["render"]

_INT16 = np.iinfo(np.int16)


def _body_fractions(
    layout: Layout, x: FloatArray, y: FloatArray
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """(R, C) fractions of each pixel inside the body outline and inside the soft tissue."""
    body = layout.body
    px = layout.grid.pixel_mm
    half_diagonal = px * math.sqrt(0.5)
    xx, yy = np.meshgrid(x, y)  # (R, C)
    cx, cy = body.center_lps_mm
    a, b = body.semi_axes_mm
    t = body.fat_thickness_mm

    in_body, out_body = body_depth_above(body, xx, yy, 0.0, half_diagonal)

    def contains_body(xs: FloatArray, ys: FloatArray) -> BoolArray:
        return np.asarray(((xs - cx) / a) ** 2 + ((ys - cy) / b) ** 2 < 1.0)

    f_body = area_fraction(x, y, px, in_body, out_body, contains_body)

    in_soft, out_soft = body_depth_above(body, xx, yy, t, half_diagonal)

    def contains_soft(xs: FloatArray, ys: FloatArray) -> BoolArray:
        return body_depth_above(body, xs, ys, t)[0]

    f_soft = area_fraction(x, y, px, in_soft, out_soft, contains_soft, LATTICE_2D_COARSE)
    return f_body, f_soft


def _vessel_fraction(layout: Layout, x: FloatArray, y: FloatArray) -> npt.NDArray[np.float32]:
    """(R, C) fraction of each pixel inside the vessel's circular cross-section."""
    vessel = layout.vessel
    if vessel is None:
        return np.zeros((y.size, x.size), dtype=np.float32)
    px = layout.grid.pixel_mm
    vx, vy = vessel.center_xy
    r = vessel.diameter_mm / 2
    depth = r - np.hypot(x[None, :] - vx, y[:, None] - vy)  # (R, C), exact distance
    half_diagonal = px * math.sqrt(0.5)
    surely_in = depth > half_diagonal
    surely_out = depth < -half_diagonal

    def contains(xs: FloatArray, ys: FloatArray) -> BoolArray:
        return np.asarray((xs - vx) ** 2 + (ys - vy) ** 2 < r * r)

    return area_fraction(x, y, px, surely_in, surely_out, contains)


def render(layout: Layout, rng: np.random.Generator) -> npt.NDArray[np.int16]:
    """HU voxels ``(slices, rows, columns)`` of ``layout``, noise drawn from ``rng``."""
    grid, body = layout.grid, layout.body
    z, y, x = grid.axes()
    f_body, f_soft = _body_fractions(layout, x, y)
    f_vessel = _vessel_fraction(layout, x, y)
    soft = body.soft_tissue_hu
    base = (
        body.air_hu
        + f_body * np.float32(body.fat_hu - body.air_hu)
        + f_soft * np.float32(soft - body.fat_hu)
    )  # (R, C)
    if layout.vessel is not None:
        base += f_vessel * np.float32(layout.vessel.hu - soft)
    volume = np.empty((grid.slices, grid.matrix, grid.matrix), dtype=np.float32)  # (S, R, C)
    volume[:] = base.astype(np.float32)
    spacing = (grid.slice_spacing_mm, grid.pixel_mm, grid.pixel_mm)
    for lesion in layout.lesions:
        lx, ly, lz = lesion.center
        hit = ellipsoid_fraction(
            (z, y, x), spacing, (lz, ly, lx), lesion.semi_axes, lesion.angle_rad
        )
        if hit is not None:
            box, frac = hit
            volume[box] += frac * np.float32(lesion.contrast_hu)
    # Noise inside the body only, weighted by the body fraction at the outline.
    flat = volume.reshape(grid.slices, -1)  # (S, R*C), a view
    inside = np.flatnonzero(f_body.ravel() > 0)  # (P,)
    noise = rng.standard_normal((grid.slices, inside.size), dtype=np.float32)  # (S, P)
    noise *= np.float32(body.noise_sd_hu) * f_body.ravel()[inside]
    flat[:, inside] += noise
    np.rint(volume, out=volume)
    np.clip(volume, _INT16.min, _INT16.max, out=volume)
    return volume.astype(np.int16)
