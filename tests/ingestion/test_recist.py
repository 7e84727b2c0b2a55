"""RECIST truth from masks (``ingestion.dataset.recist``) on rasterised ellipses and ellipsoids.

Shapes are rasterised by pixel centre (a pixel is inside when its centre is) on random, oblique,
anisotropic geometries; measurements are compared with the analytic values. Errors are counted
in pixels along the measured axis: ``error_mm / pitch``, where ``pitch`` is the length of one
pixel step along that direction, ``1 / |(du / column_spacing, dv / row_spacing)|`` for the unit
direction (du, dv) in the (row direction, column direction) frame of the slice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingestion.dataset.recist import lesion_axes, vessel_sections, z_range_lps_mm
from ingestion.geometry import Geometry


def _rotation(alpha: float, beta: float, gamma: float) -> npt.NDArray[np.float64]:
    ca, sa, cb, sb, cg, sg = (f(x) for x in (alpha, beta, gamma) for f in (math.cos, math.sin))
    rz = np.array([[ca, -sa, 0], [sa, ca, 0], [0, 0, 1]])
    ry = np.array([[cb, 0, sb], [0, 1, 0], [-sb, 0, cb]])
    rx = np.array([[1, 0, 0], [0, cg, -sg], [0, sg, cg]])
    return np.asarray(rz @ ry @ rx, dtype=np.float64)


def _geometry(rotation: npt.NDArray[np.float64], spacing: tuple[float, float, float]) -> Geometry:
    """Columns of ``rotation``: row direction, column direction, normal (= slice direction)."""
    return Geometry(
        origin=(-120.0, 35.5, 410.25),
        row_direction=tuple(rotation[:, 0]),
        column_direction=tuple(rotation[:, 1]),
        slice_direction=tuple(rotation[:, 2]),
        spacing=spacing,
    )


def _pitch(direction: npt.NDArray[np.float64], row_spacing: float, column_spacing: float) -> float:
    """One pixel's length (mm) along the in-plane unit ``direction`` = (du, dv)."""
    return 1.0 / math.hypot(direction[0] / column_spacing, direction[1] / row_spacing)


@dataclass
class Ellipse:
    """A rasterised ellipse on slice ``slice_index`` of ``mask``; in-plane (u, v) mm:
    u along the row direction, v along the column direction, from voxel [.., 0, 0]."""

    mask: npt.NDArray[np.bool_]
    geometry: Geometry
    slice_index: int
    centre_uv: npt.NDArray[np.float64]
    major: npt.NDArray[np.float64]  # unit (u, v)
    semi_major_mm: float
    semi_minor_mm: float
    major_pitch: float
    minor_pitch: float

    def lps(self, uv: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        row_spacing, column_spacing = self.geometry.spacing[1], self.geometry.spacing[2]
        index = np.array([self.slice_index, uv[1] / row_spacing, uv[0] / column_spacing])
        return self.geometry.index_to_lps(index)


def make_ellipse(
    semi_major_px: float,
    semi_minor_px: float,
    angle: float,
    row_spacing: float,
    column_spacing: float,
    rotation: npt.NDArray[np.float64],
    offset: tuple[float, float] = (0.0, 0.0),
    slices: int = 3,
) -> Ellipse:
    major = np.array([math.cos(angle), math.sin(angle)])
    minor = np.array([-major[1], major[0]])
    major_pitch = _pitch(major, row_spacing, column_spacing)
    minor_pitch = _pitch(minor, row_spacing, column_spacing)
    a_mm, b_mm = semi_major_px * major_pitch, semi_minor_px * minor_pitch
    if b_mm > a_mm:  # the semi-axes in pixels of their own direction; keep a the longer in mm
        a_mm, b_mm = b_mm, a_mm
        major, minor = minor, -major
        major_pitch, minor_pitch = minor_pitch, major_pitch
    rows = int(2 * a_mm / row_spacing) + 12
    columns = int(2 * a_mm / column_spacing) + 12
    centre = np.array(
        [(columns / 2 + offset[0]) * column_spacing, (rows / 2 + offset[1]) * row_spacing]
    )
    r, c = np.mgrid[0:rows, 0:columns]
    du, dv = c * column_spacing - centre[0], r * row_spacing - centre[1]
    along, across = du * major[0] + dv * major[1], du * minor[0] + dv * minor[1]
    mask = np.zeros((slices, rows, columns), dtype=bool)
    mask[slices // 2] = (along / a_mm) ** 2 + (across / b_mm) ** 2 <= 1.0
    geometry = _geometry(rotation, (2.5, row_spacing, column_spacing))
    return Ellipse(mask, geometry, slices // 2, centre, major, a_mm, b_mm, major_pitch, minor_pitch)


ELLIPSE = st.tuples(
    st.floats(3.0, 60.0),  # semi-axis, pixels along it
    st.floats(3.0, 60.0),
    st.floats(0.0, math.pi),
    st.floats(0.5, 1.5),  # row spacing
    st.floats(0.5, 1.5),  # column spacing
    st.tuples(st.floats(0.0, 2 * math.pi), st.floats(-1.5, 1.5), st.floats(0.0, 2 * math.pi)),
    st.tuples(st.floats(-0.5, 0.5), st.floats(-0.5, 0.5)),
)


def _ellipse(params: tuple) -> Ellipse:  # type: ignore[type-arg]
    a, b, angle, rs, cs, euler, offset = params
    return make_ellipse(a, b, angle, rs, cs, _rotation(*euler), offset)


def _errors(e: Ellipse) -> tuple[float, float]:
    axes = lesion_axes(e.mask, e.geometry)
    return (
        (axes.long_axis_mm - 2 * e.semi_major_mm) / e.major_pitch,
        (axes.short_axis_mm - 2 * e.semi_minor_mm) / e.minor_pitch,
    )


# -- lesions --------------------------------------------------------------------------------------
@settings(derandomize=True, max_examples=60, deadline=None)
@given(ELLIPSE)
def test_ellipse_axes_end_points_and_plane(params: tuple) -> None:  # type: ignore[type-arg]
    """Every ellipse: axes within 2 pixels (the worst: thin ellipses, semi-minor < 5 px, whose
    tip falls on a pixel centre), end points on the measured slice, centre at the ellipse's,
    long axis along its major axis (the bar of 0.5 pixel: the seeded batch test below)."""
    e = _ellipse(params)
    axes = lesion_axes(e.mask, e.geometry)
    long_error, short_error = _errors(e)
    assert abs(long_error) <= 2.0
    assert abs(short_error) <= 2.0
    assert axes.slice_index == e.slice_index
    normal = np.asarray(e.geometry.normal)
    plane = float(normal @ e.lps(e.centre_uv))
    ends = np.array([*axes.long_axis_lps_mm, *axes.short_axis_lps_mm])
    assert np.allclose(ends @ normal, plane, atol=1e-6)  # all in the slice's plane (oblique too)
    assert math.dist(axes.long_axis_lps_mm[0], axes.long_axis_lps_mm[1]) == pytest.approx(
        axes.long_axis_mm
    )
    assert math.dist(axes.short_axis_lps_mm[0], axes.short_axis_lps_mm[1]) == pytest.approx(
        axes.short_axis_mm
    )
    centre = e.lps(e.centre_uv)
    assert math.dist(axes.center_lps_mm, centre) <= 2.0 * max(e.geometry.spacing[1:])
    if e.semi_major_mm / e.semi_minor_mm >= 1.5:
        long_vec = np.subtract(*axes.long_axis_lps_mm)
        major_lps = e.lps(e.centre_uv + e.major) - centre
        cos = abs(long_vec @ major_lps) / np.linalg.norm(long_vec)
        assert cos >= math.cos(math.radians(10.0))
        short_vec = np.subtract(*axes.short_axis_lps_mm)
        assert abs(short_vec @ long_vec) <= 1e-6 * np.linalg.norm(long_vec) ** 2


def test_ellipse_accuracy_over_a_seeded_batch() -> None:
    """The issue's bar, over 300 seeded ellipses (semi-axes 3-60 px, any rotation, spacing
    0.5-1.5 mm, oblique): long and short axis within 0.5 pixel for at least 95 % of them (97 %
    measured), the mean error within +-0.15 pixel, none beyond 1.5 pixel. The misses: thin
    ellipses (semi-minor < 5 px: few pixels place the tips) and near-circles (the longest
    diameter's direction is ill-defined, and measuring along a slightly wrong one loses up to
    the difference of the axes)."""
    rng = np.random.default_rng(20240622)
    errors = []
    for _ in range(300):
        a, b = rng.uniform(3.0, 60.0, 2)
        e = make_ellipse(
            a,
            b,
            rng.uniform(0, math.pi),
            rng.uniform(0.5, 1.5),
            rng.uniform(0.5, 1.5),
            _rotation(*rng.uniform(-math.pi, math.pi, 3)),
            tuple(rng.uniform(-0.5, 0.5, 2)),
        )
        errors.append(_errors(e))
    values = np.array(errors)
    within = np.mean(np.abs(values) <= 0.5, axis=0)
    assert within.min() >= 0.95, within
    assert np.abs(values.mean(axis=0)).max() <= 0.15, values.mean(axis=0)
    assert np.abs(values).max() <= 1.5


@settings(derandomize=True, max_examples=25, deadline=None)
@given(
    st.floats(6.0, 40.0),
    st.floats(6.0, 40.0),
    st.floats(4.0, 12.0),  # semi-axis along the normal, in slices
    st.floats(0.0, math.pi),
    st.floats(0.5, 1.5),
    st.floats(0.5, 1.5),
    st.floats(-0.3, 0.3),  # centre's offset from a slice, in slices
    st.tuples(st.floats(0.0, 2 * math.pi), st.floats(-1.5, 1.5), st.floats(0.0, 2 * math.pi)),
)
def test_ellipsoid_largest_slice_and_its_section(
    a: float,
    b: float,
    c: float,
    angle: float,
    rs: float,
    cs: float,
    dz: float,
    euler: tuple[float, float, float],
) -> None:
    """An ellipsoid with one axis along the slice normal: measured on the slice nearest its
    centre (or the next one, where rasterisation makes that one's area larger), with that
    slice's analytic cross-section axes."""
    flat = make_ellipse(a, b, angle, rs, cs, _rotation(*euler), slices=1)
    spacing = 2.0
    slices = 2 * math.ceil(c) + 5
    z0 = slices // 2 + dz
    rows, columns = flat.mask.shape[1:]
    r, col = np.mgrid[0:rows, 0:columns]
    du, dv = col * cs - flat.centre_uv[0], r * rs - flat.centre_uv[1]
    major, minor = flat.major, np.array([-flat.major[1], flat.major[0]])
    q = ((du * major[0] + dv * major[1]) / flat.semi_major_mm) ** 2 + (
        (du * minor[0] + dv * minor[1]) / flat.semi_minor_mm
    ) ** 2
    z = (np.arange(slices) - z0)[:, None, None] / c
    mask = q[None] + z**2 <= 1.0
    geometry = _geometry(_rotation(*euler), (spacing, rs, cs))
    axes = lesion_axes(mask, geometry)
    nearest = round(z0)
    assert abs(axes.slice_index - nearest) <= 1
    scale = math.sqrt(1.0 - ((axes.slice_index - z0) / c) ** 2)
    assert abs(axes.long_axis_mm - 2 * flat.semi_major_mm * scale) <= 1.5 * flat.major_pitch
    assert abs(axes.short_axis_mm - 2 * flat.semi_minor_mm * scale) <= 1.5 * flat.minor_pitch
    # the z range: first and last slice centres with the component, widened by half a slice
    present = np.flatnonzero(mask.any(axis=(1, 2)))
    centres = mask[present[[0, -1]]]
    assert axes.z_range_lps_mm == z_range_lps_mm(mask, geometry)
    low, high = axes.z_range_lps_mm
    half = 0.5 * abs(geometry.slice_direction[2]) * spacing
    zs = [
        geometry.index_to_lps(np.column_stack([np.full(len(idx), s), idx]))[:, 2]
        for s, sec in zip(present[[0, -1]], centres, strict=True)
        for idx in [np.argwhere(sec).astype(float)]
    ]
    assert low == pytest.approx(min(z.min() for z in zs) - half)
    assert high == pytest.approx(max(z.max() for z in zs) + half)
    assert axes.voxels == int(mask.sum())


def test_largest_slice_tie_goes_to_the_centroid() -> None:
    """Equal areas on slices 1, 2 and 4: the centroid (slice 2.6) picks slice 2... and a cylinder
    of equal sections picks its middle."""
    geometry = _geometry(np.eye(3), (3.0, 1.0, 1.0))
    mask = np.zeros((6, 20, 20), dtype=bool)
    for s in (1, 2, 4):
        mask[s, 5:10, 5:10] = True
    mask[3, 6:8, 6:8] = True
    assert lesion_axes(mask, geometry).slice_index == 2
    mask = np.zeros((9, 20, 20), dtype=bool)
    mask[2:7, 5:10, 5:10] = True
    assert lesion_axes(mask, geometry).slice_index == 4


@pytest.mark.parametrize("voxels", [1, 2])
def test_tiny_components_measure(voxels: int) -> None:
    """One or two voxels: outlined by their pixel squares (no sub-pixel contour exists)."""
    geometry = _geometry(np.eye(3), (2.0, 0.8, 0.6))
    mask = np.zeros((3, 8, 8), dtype=bool)
    mask[1, 4, 3 : 3 + voxels] = True
    axes = lesion_axes(mask, geometry)
    assert axes.voxels == voxels
    assert axes.long_axis_mm == pytest.approx(math.hypot(0.6 * voxels, 0.8))
    assert 0 < axes.short_axis_mm <= axes.long_axis_mm
    assert axes.area_mm2 == pytest.approx(voxels * 0.48)


def test_empty_or_flat_mask_is_refused() -> None:
    geometry = _geometry(np.eye(3), (2.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="empty"):
        lesion_axes(np.zeros((2, 4, 4), dtype=bool), geometry)
    with pytest.raises(ValueError, match="slices, rows, columns"):
        lesion_axes(np.ones((4, 4), dtype=bool), geometry)


# -- vessels --------------------------------------------------------------------------------------
@settings(derandomize=True, max_examples=40, deadline=None)
@given(
    st.floats(5.0, 30.0),  # radius, pixels (a 3-px disc on a lattice coincidence: -0.7 px)
    st.floats(1.0, 1.6),  # an obliquely cut tube: major = minor x this
    st.floats(0.0, math.pi),
    st.floats(0.5, 1.5),
    st.floats(0.5, 1.5),
    st.tuples(st.floats(0.0, 2 * math.pi), st.floats(-1.5, 1.5), st.floats(0.0, 2 * math.pi)),
    st.tuples(st.floats(-0.5, 0.5), st.floats(-0.5, 0.5)),
)
def test_vessel_section_diameter_centre_and_ends(
    radius_px: float,
    stretch: float,
    angle: float,
    rs: float,
    cs: float,
    euler: tuple[float, float, float],
    offset: tuple[float, float],
) -> None:
    """Discs and ellipses: diameter (the minor axis) within 0.5 pixel along it, centre within
    0.1 mm + 0.05 pixel, end points through the centre along the minor axis."""
    major = np.array([math.cos(angle), math.sin(angle)])
    minor = np.array([-major[1], major[0]])
    major_px = radius_px * stretch * _pitch(minor, rs, cs) / _pitch(major, rs, cs)
    e = make_ellipse(major_px, radius_px, angle, rs, cs, _rotation(*euler), offset)
    sections = vessel_sections(e.mask, e.geometry, min_area_mm2=0.0)
    assert len(sections) == 1
    section = sections[0]
    assert section.slice_index == e.slice_index
    assert abs(section.diameter_mm - 2 * e.semi_minor_mm) <= 0.5 * e.minor_pitch
    assert section.major_axis_mm >= section.diameter_mm
    centre = e.lps(e.centre_uv)
    assert math.dist(section.center_lps_mm, centre) <= 0.1 + 0.05 * max(rs, cs)
    ends = np.array(section.diameter_lps_mm)
    assert np.linalg.norm(ends[1] - ends[0]) == pytest.approx(section.diameter_mm)
    assert np.allclose(ends.mean(axis=0), section.center_lps_mm)
    if e.semi_major_mm / e.semi_minor_mm >= 1.2:
        minor_lps = e.lps(e.centre_uv + np.array([-e.major[1], e.major[0]])) - centre
        direction = (ends[1] - ends[0]) / np.linalg.norm(ends[1] - ends[0])
        assert abs(direction @ minor_lps) >= math.cos(math.radians(5.0))
    assert section.area_mm2 == pytest.approx(int(e.mask.sum()) * rs * cs)
    assert section.equivalent_diameter_mm == pytest.approx(
        2 * math.sqrt(section.area_mm2 / math.pi)
    )
    assert not section.touches_edge


def test_vessel_sections_per_slice_piece_area_and_edge() -> None:
    """Two pieces on one slice, one too small; a piece on the image edge is flagged."""
    geometry = _geometry(np.eye(3), (2.0, 1.0, 1.0))
    mask = np.zeros((2, 30, 30), dtype=bool)
    r, c = np.mgrid[0:30, 0:30]
    mask[0] = (r - 8) ** 2 + (c - 8) ** 2 <= 16  # 49 pixels
    mask[0] |= (r - 20) ** 2 + (c - 20) ** 2 <= 2  # 9 pixels: < 20 mm^2
    mask[1] = (r - 15) ** 2 + c**2 <= 25  # cut by column 0
    sections = vessel_sections(mask, geometry)
    assert [(s.slice_index, s.pixels, s.touches_edge) for s in sections] == [
        (0, 49, False),
        (1, int(mask[1].sum()), True),
    ]
