"""The shapes of synthetic lesions (``model.measurer.data._insert``) and their partial volume.

A shape is ``{c + A u : |u| <= f(u / |u|)}`` with ``A`` a random rotation times the
semi-axes (squeezed along z where the volume is too thin) and ``f`` on the unit sphere: 1
(smooth ellipsoid), plus zonal cosines of order 2-5 about random axes (lobulated), plus thin
tapered spikes (spiculated). Its occupancy of each voxel is supersampled 3 x 3 in plane and at
half-pixel steps across the slice thickness; voxels whose 26 neighbours' centres all agree are
taken whole (a spike thinner than a voxel between voxel centres is missed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry

__all__ = ["LesionShape", "draw_shape", "occupancy"]

_SUPERSAMPLE_XY = 3


@dataclass(frozen=True)
class LesionShape:
    """``{centre + A u : |u| <= f(u / |u|)}`` (module doc); LPS mm.

    Args:
        matrix: ``A`` (3 x 3, LPS mm per unit of u).
        lobes: (axis, order, amplitude) of each zonal cosine.
        spikes: (axis, half width in rad, height) of each spike.
        style: "smooth", "lobulated" or "spiculated".
    """

    matrix: tuple[tuple[float, float, float], ...]
    lobes: tuple[tuple[tuple[float, float, float], int, float], ...] = ()
    spikes: tuple[tuple[tuple[float, float, float], float, float], ...] = ()
    style: str = "smooth"

    @classmethod
    def from_matrix(
        cls,
        matrix: npt.ArrayLike,
        lobes: tuple[tuple[tuple[float, float, float], int, float], ...] = (),
        spikes: tuple[tuple[tuple[float, float, float], float, float], ...] = (),
        style: str = "smooth",
    ) -> LesionShape:
        """A shape from a 3 x 3 ``A`` (e.g. a rotation times the semi-axes, in mm)."""
        a = np.asarray(matrix, dtype=np.float64)
        if a.shape != (3, 3) or abs(float(np.linalg.det(a))) < 1e-9:
            raise ValueError(f"matrix must be an invertible 3 x 3 array, got {a.tolist()}")
        rows = tuple((float(r[0]), float(r[1]), float(r[2])) for r in a)
        return cls(rows, lobes, spikes, style)

    @property
    def reach(self) -> float:
        """Largest value of ``f`` (a bound)."""
        return (
            1.0
            + sum(abs(a) for _, _, a in self.lobes)
            + max((h for _, _, h in self.spikes), default=0.0)
        )

    @property
    def radius_mm(self) -> float:
        """A bound on the distance of any point of the shape from its centre."""
        return float(np.linalg.norm(np.asarray(self.matrix), 2)) * self.reach

    def ellipsoid(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """An ellipsoid holding the shape: (directions as columns, semi-axes in mm)."""
        directions, singular, _ = np.linalg.svd(np.asarray(self.matrix))
        return np.asarray(directions), np.asarray(singular * self.reach, dtype=np.float64)

    def extent_mm(self) -> npt.NDArray[np.float64]:
        """A bound on the half extent along each LPS axis."""
        a = np.asarray(self.matrix)
        return np.asarray(np.sqrt((a * a).sum(axis=1)) * self.reach, dtype=np.float64)

    def inside(self, offsets: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        """Whether points at LPS ``offsets`` (..., 3) from the centre are in the shape."""
        u = offsets @ np.linalg.inv(np.asarray(self.matrix)).T
        radius = np.sqrt((u * u).sum(axis=-1))
        direction = u / np.maximum(radius, 1e-12)[..., None]
        level = np.ones(radius.shape)
        for axis, order, amplitude in self.lobes:
            cos = np.clip(direction @ np.asarray(axis), -1.0, 1.0)
            level += amplitude * np.cos(order * np.arccos(cos))
        for axis, width, height in self.spikes:
            angle = np.arccos(np.clip(direction @ np.asarray(axis), -1.0, 1.0))
            level += height * np.clip(1.0 - angle / width, 0.0, None) ** 2
        result: npt.NDArray[np.bool_] = radius <= level
        return result


def _unit(rng: np.random.Generator) -> tuple[float, float, float]:
    v = rng.normal(size=3)
    v /= np.linalg.norm(v)
    return (float(v[0]), float(v[1]), float(v[2]))


def _rotation(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """A uniformly random 3-D rotation (a random unit quaternion)."""
    w, x, y, z = rng.normal(size=4) / 1.0
    n = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / n, x / n, y / n, z / n
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def draw_shape(
    rng: np.random.Generator, long_axis_mm: float, style: str, max_half_z_mm: float
) -> LesionShape:
    """A random shape of about ``long_axis_mm`` across (module doc), at most ``max_half_z_mm``
    from its centre along z (squeezed along z where needed)."""
    lobes: list[tuple[tuple[float, float, float], int, float]] = []
    spikes: list[tuple[tuple[float, float, float], float, float]] = []
    if style in ("lobulated", "spiculated"):
        for _ in range(int(rng.integers(2, 5))):
            sign = 1.0 if rng.uniform() < 0.5 else -1.0
            lobes.append(
                (_unit(rng), int(rng.integers(2, 6)), sign * float(rng.uniform(0.04, 0.1)))
            )
    if style == "spiculated":
        for _ in range(int(rng.integers(6, 16))):
            spikes.append(
                (_unit(rng), float(rng.uniform(0.06, 0.12)), float(rng.uniform(0.3, 0.7)))
            )
    bulk = 1.0 + sum(abs(a) for _, _, a in lobes)
    semi = long_axis_mm / 2.0 / bulk
    axes = np.array([semi, semi * rng.uniform(0.5, 1.0), semi * rng.uniform(0.5, 1.0)])
    matrix = _rotation(rng) @ np.diag(axes)
    shape = LesionShape.from_matrix(matrix, tuple(lobes), tuple(spikes), style)
    half_z = shape.extent_mm()[2]
    if half_z > max_half_z_mm:
        matrix = np.diag([1.0, 1.0, max_half_z_mm / half_z]) @ matrix
        shape = LesionShape.from_matrix(matrix, tuple(lobes), tuple(spikes), style)
    return shape


def occupancy(
    shape: LesionShape,
    centre_index: npt.NDArray[np.float64],
    geometry: Geometry,
    volume_shape: tuple[int, int, int],
    *,
    pad_px: int = 0,
) -> tuple[tuple[slice, slice, slice], npt.NDArray[np.float32]]:
    """The shape's occupancy of each voxel of its bounding box (module doc), the box widened
    by ``pad_px`` in plane and clipped to the volume: (box, fractions)."""
    spacing = np.asarray(geometry.spacing)
    step = np.asarray(geometry.direction) * spacing  # index -> LPS offset (columns: axes)
    reach = np.abs(np.linalg.inv(step)) @ shape.extent_mm()  # a bound in index units
    pad = np.array([0, pad_px, pad_px])
    low = np.maximum(np.floor(centre_index - reach - 1).astype(int) - pad, 0)
    high = np.minimum(np.ceil(centre_index + reach + 2).astype(int) + pad, np.asarray(volume_shape))
    box = (slice(low[0], high[0]), slice(low[1], high[1]), slice(low[2], high[2]))
    grid = np.stack(
        np.meshgrid(
            *[np.arange(a, b, dtype=np.float64) for a, b in zip(low, high, strict=True)],
            indexing="ij",
        ),
        axis=-1,
    )  # (s, r, c, 3) voxel indices
    offsets = (grid - centre_index) @ step.T
    centre_inside = shape.inside(offsets)
    from scipy import ndimage

    cube = np.ones((3, 3, 3), dtype=bool)
    mixed = ndimage.binary_dilation(centre_inside, cube) & ~ndimage.binary_erosion(
        centre_inside, cube, border_value=0
    )
    result = centre_inside.astype(np.float32)
    if mixed.any():
        n_z = max(2, math.ceil(2.0 * spacing[0] / min(spacing[1], spacing[2])))
        sub = [(np.arange(n) + 0.5) / n - 0.5 for n in (n_z, _SUPERSAMPLE_XY, _SUPERSAMPLE_XY)]
        sub_grid = np.stack(np.meshgrid(*sub, indexing="ij"), axis=-1).reshape(-1, 3)
        where = np.argwhere(mixed)
        fractions = np.empty(len(where), dtype=np.float32)
        chunk = max(1, 400_000 // len(sub_grid))
        for start in range(0, len(where), chunk):
            part = where[start : start + chunk]
            points = grid[part[:, 0], part[:, 1], part[:, 2]][:, None, :] + sub_grid[None]
            inside = shape.inside((points - centre_index) @ step.T)
            fractions[start : start + chunk] = inside.mean(axis=1)
        result[mixed] = fractions
    return box, result
