"""The measurement is the caliper (``model.measurer.infer.caliper``): end points placed on the axes
answer's drawing, at the measure task's lengths; nothing without a drawing to place it on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model.measurer.infer.caliper import NO_CALIPER, caliper, caliper_length_mm
from model.measurer.results import (
    NOT_MEASURABLE,
    FindingKind,
    Measurement,
    MeasurementName,
    StudyFinding,
)

LONG, SHORT, DIAMETER = (
    MeasurementName.LONG_AXIS,
    MeasurementName.SHORT_AXIS,
    MeasurementName.DIAMETER,
)
AXIAL = (0.0, 0.0, 1.0)


def _lesion(long_mm: float | None, short_mm: float | None) -> tuple[Measurement, Measurement]:
    def one(name: MeasurementName, value: float | None) -> Measurement:
        if value is None:
            return Measurement.not_measurable(name, "malformed")
        return Measurement(name, value, (value - 1, value + 1), 0.9)

    return one(LONG, long_mm), one(SHORT, short_mm)


def _angle(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(math.acos(abs(float(a @ b)) / float(np.linalg.norm(a) * np.linalg.norm(b))))


def test_a_lesion_caliper_is_its_values_on_the_drawn_place() -> None:
    # drawn: a 7.8 mm long axis at 30 degrees, a short axis 3 mm off its middle, not quite
    # perpendicular; measured: 22.3 x 11.0 mm
    rng = np.random.default_rng(43)
    centre = np.array([10.0, -20.0, 35.0])
    u = np.array([math.cos(math.radians(30)), math.sin(math.radians(30)), 0.0])
    v = np.array([-u[1], u[0], 0.0])
    long_drawn = (tuple(centre - 3.9 * u), tuple(centre + 3.9 * u))
    s_mid = centre + 3.0 * u + rng.normal(0, 0.1, 3) * np.array([1, 1, 0])
    s_dir = v + 0.1 * u
    short_drawn = (tuple(s_mid - 2 * s_dir), tuple(s_mid + 2 * s_dir))
    measurements, axes = caliper(
        FindingKind.LESION, _lesion(22.3, 11.0), (long_drawn, short_drawn), AXIAL
    )
    assert [m.value_mm for m in measurements] == [22.3, 11.0]  # the values are kept
    assert axes is not None
    long_seg, short_seg = axes
    assert caliper_length_mm(long_seg) == pytest.approx(22.3, abs=1e-9)
    assert caliper_length_mm(short_seg) == pytest.approx(11.0, abs=1e-9)
    a, b = (np.asarray(p) for p in long_seg)
    c, d = (np.asarray(p) for p in short_seg)
    assert np.allclose((a + b) / 2, centre)  # the drawn midpoint and direction
    assert _angle(b - a, u) == pytest.approx(0.0, abs=1e-6)
    assert _angle(d - c, b - a) == pytest.approx(90.0, abs=1e-6)  # perpendicular
    crossing = (c + d) / 2  # on the long axis, where the drawn short axis crossed it
    assert float(np.linalg.norm(np.cross(crossing - a, b - a))) == pytest.approx(0, abs=1e-6)
    assert float((crossing - centre) @ u) == pytest.approx(3.0, abs=0.3)
    # and a StudyFinding holds them together
    StudyFinding(1, FindingKind.LESION, tuple(centre), 0, measurements, axes)


def test_the_short_axis_crosses_within_the_long_one() -> None:
    long_drawn = ((0.0, 0.0, 0.0), (10.0, 0.0, 0.0))
    short_drawn = ((40.0, -2.0, 0.0), (40.0, 2.0, 0.0))  # drawn far beyond the long axis' end
    _, axes = caliper(FindingKind.LESION, _lesion(10.0, 4.0), (long_drawn, short_drawn), AXIAL)
    assert axes is not None
    (c, d) = (np.asarray(p) for p in axes[1])
    assert (c + d)[0] / 2 == pytest.approx(10.0)  # kept at the long axis' end


def test_a_vessel_diameter_keeps_its_drawn_line() -> None:
    diameter = Measurement(DIAMETER, 24.0, (23.0, 25.0), 0.9)
    drawn = (((-5.0, 3.0, 7.0), (5.0, 3.0, 7.0)),)
    measurements, axes = caliper(FindingKind.VESSEL, (diameter,), drawn, AXIAL)
    assert axes is not None and measurements == (diameter,)
    assert caliper_length_mm(axes[0]) == pytest.approx(24.0)
    assert np.allclose(np.mean(axes[0], axis=0), (0.0, 3.0, 7.0))


@pytest.mark.parametrize(
    "drawn",
    [None, (((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)), ((0.0, 0.0, 0.0), (0.0, 1.0, 0.0)))],
    ids=["malformed answer", "a drawn point"],
)
def test_no_drawing_means_no_number(drawn: object) -> None:
    measurements, axes = caliper(FindingKind.LESION, _lesion(12.0, 8.0), drawn, AXIAL)  # type: ignore[arg-type]
    assert axes is None
    assert all(m.value_mm is None and m.qualifier == NOT_MEASURABLE for m in measurements)
    assert all(m.reason == NO_CALIPER for m in measurements)


def test_a_long_axis_not_measurable_leaves_no_short_caliper() -> None:
    drawn = (((0.0, 0.0, 0.0), (10.0, 0.0, 0.0)), ((5.0, -2.0, 0.0), (5.0, 2.0, 0.0)))
    measurements, axes = caliper(FindingKind.LESION, _lesion(None, 6.0), drawn, AXIAL)
    assert axes is None and all(m.value_mm is None for m in measurements)
    assert "long axis is not measurable" in (measurements[1].reason or "")


def test_a_short_axis_not_measurable_keeps_the_long_caliper() -> None:
    drawn = (((0.0, 0.0, 0.0), (10.0, 0.0, 0.0)), ((5.0, -2.0, 0.0), (5.0, 2.0, 0.0)))
    measurements, axes = caliper(FindingKind.LESION, _lesion(14.0, None), drawn, AXIAL)
    assert axes is not None and measurements[0].value_mm == 14.0
    assert caliper_length_mm(axes[0]) == pytest.approx(14.0)
    assert caliper_length_mm(axes[1]) == 0.0  # no value, no length


def test_the_wrong_measurements_for_the_kind_are_refused() -> None:
    with pytest.raises(ValueError, match="lesion"):
        caliper(FindingKind.LESION, (Measurement(DIAMETER, 3.0),), None, AXIAL)


def test_a_finding_whose_numbers_contradict_its_line_cannot_be_made() -> None:
    long_seg = ((0.0, 0.0, 0.0), (7.8, 0.0, 0.0))
    short_seg = ((3.9, -2.0, 0.0), (3.9, 2.0, 0.0))
    with pytest.raises(ValueError, match=r"long_axis is 22.30 mm but its end points are 7.80"):
        StudyFinding(1, FindingKind.LESION, (0, 0, 0), 0, _lesion(22.3, 4.0), (long_seg, short_seg))
    ok = StudyFinding(1, FindingKind.LESION, (0, 0, 0), 0, _lesion(7.8, 4.0), (long_seg, short_seg))
    assert ok.axes_lps_mm is not None
