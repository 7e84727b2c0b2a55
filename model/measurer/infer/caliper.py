"""The measurement is the caliper: every linear value is the distance between its two end points.

Until the model answers with end points itself (issue 44), a finding's numbers come from the
``measure`` (or ``point``) task and the line from the ``axes`` task, two answers that can
disagree (a 7.8 mm line labelled 22.3 mm). :func:`caliper` makes them one: **the values are the
measure task's; the end points are derived from them**, placed where the axes answer drew:

- long axis (lesion) and diameter (vessel): the drawn segment's midpoint and direction, with the
  measured length;
- short axis: perpendicular to the long axis in the plane of the drawing, with the measured
  length, centred where the drawn short axis crosses the long axis (its midpoint projected onto
  the long axis, kept within it), so the two cross as a reader's calipers do.

The values are kept (not the drawing's lengths) because they are what the ranges were calibrated
on. Where there is no drawing to place a value (a malformed axes answer), the value is "not
measurable" with the reason: radcaliper never shows a number without its caliper, and never
guesses a direction. A lesion whose long axis is not measurable has no caliper for its short
axis either. Pure numpy; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from model.measurer.results import (
    MEASUREMENTS_OF,
    FindingKind,
    Measurement,
    MeasurementName,
    Segment3,
)

__all__ = ["NO_CALIPER", "caliper", "caliper_length_mm"]

NO_CALIPER = "the model drew no caliper for it (its axes answer was malformed)"

FloatArray = npt.NDArray[np.float64]


def caliper_length_mm(segment: Segment3) -> float:
    """The distance between a segment's two end points (LPS mm)."""
    (x0, y0, z0), (x1, y1, z1) = segment
    return math.dist((x0, y0, z0), (x1, y1, z1))


def _points(segment: Segment3) -> tuple[FloatArray, FloatArray]:
    return np.asarray(segment[0], dtype=np.float64), np.asarray(segment[1], dtype=np.float64)


def _segment(centre: FloatArray, direction: FloatArray, length: float) -> Segment3:
    a = centre - direction * (length / 2)
    b = centre + direction * (length / 2)
    return (float(a[0]), float(a[1]), float(a[2])), (float(b[0]), float(b[1]), float(b[2]))


def _unit(vector: FloatArray) -> FloatArray | None:
    norm = float(np.linalg.norm(vector))
    return None if norm < 1e-9 else vector / norm


def _perpendicular(
    long_unit: FloatArray, drawn_short: FloatArray, normal: FloatArray
) -> FloatArray:
    """A unit vector perpendicular to the long axis: the drawn short axis' direction made
    perpendicular, or (a degenerate drawing) the in-plane perpendicular of the slice."""
    across = _unit(drawn_short - float(drawn_short @ long_unit) * long_unit)
    if across is None:
        across = _unit(np.cross(normal, long_unit))
    if across is None:  # the long axis along the slice normal: any perpendicular will do
        helper = np.array([1.0, 0.0, 0.0]) if abs(long_unit[0]) < 0.9 else np.array([0, 1.0, 0])
        across = _unit(np.cross(long_unit, helper))
    assert across is not None
    return across


def _without(measurements: Sequence[Measurement], reason: str) -> tuple[Measurement, ...]:
    return tuple(
        m if m.value_mm is None else Measurement.not_measurable(m.name, reason)
        for m in measurements
    )


def caliper(
    kind: FindingKind,
    measurements: Sequence[Measurement],
    drawn: Sequence[Segment3] | None,
    slice_normal: Sequence[float],
) -> tuple[tuple[Measurement, ...], tuple[Segment3, ...] | None]:
    """The finding's measurements and the end points that are them (module doc).

    Args:
        kind: lesion (long, short axis) or vessel (diameter).
        measurements: the values in ``MEASUREMENTS_OF[kind]`` order (some may be not
            measurable).
        drawn: the axes answer's segments in LPS mm (lesion: long, short; vessel: diameter), or
            None where it was malformed.
        slice_normal: the volume's slice normal (used only where the drawing is degenerate).

    Returns:
        The measurements (a value with nothing to place it on becomes "not measurable") and
        the segments, or None where no value is left to draw.
    """
    names = MEASUREMENTS_OF[kind]
    by_name = {m.name: m for m in measurements}
    if tuple(by_name) != names:
        raise ValueError(f"a {kind} has {names}, got {tuple(by_name)}")
    if all(m.value_mm is None for m in measurements):
        return tuple(measurements), None
    if drawn is None or len(drawn) != len(names):
        return _without(measurements, NO_CALIPER), None
    first = by_name[names[0]]
    if first.value_mm is None:
        return _without(measurements, f"its {names[0].replace('_', ' ')} is not measurable"), None
    a, b = _points(drawn[0])
    direction = _unit(b - a)
    if direction is None:  # a drawn point, not a line: no direction to place the value on
        return _without(measurements, NO_CALIPER), None
    centre = (a + b) / 2
    first_segment = _segment(centre, direction, first.value_mm)
    if kind is FindingKind.VESSEL:
        return tuple(measurements), (first_segment,)
    short = by_name[MeasurementName.SHORT_AXIS]
    s0, s1 = _points(drawn[1])
    across = _perpendicular(direction, s1 - s0, np.asarray(slice_normal, dtype=np.float64))
    half = first.value_mm / 2
    along = float(np.clip(((s0 + s1) / 2 - centre) @ direction, -half, half))
    crossing = centre + along * direction
    if short.value_mm is None:
        # no value to draw: the short segment is a zero-length mark where it would cross
        return tuple(measurements), (first_segment, _segment(crossing, across, 0.0))
    return tuple(measurements), (first_segment, _segment(crossing, across, short.value_mm))
