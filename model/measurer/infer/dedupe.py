"""One report per object, from the model's own reports.

The find step sees an object plane by plane (and tile by tile), and grouping can leave one
object as several candidates. Two objects of one kind cannot fill the same place, so:

- a *vessel* report whose axial centre lies within the radius of a vessel report seen on more
  planes (its measured diameter; the find box where not measurable) is a piece of that vessel
  split along z;
- a *lesion* report whose centre lies inside a larger lesion report's measured cross-section
  (the ellipse of its drawn axes; without axes, the disk of its short axis) and within a
  quarter of that lesion's long axis along z is the same lesion.

Nothing here reads the image: no HU level decides what a report is (the model's point task
did). A lesion reported inside a vessel is kept, and both are for the reviewer to judge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from model.measurer.infer.grouping import GroupedFinding
from model.measurer.infer.inference import MeasureOutcome
from model.measurer.results import FindingKind, Segment3

__all__ = ["SAME_LESION_Z", "one_report_per_object"]

SAME_LESION_Z = 0.25
"""Two reports of one lesion lie within this fraction of its long axis along z."""


def _value(finding: GroupedFinding, outcome: MeasureOutcome | None, index: int) -> float:
    if outcome is None or index >= len(outcome.measurements):
        return finding.size_mm
    value = outcome.measurements[index].value_mm
    return finding.size_mm if value is None else value


def _axial(a: GroupedFinding, b: GroupedFinding) -> float:
    return math.hypot(
        a.center_lps_mm[0] - b.center_lps_mm[0], a.center_lps_mm[1] - b.center_lps_mm[1]
    )


def _inside_lesion(
    point: GroupedFinding,
    lesion: GroupedFinding,
    outcome: MeasureOutcome | None,
    axes: Sequence[Segment3] | None,
) -> bool:
    long, short = _value(lesion, outcome, 0), _value(lesion, outcome, 1)
    dx = point.center_lps_mm[0] - lesion.center_lps_mm[0]
    dy = point.center_lps_mm[1] - lesion.center_lps_mm[1]
    if abs(point.center_lps_mm[2] - lesion.center_lps_mm[2]) > SAME_LESION_Z * long:
        return False
    if not axes or long <= 0 or short <= 0:
        return math.hypot(dx, dy) < 0.5 * short
    a, b = axes[0]
    ux, uy = b[0] - a[0], b[1] - a[1]
    norm = math.hypot(ux, uy)
    if norm == 0:
        return math.hypot(dx, dy) < 0.5 * short
    ux, uy = ux / norm, uy / norm
    along, across = dx * ux + dy * uy, -dx * uy + dy * ux
    return (along / (0.5 * long)) ** 2 + (across / (0.5 * short)) ** 2 < 1.0


def one_report_per_object(
    findings: Sequence[GroupedFinding],
    outcomes: Sequence[MeasureOutcome | None],
    axes: Sequence[Sequence[Segment3] | None],
) -> list[int]:
    """Indices (increasing) of the reports to keep (module doc); ``outcomes`` and ``axes``
    align with ``findings`` (None: not measured / not drawn)."""
    if not len(findings) == len(outcomes) == len(axes):
        raise ValueError(
            f"{len(findings)} findings, {len(outcomes)} outcomes and {len(axes)} axes must align"
        )
    vessels = [i for i, f in enumerate(findings) if f.kind is FindingKind.VESSEL]
    vessels.sort(key=lambda i: -len(findings[i].planes))  # stable: ties keep their order
    kept: list[int] = []
    for i in vessels:
        if not any(
            _axial(findings[i], findings[k]) < 0.5 * _value(findings[k], outcomes[k], 0)
            for k in kept
        ):
            kept.append(i)
    lesions = [i for i, f in enumerate(findings) if f.kind is FindingKind.LESION]
    lesions.sort(key=lambda i: -_value(findings[i], outcomes[i], 0))
    kept_lesions: list[int] = []
    for i in lesions:
        if not any(
            _inside_lesion(findings[i], findings[k], outcomes[k], axes[k]) for k in kept_lesions
        ):
            kept_lesions.append(i)
    return sorted(kept + kept_lesions)
