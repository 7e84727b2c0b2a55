"""Shape maths for the phantoms: distances to ellipses and partial-volume fractions of voxels.

Partial volume is computed exactly enough, and only where it matters: a voxel whose centre is
farther from an object's boundary than the voxel's half diagonal is wholly inside or outside
(the distance is 1-Lipschitz); only the remaining boundary voxels are supersampled, on a rank-1
lattice (a Fibonacci lattice in 2-D, a Korobov lattice in 3-D). Unlike a regular n x n grid, a
rank-1 lattice of N points has N distinct coordinates along every axis, so an edge parallel to a
voxel face is resolved to 1/N of the voxel instead of 1/n.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = [
    "BoolArray",
    "FloatArray",
    "area_fraction",
    "ellipse_depth",
    "ellipse_depth_bounds",
    "ellipse_points",
    "ellipsoid_fraction",
    "threshold_classes",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Closest-point iterations on an ellipse (https://blog.chatfield.io/simple-method-for-distance-to-ellipse/).
# Four reach 1e-5 mm for axis ratios up to 2:1; six leave margin for the 2.5:1 of thin lesions.
_ELLIPSE_ITERATIONS = 6
# Slack (mm) added to distance tests for the iteration's residual error.
DISTANCE_EPS_MM = 1e-3
# Boundary voxels are supersampled in chunks of about this many samples to bound memory.
_CHUNK_SAMPLES = 1 << 19


def _rank1_lattice(n: int, generator: tuple[int, ...]) -> FloatArray:
    """``n`` points ``(k * generator mod n + 0.5) / n - 0.5``: offsets within a unit cell."""
    k = np.arange(n)[:, None]  # (N, 1)
    points = ((k * np.asarray(generator)[None, :]) % n + 0.5) / n - 0.5  # (N, D)
    return np.asarray(points, dtype=np.float64)


# 2-D: Fibonacci lattices (generator: the previous Fibonacci number). Columns: (x, y). The fine
# one serves cheap membership tests (ellipse, circle), the coarse one the fat/soft-tissue boundary,
# whose test needs distances to an ellipse and whose contrast is a sixth of the air/body edge's.
LATTICE_2D_FINE = _rank1_lattice(610, (1, 377))
LATTICE_2D_COARSE = _rank1_lattice(144, (1, 89))
# 3-D: Korobov lattice, 89 points, generator (1, 23, 23**2); 23 maximises the smallest distance
# between points on the torus. Columns: (z, y, x).
LATTICE_3D = _rank1_lattice(89, (1, 23, 23 * 23))


def ellipse_depth(x: npt.ArrayLike, y: npt.ArrayLike, a: float, b: float) -> FloatArray:
    """Signed distance (mm) from points to an axis-aligned ellipse at the origin, > 0 inside.

    Args:
        x, y: point coordinates relative to the centre (broadcastable arrays).
        a, b: semi-axes along x and y (mm, > 0).
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    px, py = np.abs(xa), np.abs(ya)
    tx = np.full(np.broadcast_shapes(px.shape, py.shape), math.sqrt(0.5))
    ty = tx.copy()
    c = a * a - b * b
    for _ in range(_ELLIPSE_ITERATIONS):
        ex = c * tx**3 / a  # evolute of the ellipse at the current parameter
        ey = -c * ty**3 / b
        r = np.hypot(a * tx - ex, b * ty - ey)
        qx, qy = px - ex, py - ey
        q = np.maximum(np.hypot(qx, qy), 1e-12)
        tx = np.clip((qx * r / q + ex) / a, 0.0, 1.0)
        ty = np.clip((qy * r / q + ey) / b, 0.0, 1.0)
        norm = np.hypot(tx, ty)
        tx, ty = tx / norm, ty / norm
    dist = np.hypot(px - a * tx, py - b * ty)
    inside = (xa / a) ** 2 + (ya / b) ** 2 < 1.0
    return np.where(inside, dist, -dist)


def ellipse_depth_bounds(
    x: npt.ArrayLike, y: npt.ArrayLike, a: float, b: float
) -> tuple[FloatArray, FloatArray]:
    """Cheap lower and upper bounds of :func:`ellipse_depth` (no iteration).

    With ``g = |(x/a, y/b)|``, the distance to the boundary lies between ``min(a, b)|1 - g|``
    (``g`` is 1/min(a, b)-Lipschitz) and ``max(a, b)|1 - g|`` (the boundary point on the ray).
    """
    g = np.hypot(np.asarray(x, dtype=np.float64) / a, np.asarray(y, dtype=np.float64) / b)
    one_minus = 1.0 - g
    lo_axis, hi_axis = min(a, b), max(a, b)
    first, second = lo_axis * one_minus, hi_axis * one_minus
    return np.minimum(first, second), np.maximum(first, second)


def threshold_classes(
    depth_bounds: tuple[FloatArray, FloatArray],
    exact: Callable[[BoolArray], FloatArray],
    threshold: float,
    radius: float,
) -> tuple[BoolArray, BoolArray]:
    """Which points have depth > threshold for every point within ``radius`` (and < for none).

    Args:
        depth_bounds: (lower, upper) bounds of the depth at each point.
        exact: returns the exact depth at the points selected by a mask (called only on points the
            bounds cannot decide).
        threshold: the depth of the boundary (0 for the outline itself).
        radius: how far the test must hold (a voxel's half diagonal; 0 for a point test).

    Returns:
        (surely_inside, surely_outside) masks.
    """
    lo, hi = depth_bounds
    slack = radius + DISTANCE_EPS_MM
    inside = lo - slack > threshold
    outside = hi + slack < threshold
    unsure = ~(inside | outside)
    if np.any(unsure):
        depth = exact(unsure)
        inside[unsure] = depth - slack > threshold
        outside[unsure] = depth + slack < threshold
    return inside, outside


def area_fraction(
    x: FloatArray,
    y: FloatArray,
    spacing: float,
    surely_in: BoolArray,
    surely_out: BoolArray,
    contains: Callable[[FloatArray, FloatArray], BoolArray],
    lattice: FloatArray = LATTICE_2D_FINE,
) -> npt.NDArray[np.float32]:
    """Fraction of each pixel's square covered by a 2-D object.

    Args:
        x: (C,) column centres (mm); y: (R,) row centres (mm); spacing: pixel size (mm).
        surely_in, surely_out: (R, C) pixels known to be wholly inside / outside.
        contains: ``contains(xs, ys)`` -> bool, evaluated on sub-samples of the other pixels.
        lattice: (N, 2) sub-sample offsets within a unit pixel.
    """
    frac = surely_in.astype(np.float32)  # (R, C)
    rows, cols = np.nonzero(~(surely_in | surely_out))
    chunk = max(1, _CHUNK_SAMPLES // len(lattice))
    for start in range(0, rows.size, chunk):
        r, c = rows[start : start + chunk], cols[start : start + chunk]
        xs = x[c][:, None] + lattice[None, :, 0] * spacing  # (n, N)
        ys = y[r][:, None] + lattice[None, :, 1] * spacing  # (n, N)
        frac[r, c] = contains(xs, ys).mean(axis=1)
    return frac


def ellipse_points(
    a: float, b: float, angle_rad: float, count: int
) -> tuple[FloatArray, float, float]:
    """``count`` points on an ellipse at the origin rotated by ``angle_rad`` (x towards y).

    Returns:
        (points (count, 2), largest gap between neighbours (mm), sagitta bound (mm): how far the
        ellipse strays outside the polygon of the points).
    """
    t = np.linspace(0.0, 2.0 * math.pi, count, endpoint=False)
    u, v = a * np.cos(t), b * np.sin(t)
    cos, sin = math.cos(angle_rad), math.sin(angle_rad)
    pts = np.stack([cos * u - sin * v, sin * u + cos * v], axis=1)  # (count, 2)
    gap = float(np.max(np.linalg.norm(pts - np.roll(pts, 1, axis=0), axis=1)))
    min_radius = min(a, b) ** 2 / max(a, b)  # smallest radius of curvature
    sagitta = gap * gap / (8.0 * min_radius)
    return pts, gap, sagitta


def ellipsoid_fraction(
    axes: tuple[FloatArray, FloatArray, FloatArray],
    spacing: tuple[float, float, float],
    centre: tuple[float, float, float],
    semi_axes: tuple[float, float, float],
    angle_rad: float,
) -> tuple[tuple[slice, slice, slice], npt.NDArray[np.float32]] | None:
    """Fraction of each voxel's box covered by an ellipsoid whose third axis is along z.

    Args:
        axes: (z (S,), y (R,), x (C,)) voxel-centre coordinates (mm) along each array axis.
        spacing: (z, y, x) voxel size (mm).
        centre: (z, y, x) centre of the ellipsoid (mm).
        semi_axes: (a, b, c): in-plane semi-axes along the rotated x and y, and along z (mm).
        angle_rad: in-plane rotation of the ``a`` axis from +x towards +y.

    Returns:
        (index box as slices, fractions of the voxels in that box), or None when the ellipsoid
        touches no voxel.
    """
    z, y, x = axes
    dz, dy, dx = spacing
    cz, cy, cx = centre
    a, b, c = semi_axes
    cos, sin = math.cos(angle_rad), math.sin(angle_rad)
    half = (
        c,
        math.hypot(a * sin, b * cos),
        math.hypot(a * cos, b * sin),
    )  # half extents along (z, y, x)
    box: list[slice] = []
    for coords, step, mid, ext in zip(axes, spacing, centre, half, strict=True):
        lo = int(np.searchsorted(coords, mid - ext - step / 2.0, side="left"))
        hi = int(np.searchsorted(coords, mid + ext + step / 2.0, side="right"))
        if hi <= lo:
            return None
        box.append(slice(lo, hi))
    zb, yb, xb = z[box[0]] - cz, y[box[1]] - cy, x[box[2]] - cx  # (s,), (r,), (c,)
    # Normalised radius: |M (p - centre)| with M = diag(1/a, 1/b, 1/c) R^T; 1 on the surface.
    u = cos * xb[None, :] + sin * yb[:, None]  # (r, c)
    v = -sin * xb[None, :] + cos * yb[:, None]  # (r, c)
    in_plane = (u / a) ** 2 + (v / b) ** 2  # (r, c)
    radius = np.sqrt(in_plane[None, :, :] + ((zb / c) ** 2)[:, None, None])  # (s, r, c)
    # Largest change of the normalised radius within a voxel: max over the box corners of |M d|.
    corners = np.array(
        [(sz, sy, sx) for sz in (-1, 1) for sy in (-1, 1) for sx in (-1, 1)], dtype=np.float64
    ) * (np.array([dz, dy, dx]) / 2.0)  # (8, 3)
    reach = float(
        np.max(
            np.sqrt(
                ((cos * corners[:, 2] + sin * corners[:, 1]) / a) ** 2
                + ((-sin * corners[:, 2] + cos * corners[:, 1]) / b) ** 2
                + (corners[:, 0] / c) ** 2
            )
        )
    )
    frac = (radius < 1.0 - reach).astype(np.float32)  # (s, r, c)
    unsure = np.nonzero(np.abs(radius - 1.0) <= reach)
    offsets = LATTICE_3D * np.array([dz, dy, dx])  # (N, 3)
    chunk = max(1, _CHUNK_SAMPLES // len(offsets))
    for start in range(0, unsure[0].size, chunk):
        iz, iy, ix = (idx[start : start + chunk] for idx in unsure)
        sz = zb[iz][:, None] + offsets[None, :, 0]  # (n, N)
        sy = yb[iy][:, None] + offsets[None, :, 1]
        sx = xb[ix][:, None] + offsets[None, :, 2]
        su = (cos * sx + sin * sy) / a
        sv = (-sin * sx + cos * sy) / b
        inside = su * su + sv * sv + (sz / c) ** 2 <= 1.0  # (n, N)
        frac[iz, iy, ix] = inside.mean(axis=1)
    return (box[0], box[1], box[2]), frac
