"""RECIST truth from masks: lesion long/short axes and vessel diameters in millimetres.

Every number is measured in the plane of the series' own slices (the axial slice of an axial
series; the image plane of an oblique one), with the pixel spacing and direction cosines of the
image geometry (LPS), never from voxel counts alone.

Lesion (:func:`lesion_axes`, one 3-D connected component):

- measured slice: the slice where the component's cross-section area is largest; ties go to
  the slice nearest the component's centroid (then the lower index);
- outline: a Fourier curve (Kuhl & Giardina's elliptic Fourier descriptors: an ellipse is the
  first order, lobulation lives in higher ones) fitted to the raw outline, the 0.5
  iso-contour of the unsmoothed binary section (midpoints between neighbouring inside and
  outside pixel centres: each within half a pixel of the edge along its grid line, unbiased).
  The fit (:func:`_fit_fourier`) minimises the points' distances to the curve, alternating
  the coefficients and each point's foot point on the curve (so the curve's parameter is free:
  an ellipse's eccentric angle, not the staircase's arc length), with a slight stiffness on
  orders 2 and up against loops between the points. The order is the lowest, from 1 to
  ``FOURIER_MAX_ORDER``, whose RMS distance is within the quantisation noise
  (``FOURIER_RMS_PX``), no point farther than ``FOURIER_MAX_PX`` and no part of the curve
  farther than ``FOURIER_REACH_PX`` from the raw outline; the whole outline so places each
  tip, where a thin tip's own few pixels cannot;
- thin ellipses: an accepted first-order curve (an ellipse) whose semi-minor axis is under
  ``_LABELS_BELOW_PX`` is then refined against the pixels' labels (:func:`_fit_labels`): the
  raw outline's points place a thin tip with a bias (the tip's last fraction of a pixel holds
  no pixel centre, and the staircase rounds it) while each pixel centre's label, inside or
  outside, is exact; the refined curve stays near the points but keeps the centres next to
  the edge on their own sides;
- long axis: the curve's longest diameter (farthest pair of a sampling's hull, each end then
  moved along the curve to the point farthest from the other); short axis: the curve's longest
  chord perpendicular to it (the peak of a parabola through the longest sampled chord and its
  neighbours); centre: the long axis' midpoint;
- fallback, where no Fourier curve is accepted (an outline of several polygons or with holes,
  fewer than ``FOURIER_MIN_PIXELS`` pixels, corners or detail no order fits): the 0.5
  iso-contour of the section smoothed with a Gaussian of ``OUTLINE_SIGMA_PX`` pixels
  (:func:`section_outline`; a section of one to a few pixels is outlined by its pixels'
  squares); its longest diameter gives the direction, whose ends are then placed where the
  section reaches along it, fitted to the pixels near each tip (:func:`_tip`: near a smooth tip
  the area beyond a level grows as ``depth ** 1.5``); the short axis is the longest
  perpendicular chord, the peak of a parabola through the chords near the longest, its ends
  placed by the same tip fit where it spans the section's whole width;
- z range: the LPS z of the component's voxel centres, widened on each side by half a slice
  (the slice step's z component), the extent the voxels stand for.

Measured on centre-sampled ellipses (random sizes, rotations, pixel spacing 0.5-1.5 mm,
oblique planes; per band of the semi-minor axis b, the semi-major uniform in [b, 60] px: 250
for b >= 8 px, 1,260 for each thinner band; tests/ingestion/dataset/test_recist.py), in pixels along
the axis: the short axis within 0.5 px for every one (worst 0.50 px); the long axis within
0.5 px for every one with b >= 8 px (worst 0.27 px), 99.8 % for 5 <= b < 8 (worst 0.75 px),
96.7 % for 3 <= b < 5 (worst 0.94 px; 98.5 % and 89.9 % without the labels' refinement): a
thin ellipse's length rests on the curvature of its sides, which quantisation blurs. The mean
error is within 0.05 px. Lattice coincidences (whole-pixel semi-axes centred on a pixel, along
the grid or its diagonal, 1 mm pixels: pixel centres on the edge, every row's quantisation
error alike) are worse: long axis up to 0.66 px from b = 8 px, 1.20 px from 5, 1.53 px below;
short axis up to 0.67 px. Irregular shapes (two overlapping discs, tilted rectangles, lobulated
outlines): the longest diameter within 0.5 px, a rectangle's (its corners rounded by the fit)
within 1.2 px.

Vessel (:func:`vessel_sections`): on each slice, each 2-D connected piece (8-connected) of at
least ``min_area_mm2`` is one cross-section. Its diameter is the minor axis of the ellipse with
the same second moments as the section (the pixels taken as the areas they cover), which is
right for round tubes and for tubes cut obliquely (an ellipse whose minor axis is the tube's
diameter); the major axis and the area-equivalent diameter are given beside it.

Vessel diameters on rasterised discs and obliquely cut tubes (ellipses up to 1.6 : 1): within
half a pixel of the analytic value.

The outlines (raw, Fourier, refined against the labels) and the polygon helpers are in
:mod:`ingestion.dataset._outline`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingestion.dataset._outline import (
    FloatArray,
    Segment3,
    _chords,
    _farthest_pair,
    _fourier_axes,
    _fourier_outline,
    _signed_area,
)
from ingestion.geometry import Geometry, Vector3

__all__ = [
    "OUTLINE_SIGMA_PX",
    "LesionAxes",
    "VesselSection",
    "lesion_axes",
    "measured_slice",
    "section_outline",
    "vessel_sections",
    "z_range_lps_mm",
]

OUTLINE_SIGMA_PX = 0.9
"""Standard deviation (pixels) of the Gaussian that smooths a binary section before its 0.5
iso-contour is taken as the outline."""
TIP_PIXELS = 30
"""At most this many pixel centres nearest a tip place the tip (:func:`_tip`)."""
MIN_TIP_PIXELS = 20
"""Sections of fewer pixels keep the outline's axes."""
TIP_DEPTH = 0.2
"""... and they lie at most this fraction of the outline's long axis below the tip."""
"""Relative change of the cost and of the coefficients at which that refinement stops."""
CHORD_TOLERANCE_PX = 2.0
"""The short axis is the peak of a parabola fitted to the chords within this many pixels of
the longest (:func:`_smooth_maximum`)."""


@dataclass(frozen=True)
class LesionAxes:
    """A lesion's RECIST measurement (module doc).

    Args:
        slice_index: the measured slice (0-based, in the array's slice order).
        long_axis_mm, short_axis_mm: longest in-plane diameter; longest perpendicular chord.
        long_axis_lps_mm, short_axis_lps_mm: their end points (LPS mm).
        center_lps_mm: the long axis' midpoint.
        z_range_lps_mm: (low, high) LPS z of the component's voxel centres, widened by half a
            slice on each side.
        area_mm2: the measured section's area (pixel count x pixel area).
        voxels: the component's voxel count.
        volume_mm3: the component's volume (voxel count x voxel volume).
    """

    slice_index: int
    long_axis_mm: float
    short_axis_mm: float
    long_axis_lps_mm: Segment3
    short_axis_lps_mm: Segment3
    center_lps_mm: Vector3
    z_range_lps_mm: tuple[float, float]
    area_mm2: float
    voxels: int
    volume_mm3: float


@dataclass(frozen=True)
class VesselSection:
    """One vessel cross-section on one slice (module doc).

    Args:
        slice_index: the slice (0-based, in the array's slice order).
        diameter_mm: minor axis of the section's moment ellipse.
        center_lps_mm: the section's centroid (LPS mm).
        diameter_lps_mm: end points of the diameter (along the minor axis, through the centre).
        major_axis_mm: major axis of the moment ellipse.
        area_mm2: the section's area (pixel count x pixel area).
        equivalent_diameter_mm: diameter of the circle of the same area.
        pixels: the section's pixel count.
        touches_edge: the section reaches the first or last row or column (it may be cut).
    """

    slice_index: int
    diameter_mm: float
    center_lps_mm: Vector3
    diameter_lps_mm: Segment3
    major_axis_mm: float
    area_mm2: float
    equivalent_diameter_mm: float
    pixels: int
    touches_edge: bool


# -- the slice plane ------------------------------------------------------------------------------
def _plane_matrix(geometry: Geometry) -> FloatArray:
    """2x2 matrix from in-plane (column, row) index offsets to orthonormal in-plane mm (u, v):
    u along ``row_direction``, v along the part of ``column_direction`` orthogonal to it."""
    row_dir = np.asarray(geometry.row_direction)
    col_dir = np.asarray(geometry.column_direction)
    e2 = col_dir - float(col_dir @ row_dir) * row_dir
    e2 /= np.linalg.norm(e2)
    cs, rs = geometry.column_spacing, geometry.row_spacing
    return np.array([[cs, rs * float(col_dir @ row_dir)], [0.0, rs * float(col_dir @ e2)]])


def _rc_to_mm(geometry: Geometry) -> FloatArray:
    """2x2 matrix from in-plane (row, column) index offsets to orthonormal in-plane mm."""
    plane = _plane_matrix(geometry)
    return np.array([plane[:, 1], plane[:, 0]]).T


def _pixel_area(geometry: Geometry) -> float:
    return abs(float(np.linalg.det(_plane_matrix(geometry))))


def _to_lps(geometry: Geometry, slice_index: int, points_rc: FloatArray) -> FloatArray:
    """(N, 2) fractional (row, column) indices on ``slice_index`` -> (N, 3) LPS mm."""
    index = np.column_stack([np.full(len(points_rc), float(slice_index)), points_rc])
    return geometry.index_to_lps(index)


def _vec(point: FloatArray) -> Vector3:
    return (float(point[0]), float(point[1]), float(point[2]))


def z_range_lps_mm(mask: npt.ArrayLike, geometry: Geometry) -> tuple[float, float]:
    """(low, high) LPS z of a mask's voxel centres, widened on each side by half a slice (the
    slice step's z component): the extent along z that the voxels stand for.

    Raises:
        ValueError: the mask is not 3-D or is empty.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 3 or not mask.any():
        raise ValueError(f"mask must be a non-empty 3-D array, got shape {mask.shape}")
    slices = np.flatnonzero(mask.any(axis=(1, 2)))
    zs: list[float] = []
    for s in (int(slices[0]), int(slices[-1])):
        rows, cols = np.nonzero(mask[s])
        zs.extend(_to_lps(geometry, s, np.column_stack([rows, cols]).astype(float))[:, 2])
    half = 0.5 * abs(geometry.slice_direction[2]) * geometry.slice_spacing
    return (float(min(zs)) - half, float(max(zs)) + half)


# -- outline and diameters ------------------------------------------------------------------------
def section_outline(section: npt.NDArray[np.bool_]) -> list[FloatArray]:
    """The sub-pixel outline of a binary 2-D section: closed polygons of (row, column) indices.

    The 0.5 iso-contour of the section smoothed by a Gaussian of ``OUTLINE_SIGMA_PX`` pixels;
    where that contour is missing or encloses less than half the section's pixels (a section of
    one to a few pixels), the outline of its pixels' squares instead.
    """
    import contourpy
    from scipy import ndimage

    rows, cols = np.nonzero(section)
    if rows.size == 0:
        return []
    pad = math.ceil(4 * OUTLINE_SIGMA_PX) + 2
    r0, c0 = int(rows.min()) - pad, int(cols.min()) - pad
    crop = np.zeros((int(rows.max()) - r0 + pad + 1, int(cols.max()) - c0 + pad + 1))
    crop[rows - r0, cols - c0] = 1.0
    smooth = ndimage.gaussian_filter(crop, OUTLINE_SIGMA_PX, mode="constant", truncate=4.0)
    generator = contourpy.contour_generator(
        z=smooth, name="serial", line_type=contourpy.LineType.Separate
    )
    lines = [np.asarray(line, dtype=np.float64) for line in generator.lines(0.5)]
    polygons = [line[:, ::-1] + (r0, c0) for line in lines if len(line) >= 3]  # (x, y) -> (r, c)
    enclosed = sum(abs(_signed_area(p)) for p in polygons)
    if polygons and enclosed >= 0.5 * rows.size:
        return polygons
    corners = np.array([(-0.5, -0.5), (-0.5, 0.5), (0.5, 0.5), (0.5, -0.5)])
    centres = np.column_stack([rows, cols]).astype(np.float64)
    return [c + corners for c in centres]


def _smooth_maximum(t: FloatArray, length: FloatArray, tolerance: float) -> tuple[float, float]:
    """Where a noisy function peaks, and its peak: a parabola fitted to the run of samples
    around the largest that lie within ``tolerance`` of it (the largest sample alone is biased
    upwards by the outline's noise). Returns (t, value); the value stays within
    ``tolerance`` below the largest sample."""
    k = int(np.argmax(length))
    near = length >= length[k] - tolerance
    i0, i1 = k, k
    while i0 > 0 and near[i0 - 1]:
        i0 -= 1
    while i1 < len(length) - 1 and near[i1 + 1]:
        i1 += 1
    tt, ll = t[i0 : i1 + 1] - t[k], length[i0 : i1 + 1]
    if len(tt) < 5:
        return float(t[k]), float(length[k])
    c2, c1, c0 = np.polyfit(tt, ll, 2)
    if c2 >= 0:
        return float(t[k]), float(length[k])
    x = float(np.clip(-c1 / (2 * c2), tt[0], tt[-1]))
    value = float(np.clip(c0 + x * (c1 + x * c2), length[k] - tolerance, length[k]))
    return float(t[k]) + x, value


_SUBPIXELS = (np.arange(4) + 0.5) / 4 - 0.5  # 4 x 4 points spread over a pixel


def _tip(centres: FloatArray, to_mm: FloatArray, along: FloatArray, depth: float) -> float:
    """How far a section reaches along the unit vector ``along`` (mm, from the in-plane
    origin), from its pixels (``centres``: (N, 2) row, column indices).

    Near its tip a smooth section's cap beyond a level ``l`` has an area ``c (T - l) ** 1.5``
    (a parabola's). The pixels' area above each level (each pixel's area spread over its
    square) is that cap blurred by one pixel; the tip ``T`` is the one whose blurred cap fits
    the pixels' area best (least squares, ``c`` fitted for each ``T``) over the levels where
    between half a pixel and ``TIP_PIXELS`` pixels lie above and at most ``depth`` below the
    farthest pixel centre. ``T`` lies between the farthest centre and one pixel beyond.
    """
    sub_r, sub_c = np.meshgrid(_SUBPIXELS, _SUBPIXELS, indexing="ij")
    offsets = np.column_stack([sub_r.ravel(), sub_c.ravel()]) @ to_mm.T @ along  # (16,)
    pitch = 1.0 / float(np.linalg.norm(np.linalg.solve(to_mm, along)))  # one pixel along
    t = centres @ to_mm.T @ along  # (N,)
    top = float(t.max())
    near = t[t >= top - depth - 2.0 * pitch]
    levels = np.sort((near[:, None] + offsets[None, :]).ravel())[::-1]  # (16 n,)
    area = (np.arange(len(levels)) + 0.5) / len(offsets)  # pixels above each level
    fit = (area >= 0.5) & (area <= TIP_PIXELS) & (levels >= top - depth)
    if int(fit.sum()) < 3:
        return top + 0.5 * pitch
    levels, area = levels[fit], area[fit]

    def best_of(tips: FloatArray) -> float:
        shifted = tips[:, None, None] - levels[None, :, None] + offsets[None, None, :]
        cap = (np.clip(shifted, 0.0, None) ** 1.5).mean(axis=2)  # (K, L)
        norm = np.einsum("kl,kl->k", cap, cap)
        misfit = -np.where(norm > 0, (cap @ area) ** 2 / np.where(norm > 0, norm, 1.0), 0.0)
        return float(tips[int(np.argmin(misfit))])

    best = best_of(np.linspace(top, top + pitch, 41))
    step = pitch / 40.0
    return best_of(np.linspace(max(top, best - step), min(top + pitch, best + step), 9))


# -- the Fourier outline --------------------------------------------------------------------------
def measured_slice(mask: npt.NDArray[np.bool_]) -> int:
    """The slice a lesion is measured on (module doc): where the mask's cross-section area is
    largest; ties go to the slice nearest the mask's centroid slice, then the lower index.
    ``mask`` is a non-empty boolean (slices, rows, columns) array."""
    counts = mask.sum(axis=(1, 2))
    centroid = float(np.average(np.arange(len(counts)), weights=counts))
    candidates = np.flatnonzero(counts == counts.max())
    return int(min(candidates, key=lambda s: (abs(s - centroid), s)))


def _section_axes(
    section: npt.NDArray[np.bool_], to_mm: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Long and short axis end points (in-plane mm, module doc) of a binary 2-D section:
    from its Fourier outline where one fits, else from the smoothed outline and the tip fits;
    ``to_mm`` maps (row, column) indices to orthonormal in-plane mm."""
    coef = _fourier_outline(section)
    if coef is not None:
        return _fourier_axes(coef, to_mm)
    from_mm = np.linalg.inv(to_mm)

    def pitch(direction: FloatArray) -> float:  # one pixel's length along ``direction`` (mm)
        return 1.0 / float(np.linalg.norm(from_mm @ direction))

    polygons = [p @ to_mm.T for p in section_outline(section)]
    a, b = _farthest_pair(np.concatenate(polygons))
    length = float(np.linalg.norm(b - a))
    if length == 0.0:  # one point: any direction
        return a, b, a, b
    along = (b - a) / length
    rows, cols = np.nonzero(section)
    indices = np.column_stack([rows, cols]).astype(np.float64)  # (N, 2)
    if len(indices) >= MIN_TIP_PIXELS:
        # the long axis' ends: the section's reach along it, from the pixels near each tip
        across = np.array([-along[1], along[0]])
        depth = TIP_DEPTH * length
        high = _tip(indices, to_mm, along, depth)
        low = -_tip(indices, to_mm, -along, depth)
        vertices = np.concatenate(polygons)  # each end beside the outline's farthest point
        a = low * along + float(vertices[int(np.argmin(vertices @ along))] @ across) * across
        b = high * along + float(vertices[int(np.argmax(vertices @ along))] @ across) * across
        along = (b - a) / float(np.linalg.norm(b - a))
    # the short axis: the longest chord perpendicular to the long axis
    across = np.array([-along[1], along[0]])
    t, w_min, w_max = _chords(polygons, along)
    t_best, chord = _smooth_maximum(t, w_max - w_min, CHORD_TOLERANCE_PX * pitch(across))
    k = int(np.argmin(np.abs(t - t_best)))
    middle = 0.5 * (w_min[k] + w_max[k])
    low, high = middle - 0.5 * chord, middle + 0.5 * chord
    if len(indices) >= MIN_TIP_PIXELS:
        # an end at the section's farthest reach across: moved as much as the tip there moves
        step, depth = pitch(across), TIP_DEPTH * chord
        reach_high = _smooth_maximum(t, w_max, CHORD_TOLERANCE_PX * step)[1]
        reach_low = -_smooth_maximum(t, -w_min, CHORD_TOLERANCE_PX * step)[1]
        if (reach_high - high) + (low - reach_low) <= step:
            # the chord spans the section's whole width across, within a pixel (a convex,
            # symmetric section): the width, from the pixels near each end
            high = _tip(indices, to_mm, across, depth)
            low = -_tip(indices, to_mm, -across, depth)
        else:
            if reach_high - high <= step:
                high += _tip(indices, to_mm, across, depth) - reach_high
            if low - reach_low <= step:
                low -= _tip(indices, to_mm, -across, depth) + reach_low
    c = t_best * along + low * across
    d = t_best * along + high * across
    return a, b, c, d


def lesion_axes(mask: npt.ArrayLike, geometry: Geometry) -> LesionAxes:
    """RECIST long and short axis of one connected component (module doc).

    Args:
        mask: boolean (slices, rows, columns) array holding one lesion.
        geometry: the array's geometry.

    Raises:
        ValueError: the mask is not 3-D or is empty.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 3:
        raise ValueError(f"mask must be a (slices, rows, columns) array, got shape {mask.shape}")
    voxels = int(mask.sum())
    if voxels == 0:
        raise ValueError("mask is empty: no lesion to measure")
    s = measured_slice(mask)
    section = mask[s]
    to_mm = _rc_to_mm(geometry)
    a, b, c, d = _section_axes(section, to_mm)
    long_mm = float(np.linalg.norm(b - a))
    short_mm = float(np.linalg.norm(d - c))
    if short_mm > long_mm:  # a section of a few pixels: no longer than the long axis
        middle, half = 0.5 * (c + d), 0.5 * (d - c) * long_mm / short_mm
        c, d, short_mm = middle - half, middle + half, long_mm
    ends = _to_lps(geometry, s, np.array([a, b, c, d]) @ np.linalg.inv(to_mm).T)
    return LesionAxes(
        slice_index=s,
        long_axis_mm=long_mm,
        short_axis_mm=short_mm,
        long_axis_lps_mm=(_vec(ends[0]), _vec(ends[1])),
        short_axis_lps_mm=(_vec(ends[2]), _vec(ends[3])),
        center_lps_mm=_vec(0.5 * (ends[0] + ends[1])),
        z_range_lps_mm=z_range_lps_mm(mask, geometry),
        area_mm2=float(section.sum()) * _pixel_area(geometry),
        voxels=voxels,
        volume_mm3=voxels * abs(float(np.linalg.det(geometry.affine[:3, :3]))),
    )


# -- vessels --------------------------------------------------------------------------------------
def _section(geometry: Geometry, slice_index: int, piece: npt.NDArray[np.bool_]) -> VesselSection:
    to_mm = _rc_to_mm(geometry)
    rows, cols = np.nonzero(piece)
    centres = np.column_stack([rows, cols]).astype(np.float64)  # (N, 2)
    mean = centres.mean(axis=0)
    points = (centres - mean) @ to_mm.T  # (N, 2) mm
    # the section as the area its pixels cover: centres' covariance + one pixel's own (1/12)
    cov = points.T @ points / len(points) + to_mm @ to_mm.T / 12.0
    eigenvalues, eigenvectors = np.linalg.eigh(cov)  # ascending
    minor, major = (4.0 * math.sqrt(max(float(v), 0.0)) for v in eigenvalues)
    half = 0.5 * minor * eigenvectors[:, 0] @ np.linalg.inv(to_mm).T  # (r, c) offset
    lps = _to_lps(geometry, slice_index, np.array([mean, mean - half, mean + half]))
    area = len(points) * _pixel_area(geometry)
    last_r, last_c = piece.shape[0] - 1, piece.shape[1] - 1
    return VesselSection(
        slice_index=slice_index,
        diameter_mm=minor,
        center_lps_mm=_vec(lps[0]),
        diameter_lps_mm=(_vec(lps[1]), _vec(lps[2])),
        major_axis_mm=major,
        area_mm2=area,
        equivalent_diameter_mm=2.0 * math.sqrt(area / math.pi),
        pixels=len(points),
        touches_edge=bool(
            rows.min() == 0 or cols.min() == 0 or rows.max() == last_r or cols.max() == last_c
        ),
    )


def vessel_sections(
    mask: npt.ArrayLike, geometry: Geometry, *, min_area_mm2: float = 20.0
) -> list[VesselSection]:
    """Every cross-section of a vessel mask of at least ``min_area_mm2`` (module doc), in slice
    order, then in the order of each section's first pixel (row, column).

    Raises:
        ValueError: the mask is not 3-D.
    """
    from scipy import ndimage

    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 3:
        raise ValueError(f"mask must be a (slices, rows, columns) array, got shape {mask.shape}")
    pixel_area = _pixel_area(geometry)
    out: list[VesselSection] = []
    for s in np.flatnonzero(mask.any(axis=(1, 2))):
        pieces, count = ndimage.label(mask[s], structure=np.ones((3, 3), dtype=bool))
        sizes = np.bincount(pieces.ravel(), minlength=count + 1)
        for k in range(1, count + 1):
            if sizes[k] * pixel_area >= min_area_mm2:
                out.append(_section(geometry, int(s), pieces == k))
    return out
