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

Only planes still on the lesion compete. Off a lesion the model is asked to measure something
that is not there: the demo model then answers about 9 mm (the small end of its training sizes)
and, now and then, a wild 58-59 mm, or measures a neighbouring lesion above or below. Kept
blindly, the largest answer was such a plane (held-out: 22.5 mm lesions reported at 58 mm, the
centre moved 18 mm off the lesion). A lesion's long axis along z rises to its middle and falls
after it, so walking out from the centre on each side, a fall followed by a rise is a second
structure: once the answers have fallen more than the tolerance (``max(RISE_MM, RISE_FRACTION
x the lowest answer since the peak)``) below the largest so far, the first answer more than the
tolerance above the lowest ends the search on that side, and planes from there on are not kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ingestion.volume import Volume
from model.measurer.infer.inference import MeasureOutcome
from model.measurer.results import FindingKind

__all__ = ["RISE_FRACTION", "RISE_MM", "best_plane", "search_points"]

#: how far the long axis must fall and then rise again along z to end the search on a side
RISE_MM = 3.0
RISE_FRACTION = 0.2

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


def best_plane(outcomes: Sequence[MeasureOutcome], offsets_mm: Sequence[float]) -> int:
    """The outcome to keep: among the planes still on the lesion (module doc), the parsed one
    whose first measurement (long axis, or diameter) is largest, the earliest (the centre, then
    the nearest planes) on ties; the centre's (index 0) when none parsed, so that its reason is
    what the result reports.

    ``offsets_mm`` gives each outcome's plane as its signed distance along z from the centre
    (0 for the centre, first), as :func:`search_points` places them.
    """
    if len(offsets_mm) != len(outcomes):
        raise ValueError(f"{len(outcomes)} outcomes but {len(offsets_mm)} offsets")
    values = [_first_value(o) for o in outcomes]
    on_lesion = [0] if outcomes else []
    for side in (1.0, -1.0):
        outward = sorted(
            (i for i, offset in enumerate(offsets_mm) if offset * side > 0),
            key=lambda i: abs(offsets_mm[i]),
        )
        # (largest answer so far, lowest answer since it); None until an answer parsed
        span = None if not values or values[0] is None else (values[0], values[0])
        for i in outward:
            value = values[i]
            if value is None:
                continue
            if span is not None:
                peak, low = span
                tolerance = max(RISE_MM, RISE_FRACTION * low)
                if low < peak - tolerance and value > low + tolerance:
                    break  # fell and rose again: another structure from here on
            span = (
                (value, value)
                if span is None or value > span[0]
                else (span[0], min(span[1], value))
            )
            on_lesion.append(i)
    best, best_value = 0, -np.inf
    for i in sorted(on_lesion):
        value = values[i]
        if value is not None and value > best_value:
            best, best_value = i, value
    return best


def _first_value(outcome: MeasureOutcome) -> float | None:
    """The first measurement's value of a parsed outcome; None when malformed or missing."""
    if not outcome.parsed:
        return None
    return outcome.measurements[0].value_mm
