"""Geometry: validation, affine, voxel <-> LPS round trips (property tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ingestion.geometry import Geometry

finite = st.floats(-500, 500, allow_nan=False, allow_infinity=False)
spacing = st.floats(0.05, 20.0, allow_nan=False)


def rotation(angles: tuple[float, float, float]) -> np.ndarray:
    a, b, c = angles
    rx = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    ry = np.array([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    rz = np.array([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


@st.composite
def geometries(draw: st.DrawFn) -> Geometry:
    angles = draw(st.tuples(*(st.floats(-math.pi, math.pi) for _ in range(3))))
    rot = rotation(angles)
    flip = draw(st.sampled_from([1.0, -1.0]))  # slice axis along +normal or -normal
    tilt = draw(st.floats(-0.4, 0.4))  # gantry tilt: slice axis leaning towards the columns
    slice_dir = flip * rot[:, 2] + tilt * rot[:, 1]
    slice_dir /= np.linalg.norm(slice_dir)
    return Geometry(
        origin=tuple(draw(st.tuples(finite, finite, finite))),
        row_direction=tuple(rot[:, 0]),
        column_direction=tuple(rot[:, 1]),
        slice_direction=tuple(slice_dir),
        spacing=draw(st.tuples(spacing, spacing, spacing)),
    )


@settings(max_examples=200, deadline=None)
@given(geometries(), arrays(np.float64, (7, 3), elements=st.floats(-600, 600)))
def test_index_lps_round_trip(geometry: Geometry, index: np.ndarray) -> None:
    lps = geometry.index_to_lps(index)
    back = geometry.lps_to_index(lps)
    np.testing.assert_allclose(back, index, atol=1e-6)


@settings(max_examples=200, deadline=None)
@given(geometries(), arrays(np.float64, (5, 3), elements=st.floats(-400, 400)))
def test_lps_index_round_trip(geometry: Geometry, points: np.ndarray) -> None:
    np.testing.assert_allclose(
        geometry.index_to_lps(geometry.lps_to_index(points)), points, atol=1e-6
    )


@settings(max_examples=100, deadline=None)
@given(geometries())
def test_affine_round_trip_and_unit_steps(geometry: Geometry) -> None:
    again = Geometry.from_affine(geometry.affine)
    np.testing.assert_allclose(again.affine, geometry.affine, atol=1e-9)
    # one step along each array axis moves exactly that axis' spacing in mm
    base = geometry.index_to_lps([0.0, 0.0, 0.0])
    for axis in range(3):
        step = np.zeros(3)
        step[axis] = 1.0
        moved = geometry.index_to_lps(step) - base
        assert np.linalg.norm(moved) == pytest.approx(geometry.spacing[axis], rel=1e-9)


def test_dicom_convention_for_a_plain_axial_stack() -> None:
    g = Geometry(
        origin=(-100.0, -120.0, 50.0),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(2.5, 0.7, 0.8),
    )
    # voxel [slice 2, row 3, column 4]: x grows with the column (0.8 mm), y with the row (0.7 mm)
    np.testing.assert_allclose(g.index_to_lps([2, 3, 4]), [-100 + 4 * 0.8, -120 + 3 * 0.7, 55.0])
    assert g.plane == "axial"
    assert g.tilt_degrees == pytest.approx(0.0)
    assert (g.row_spacing, g.column_spacing, g.slice_spacing) == (0.7, 0.8, 2.5)


@pytest.mark.parametrize(
    ("row", "col", "plane"),
    [
        ((0.0, 1.0, 0.0), (0.0, 0.0, -1.0), "sagittal"),
        ((1.0, 0.0, 0.0), (0.0, 0.0, -1.0), "coronal"),
        ((1.0, 0.0, 0.0), (0.0, math.cos(0.5), math.sin(0.5)), "oblique"),
    ],
)
def test_plane_labels(row: tuple[float, ...], col: tuple[float, ...], plane: str) -> None:
    normal = tuple(np.cross(row, col))
    g = Geometry(
        origin=(0.0, 0.0, 0.0),
        row_direction=row,
        column_direction=col,
        slice_direction=normal,
        spacing=(1.0, 1.0, 1.0),
    )
    assert g.plane == plane


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"spacing": (0.0, 1.0, 1.0)}, "spacing must be > 0"),
        ({"spacing": (1.0, float("nan"), 1.0)}, "spacing must be three finite"),
        ({"row_direction": (2.0, 0.0, 0.0)}, "row_direction must be a unit vector"),
        ({"slice_direction": (1.0, 0.0, 0.0)}, "coplanar"),
        ({"origin": (0.0, 0.0)}, "origin must be three finite"),
    ],
)
def test_invalid_geometry_is_refused_with_the_argument_named(
    kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {
        "origin": (0.0, 0.0, 0.0),
        "row_direction": (1.0, 0.0, 0.0),
        "column_direction": (0.0, 1.0, 0.0),
        "slice_direction": (0.0, 0.0, 1.0),
        "spacing": (1.0, 1.0, 1.0),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        Geometry(**args)  # type: ignore[arg-type]
