"""Which axial plane a lesion is measured on: the one where it is largest (RECIST).

RECIST measures a lesion's long axis on the axial slice where it is longest. The find step's
grouped centre is only an estimate of the lesion's middle along z (its boxes are coarse and
some planes are missed), and a cross-section off the middle is smaller: measuring there alone
underestimates both axes. So a lesion is measured on the plane of its grouped centre and on
``planes`` examined planes to either side (at the find step's plane spacing, inside the
volume), and the plane whose answer has the longest long axis is kept, with its short axis.
Vessels (cylinders along z) are measured at their centre only.

On validation phantoms (demo checkpoint, runs 5555 and 6666, 84 matched lesions) six planes to
either side took the long-axis MAE from 2.15 / 4.09 mm to 1.41 / 1.39 mm and the short-axis
MAE from 1.24 / 2.82 to 0.72 / 0.91 mm; more planes changed nothing (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ingestion.volume import Volume
from model.measurer.inference import MeasureOutcome
from model.measurer.results import FindingKind

__all__ = ["best_plane", "search_points"]

Point = tuple[float, float, float]


def search_points(
    volume: Volume, center: Point, kind: FindingKind, planes: int, spacing_mm: float
) -> list[Point]:
    """Where to measure a finding: its centre first, then for a lesion the points ``k *
    spacing_mm`` above and below it (k = 1..planes, nearest first) whose plane lies inside the
    volume. ``planes`` 0 or a vessel: the centre only."""
    if planes < 0:
        raise ValueError(f"planes must be >= 0, got {planes}")
    if not spacing_mm > 0:
        raise ValueError(f"spacing_mm must be > 0, got {spacing_mm}")
    points = [center]
    if kind is not FindingKind.LESION:
        return points
    last = volume.shape[0] - 1
    for k in range(1, planes + 1):
        for sign in (1.0, -1.0):
            point = (center[0], center[1], center[2] + sign * k * spacing_mm)
            index = volume.geometry.lps_to_index(np.asarray(point, dtype=np.float64))
            if -0.5 <= float(index[0]) <= last + 0.5:
                points.append(point)
    return points


def best_plane(outcomes: Sequence[MeasureOutcome]) -> int:
    """The outcome to keep: the parsed one whose first measurement (long axis, or diameter) is
    largest, the earliest (the centre, then the nearest planes) on ties; the centre's (index 0)
    when none parsed, so that its reason is what the result reports."""
    best, best_value = 0, -np.inf
    for i, outcome in enumerate(outcomes):
        if not outcome.parsed:
            continue
        value = outcome.measurements[0].value_mm
        if value is not None and value > best_value:
            best, best_value = i, value
    return best
