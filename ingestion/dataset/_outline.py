"""The outline of a lesion's section, for :mod:`ingestion.dataset.recist`: the raw outline of its
pixels, the Fourier outline fitted to it (:func:`_fourier_outline`, refined against the pixels'
labels where it is a thin ellipse) and the axes measured on it (:func:`_fourier_axes`), and the
polygon helpers both use (signed area, farthest pair, chords).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Vector3

__all__: list[str] = []  # internals of ingestion.dataset.recist

FOURIER_MAX_ORDER = 12
"""Highest order of the Fourier outline (:func:`_fourier_outline`) tried before falling back."""
FOURIER_RMS_PX = 0.3
"""The Fourier outline's order is the lowest whose RMS distance to the raw outline's points is
at most this many pixels: the quantisation noise of a rasterised smooth edge (a point within
half a pixel along its grid line, RMS 0.2-0.29 pixel across the edge)."""
FOURIER_MAX_PX = 1.0
"""... no raw outline point farther from it than this many pixels (a corner it cuts) ..."""
FOURIER_REACH_PX = 1.5
"""... and no point of it farther from the raw outline than this many pixels (a loop or spike
between the points; a thin tip's raw outline falls short of it by up to a pixel)."""
FOURIER_MIN_PIXELS = 20
"""Sections of fewer pixels are measured on the smoothed outline (too few points to fit)."""
_FOURIER_SLIDE = 0.05
"""Weight of the point-to-point residuals beside the point-to-tangent ones in each fitting step
(keeps the steps well-posed; the tangent terms make the alternation converge fast)."""
_FOURIER_STEPS = 30
_FOURIER_STIFFNESS = 1e-5
_LABELS_BELOW_PX = 8.0
"""An accepted first-order outline (an ellipse) whose semi-minor axis is shorter than this many
pixels is refined against its pixels' labels (:func:`_fit_labels`)."""
_LABEL_WEIGHT = 100.0
"""Weight of a pixel centre's squared distance on the wrong side of the curve, beside the
outline points' squared distances (weight 1)."""
_LABEL_MARGIN_PX = 0.05
"""... where "the wrong side" starts this many pixels before the curve."""
_LABEL_TOLERANCE = 1e-4
Segment3 = tuple[Vector3, Vector3]
FloatArray = npt.NDArray[np.float64]


def _signed_area(polygon: FloatArray) -> float:
    x, y = polygon[:, 0], polygon[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))


def _convex_hull(points: FloatArray) -> FloatArray:
    """Andrew's monotone chain; (H, 2) hull vertices (all points if fewer than three)."""
    unique = np.unique(points, axis=0)  # sorted by x, then y
    if len(unique) < 3:
        return unique

    def cross(o: FloatArray, a: FloatArray, b: FloatArray) -> float:
        return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))

    lower: list[FloatArray] = []
    for p in unique:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    upper: list[FloatArray] = []
    for p in unique[::-1]:
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return np.array(lower[:-1] + upper[:-1])


def _farthest_pair(points: FloatArray) -> tuple[FloatArray, FloatArray]:
    hull = _convex_hull(points)
    if len(hull) == 1:
        return hull[0], hull[0]
    dist = np.linalg.norm(hull[:, None, :] - hull[None, :, :], axis=-1)
    i, j = np.unravel_index(int(np.argmax(dist)), dist.shape)
    a, b = hull[min(i, j)], hull[max(i, j)]
    return a, b


def _chords(
    polygons: list[FloatArray], along: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The outline's chords perpendicular to the unit vector ``along`` (all in mm).

    On a line perpendicular to ``along`` at position ``t`` the chord runs between the outermost
    crossings of the outline, ``w_min`` to ``w_max`` (across). Its length is piecewise linear
    between the vertices' positions, so the lines through the vertices are the ones computed.

    Returns:
        t (T,), w_min (T,), w_max (T,).
    """
    across = np.array([-along[1], along[0]])
    starts = np.concatenate(polygons)
    ends = np.concatenate([np.roll(p, -1, axis=0) for p in polygons])
    ta, tb = starts @ along, ends @ along  # (E,)
    wa, wb = starts @ across, ends @ across
    lo, hi = np.minimum(ta, tb), np.maximum(ta, tb)
    span = np.where(tb != ta, tb - ta, 1.0)
    lines = np.unique(ta)  # (T,)
    w_min, w_max = np.empty_like(lines), np.empty_like(lines)
    for chunk in np.array_split(np.arange(len(lines)), max(1, len(lines) // 256)):
        t = lines[chunk, None]  # (t, 1)
        hit = (lo <= t) & (t <= hi)  # (t, E)
        w = wa + np.where(tb != ta, (t - ta) / span, 0.0) * (wb - wa)
        w_max[chunk] = np.where(hit, w, -np.inf).max(axis=1)
        w_min[chunk] = np.where(hit, w, np.inf).min(axis=1)
    return lines, w_min, w_max


def _raw_outline(section: npt.NDArray[np.bool_]) -> list[FloatArray]:
    """The 0.5 iso-contour of the unsmoothed binary section: closed polygons of (row, column)
    indices through the midpoints between neighbouring inside and outside pixel centres (each
    within half a pixel of the true edge along its grid line), without a repeated last point."""
    import contourpy

    rows, cols = np.nonzero(section)
    r0, c0 = int(rows.min()) - 2, int(cols.min()) - 2
    crop = np.zeros((int(rows.max()) - r0 + 3, int(cols.max()) - c0 + 3))
    crop[rows - r0, cols - c0] = 1.0
    generator = contourpy.contour_generator(
        z=crop, name="serial", line_type=contourpy.LineType.Separate
    )
    polygons = []
    for line in generator.lines(0.5):
        points = np.asarray(line, dtype=np.float64)
        if len(points) > 1 and np.array_equal(points[0], points[-1]):
            points = points[:-1]
        polygons.append(points[:, ::-1] + (r0, c0))  # (x, y) -> (r, c)
    return polygons


def _fourier_basis(t: FloatArray, order: int) -> FloatArray:
    """(T, 2 order + 1) basis of a Fourier series of ``order`` at ``t``: 1, cos k t, sin k t."""
    angle = np.outer(t, np.arange(1, order + 1, dtype=np.float64))
    return np.hstack([np.ones((len(t), 1)), np.cos(angle), np.sin(angle)])


def _fourier_bases(t: FloatArray, order: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The basis at ``t`` (:func:`_fourier_basis`) and its first and second derivatives."""
    k = np.arange(1, order + 1, dtype=np.float64)
    angle = np.outer(t, k)
    cos, sin = np.cos(angle), np.sin(angle)
    zeros = np.zeros((len(t), 1))
    return (
        np.hstack([np.ones((len(t), 1)), cos, sin]),
        np.hstack([zeros, -k * sin, k * cos]),
        np.hstack([zeros, -(k**2) * cos, -(k**2) * sin]),
    )


def _foot_points(
    t: FloatArray | None, coef: FloatArray, points: FloatArray, samples: int = 0
) -> FloatArray:
    """The parameters of the curve's points nearest ``points`` (the foot points): from the
    nearest of ``samples`` samples of the curve (``t`` None; 0: a dense sampling, at least 256
    and four per point) or from ``t``, then Newton steps of at most about one step's spacing."""
    order = (len(coef) - 1) // 2
    limit = 2 * np.pi / len(points)  # about one point's spacing
    if t is None:
        samples = samples or max(256, 4 * len(points))
        grid = np.linspace(0.0, 2 * np.pi, samples, endpoint=False)
        curve = _fourier_basis(grid, order) @ coef
        d2 = (points[:, 0, None] - curve[None, :, 0]) ** 2
        d2 += (points[:, 1, None] - curve[None, :, 1]) ** 2
        t, limit = grid[np.argmin(d2, axis=1)], np.pi / samples
    for _ in range(3):
        basis, first, second = _fourier_bases(t, order)
        offset, d1, d2 = basis @ coef - points, first @ coef, second @ coef
        slope = np.einsum("ij,ij->i", d1, offset)
        curvature = np.einsum("ij,ij->i", d2, offset) + np.einsum("ij,ij->i", d1, d1)
        safe = curvature > 1e-12
        step = np.where(safe, slope / np.where(safe, curvature, 1.0), 0.0)
        t = t - np.clip(step, -limit, limit)
    return t


def _fit_fourier(
    points: FloatArray, order: int, t: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Least-squares Fourier curve of ``order`` through the closed outline ``points`` (N, 2),
    by the points' distances to the curve: alternately the coefficients (each point's distance
    to the tangent at its foot point, plus a little of the distance to the foot point itself)
    and the foot points (:func:`_foot_points`), from the parameters ``t``.

    Returns:
        coefficients (2 order + 1, 2), the foot points' parameters (N,), the distances (N,).
    """
    basis = _fourier_basis(t, order)
    coef = np.asarray(np.linalg.lstsq(basis, points, rcond=None)[0], dtype=np.float64)
    t = _foot_points(None, coef, points)
    k = np.arange(1, order + 1, dtype=np.float64)
    bend = np.where(k >= 2, k**4, 0.0)
    stiffness = _FOURIER_STIFFNESS * len(points) * np.concatenate([[0.0], bend, bend])
    previous = math.inf
    for _ in range(_FOURIER_STEPS):
        # normal equations of: sum (n . (C(t) - p))^2 + slide |C(t) - p|^2, over (x, y) coefs
        basis, first, _ = _fourier_bases(t, order)
        tangent = first @ coef
        normal = np.column_stack([-tangent[:, 1], tangent[:, 0]])
        normal /= np.maximum(np.linalg.norm(normal, axis=1, keepdims=True), 1e-12)
        nx, ny = normal[:, 0], normal[:, 1]
        gram = basis.T @ basis * _FOURIER_SLIDE
        xy = basis.T @ (basis * (nx * ny)[:, None])
        lhs = np.block(
            [
                [basis.T @ (basis * (nx * nx)[:, None]) + gram, xy],
                [xy, basis.T @ (basis * (ny * ny)[:, None]) + gram],
            ]
        )
        projection = nx * points[:, 0] + ny * points[:, 1]
        rhs = np.concatenate(
            [
                basis.T @ (nx * projection + _FOURIER_SLIDE * points[:, 0]),
                basis.T @ (ny * projection + _FOURIER_SLIDE * points[:, 1]),
            ]
        )
        lhs += np.diag(np.tile(stiffness, 2))
        solution = np.linalg.solve(lhs, rhs)
        m = basis.shape[1]
        coef = np.column_stack([solution[:m], solution[m:]]).astype(np.float64)
        t = _foot_points(t, coef, points)
        misfit = float(np.mean((_fourier_basis(t, order) @ coef - points) ** 2))
        if misfit >= (1.0 - 1e-6) * previous:
            break
        previous = misfit
    distances = np.linalg.norm(_fourier_basis(t, order) @ coef - points, axis=1)
    return coef, t, distances


def _fourier_outline(section: npt.NDArray[np.bool_]) -> FloatArray | None:
    """The section's outline as a Fourier curve of (row, column) indices (Kuhl & Giardina's
    elliptic Fourier descriptors; an ellipse is its first order, lobulation higher ones): the
    coefficients (2 K + 1, 2) of the lowest order K fitting the raw outline's points
    (:func:`_raw_outline`) within ``FOURIER_RMS_PX`` RMS. None where the outline is not one
    polygon (holes, pieces), the section is small, or no order up to ``FOURIER_MAX_ORDER`` fits.

    Each point's starting parameter is its angle about the section's centroid once the
    section's moment ellipse is made a circle (for an ellipse, its eccentric angle). A thin
    first-order curve is then refined against the pixels' labels (:func:`_fit_labels`)."""
    if int(section.sum()) < FOURIER_MIN_PIXELS:
        return None
    polygons = _raw_outline(section)
    if len(polygons) != 1 or len(polygons[0]) < 8:
        return None
    points = polygons[0]
    pixels = np.argwhere(section).astype(np.float64)
    centre = pixels.mean(axis=0)
    spread = (pixels - centre).T @ (pixels - centre) / len(pixels) + np.eye(2) / 12.0
    values, vectors = np.linalg.eigh(spread)
    round_ = (points - centre) @ vectors / np.sqrt(values)
    t = np.unwrap(np.arctan2(round_[:, 1], round_[:, 0]))
    for order in range(1, FOURIER_MAX_ORDER + 1):
        coef, t, distances = _fit_fourier(points, order, t)
        if float(np.sqrt(np.mean(distances**2))) > FOURIER_RMS_PX:
            continue
        if float(distances.max()) > FOURIER_MAX_PX:
            continue
        curve = _fourier_basis(np.linspace(0.0, 2 * np.pi, 720, endpoint=False), order) @ coef
        if float(_distance_to_polygon(curve, points).max()) > FOURIER_REACH_PX:
            continue
        if order == 1 and np.linalg.svd(coef[1:], compute_uv=False).min() < _LABELS_BELOW_PX:
            return _fit_labels(section, coef, points)
        return coef
    return None


def _signed_distances(coef: FloatArray, points: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The points' (N, 2) signed distances (N,) to the closed Fourier curve ``coef`` (positive
    outside) and their derivatives (N, coefficients) by the coefficients (``coef.ravel()``):
    each point's foot point from the nearest of 128 samples of the curve, then Newton steps."""
    order = (len(coef) - 1) // 2
    t = _foot_points(None, coef, points, samples=128)
    curve = _fourier_basis(np.linspace(0.0, 2 * np.pi, 128, endpoint=False), order) @ coef
    basis, first, _ = _fourier_bases(t, order)
    tangent = first @ coef
    normal = np.column_stack([tangent[:, 1], -tangent[:, 0]])  # outward if counter-clockwise
    normal /= np.maximum(np.linalg.norm(normal, axis=1, keepdims=True), 1e-12)
    if _signed_area(curve) < 0:
        normal = -normal
    distances = np.einsum("ij,ij->i", points - basis @ coef, normal)
    # the foot point is stationary: only the curve's move along the normal counts
    jacobian = -(basis[:, :, None] * normal[:, None, :]).reshape(len(points), -1)
    return distances, jacobian


def _fit_labels(section: npt.NDArray[np.bool_], coef: FloatArray, points: FloatArray) -> FloatArray:
    """The Fourier curve ``coef`` refined against the section's pixel labels: the raw outline's
    ``points`` place a thin section's tips with a bias (the last fraction of a pixel before a
    tip holds no pixel centre, and the staircase rounds it), while every pixel centre's label,
    inside or outside, is exact. Minimises the points' squared distances to the curve plus
    ``_LABEL_WEIGHT`` times the squared distances by which the centres next to the edge
    (8-connected) lie on the wrong side of it, counted from ``_LABEL_MARGIN_PX`` inside
    (Gauss-Newton, trust region, from ``coef``)."""
    from scipy import ndimage
    from scipy.optimize import least_squares

    square = np.ones((3, 3), dtype=bool)
    inner = section & ~ndimage.binary_erosion(section, square)
    outer = ndimage.binary_dilation(section, square) & ~section
    centres = np.vstack([np.argwhere(inner), np.argwhere(outer)]).astype(np.float64)
    side = np.concatenate([np.ones(int(inner.sum())), -np.ones(int(outer.sum()))])
    both = np.vstack([points, centres])
    weight = math.sqrt(_LABEL_WEIGHT)
    shape = coef.shape
    cache: dict[bytes, tuple[FloatArray, FloatArray]] = {}

    def evaluate(x: FloatArray) -> tuple[FloatArray, FloatArray]:
        key = x.tobytes()
        if key not in cache:
            cache.clear()
            distances, jacobian = _signed_distances(x.reshape(shape), both)
            d_points, j_points = distances[: len(points)], jacobian[: len(points)]
            d_centres, j_centres = distances[len(points) :], jacobian[len(points) :]
            wrong = side * d_centres + _LABEL_MARGIN_PX  # > 0: on the wrong side
            active = wrong > 0
            cache[key] = (
                np.concatenate([d_points, weight * np.where(active, wrong, 0.0)]),
                np.vstack([j_points, (weight * side * active)[:, None] * j_centres]),
            )
        return cache[key]

    solution = least_squares(
        lambda x: evaluate(x)[0],
        coef.ravel(),
        jac=lambda x: evaluate(x)[1],
        method="trf",
        ftol=_LABEL_TOLERANCE,
        xtol=_LABEL_TOLERANCE,
    )
    if not np.all(np.isfinite(solution.x)):
        return coef
    return np.asarray(solution.x, dtype=np.float64).reshape(shape)


def _distance_to_polygon(samples: FloatArray, polygon: FloatArray) -> FloatArray:
    """(M,) distances of the points ``samples`` (M, 2) to the closed ``polygon`` (N, 2)."""
    start, edge = polygon, np.roll(polygon, -1, axis=0) - polygon  # (N, 2)
    length2 = np.maximum(np.einsum("ij,ij->i", edge, edge), 1e-12)
    offset = samples[:, None, :] - start[None, :, :]  # (M, N, 2)
    along = np.clip(np.einsum("mnk,nk->mn", offset, edge) / length2, 0.0, 1.0)
    nearest = offset - along[:, :, None] * edge[None, :, :]
    return np.asarray(np.sqrt(np.min(np.einsum("mnk,mnk->mn", nearest, nearest), axis=1)))


def _fourier_points(coef: FloatArray, t: FloatArray, to_mm: FloatArray) -> FloatArray:
    """(T, 2) in-plane mm points of the Fourier curve at ``t``."""
    return np.asarray((_fourier_basis(t, (len(coef) - 1) // 2) @ coef) @ to_mm.T)


def _fourier_axes(
    coef: FloatArray, to_mm: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Long and short axis end points (in-plane mm) of a Fourier outline: its Feret diameter
    (the farthest pair of a sampling's hull, refined on the curve: each end moved along the
    curve to the point farthest from the other) and the longest chord perpendicular to it."""
    samples = 360
    t = np.linspace(0.0, 2 * np.pi, samples, endpoint=False)
    curve = _fourier_points(coef, t, to_mm)
    a, b = _farthest_pair(curve)
    ends = [float(t[int(np.argmin(np.linalg.norm(curve - end, axis=1)))]) for end in (a, b)]
    width = 2.0 * 2 * np.pi / samples
    for _ in range(4):
        for k in (0, 1):
            other = _fourier_points(coef, np.array([ends[1 - k]]), to_mm)
            candidates = ends[k] + np.linspace(-width, width, 33)
            distance = np.linalg.norm(_fourier_points(coef, candidates, to_mm) - other, axis=1)
            ends[k] = float(candidates[int(np.argmax(distance))])
        width /= 8.0
    a, b = _fourier_points(coef, np.array(ends), to_mm)
    along = (b - a) / float(np.linalg.norm(b - a))
    across = np.array([-along[1], along[0]])
    polygon = _fourier_points(coef, np.linspace(0.0, 2 * np.pi, 720, endpoint=False), to_mm)
    lines, w_min, w_max = _chords([polygon], along)
    chord = w_max - w_min
    k = int(np.clip(np.argmax(chord), 1, len(lines) - 2))
    # the peak of the parabola through the longest chord and its neighbours: where two chords
    # tie (a symmetric outline), a rounding error must not pick one of them
    c2, c1, _ = np.polyfit(lines[k - 1 : k + 2] - lines[k], chord[k - 1 : k + 2], 2)
    t = lines[k] + (
        float(np.clip(-c1 / (2 * c2), lines[k - 1] - lines[k], lines[k + 1] - lines[k]))
        if c2 < 0
        else 0.0
    )
    low, high = float(np.interp(t, lines, w_min)), float(np.interp(t, lines, w_max))
    return a, b, t * along + low * across, t * along + high * across


# -- lesions --------------------------------------------------------------------------------------
