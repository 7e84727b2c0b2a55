"""One report per object: vessel pieces and lesion duplicates are reported once.

The find step sees an object plane by plane, and grouping (``model.measurer.grouping``) can
leave one object as several findings. Two rules, after measuring, use what the phantom spec
says objects are (``shared/design/phantom-spec.md``) and drop the extra reports:

- *Vessels* run along z through the study as one cylinder. Vessel findings whose axial-plane
  centres are closer than ``max(5 mm, half the larger diameter)`` are pieces of one vessel
  split along z: the piece seen on the most planes is kept (ties: the first).
- *Lesions* are ellipsoids at least 3 mm apart, whose cranio-caudal extent is at least half
  their long axis. A lesion finding whose centre lies inside a larger one's measured
  cross-section (the ellipse of its measured axes; without axes, the disk of its short axis)
  and within a quarter of its long axis along z (plus a margin for the plane search) is the
  same lesion: no two lesions within the spec can be placed so. The one with the longer long
  axis is kept.

- *A lesion inside a vessel* (its centre within the vessel's radius: the spec keeps lesions
  3 mm off the vessel) is a piece of the vessel seen as a lesion when the vessel was found on
  at least half of the examined planes (a vessel runs through the study; a lesion spans at
  most its long axis along z), or when the "lesion"'s centre is contrast-filled like a vessel
  (median at least :data:`VESSEL_MIN_HU`). Otherwise a shorter "vessel" there may be a lesion
  seen as a vessel, so both are kept (dropping either lost true findings on validation).

Before measuring, :func:`short_vessels_as_lesions` uses the same facts the other way round: a
"vessel" that, with every vessel piece at its axial position, was seen on fewer than half of
the examined planes, and whose centre is not contrast-filled (median below the spec's 150 HU
for vessels), is a lesion the find or point step called a vessel, and is measured as a lesion.
(Coverage alone is not enough: the find step sees some true vessels on few planes, and
relabelling those lost a tenth of the vessels on validation.)

Also before measuring, :func:`long_lesions_as_vessels`: a contrast-filled "lesion" that runs
through the study and spans along z more than one and a half times its size is a tube, not an
ellipsoid (whose cranio-caudal extent is at most its long axis): a vessel. After measuring,
a finding whose centre is air (:func:`centred_in_air`) is outside the body and is dropped.

*Tubes* (``tubes``, optional in both rules): the spec's one vessel is contrast-filled through
all slices, while a lesion spans at most its long axis (<= 60 mm) along z. So whether a
finding's axial centre is contrast-filled on nearly every slice of the study
(:func:`is_tube`, on the profile the pipeline reads from the volume) says what lies there
better than the planes a finding was seen on, which follow the find step's misses. Where
``tubes`` is given, a "vessel" whose centre is no tube is a lesion
(:func:`short_vessels_as_lesions`), and a lesion inside a vessel finding is a piece of it only
when its own centre or the vessel's is a tube (:func:`consolidate`): a hyperdense lesion that
the find step also saw as a vessel is no longer dropped for that vessel. (A lesion that fills
a short study along z with a contrast-filled interior still reads as a tube: the rules then
decide as without tubes.)

Where a value is "not measurable", the find step's box size stands in for it. On validation
phantoms (demo checkpoint; runs 5555 and 6666, 70 studies) the rules took the false findings
from 1.17 / 1.03 to 0.43 / 0.40 per study without losing a true finding; the two HU rules
then took 80 studies of each run from 0.35 / 0.35 to 0.16 / 0.21 and lesion recall from 0.64 /
0.60 to 0.67 / 0.62, vessels unchanged (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from model.measurer.grouping import GroupedFinding
from model.measurer.inference import MeasureOutcome
from model.measurer.results import FindingKind, Segment3

__all__ = [
    "AIR_MAX_HU",
    "TUBE_MIN_FRACTION",
    "TUBE_MIN_HU",
    "VESSEL_MIN_HU",
    "centred_in_air",
    "consolidate",
    "is_tube",
    "long_lesions_as_vessels",
    "short_vessels_as_lesions",
]

_VESSEL_REACH_MM = 5.0
VESSEL_MIN_HU = 150.0
"""The phantom spec's vessels are contrast-filled, 150-300 HU."""
_SAME_LESION_Z = 0.3
"""Two reports of one lesion lie within this fraction of its long axis along z: a quarter (the
spec's least cranio-caudal half-extent) and a margin for the plane search, which moves each
report's z to the plane where it measured longest."""
TUBE_MIN_HU = 120.0
"""A slice is contrast-filled at a centre whose median is at least this: above soft tissue
(30-60 HU plus noise; the median of a 3 mm patch) and below the spec's least vessel HU (150)
with a margin for the noise of that median."""
TUBE_MIN_FRACTION = 0.8
"""A centre contrast-filled on at least this fraction of the slices is a tube through the study
(the vessel is on all of them; the fraction allows for a centre a few mm off)."""
AIR_MAX_HU = -500.0
"""A centre whose median is below this is air (-1000 HU), not tissue (fat is about -100 HU)."""


def _value(finding: GroupedFinding, outcome: MeasureOutcome, index: int) -> float:
    value = outcome.measurements[index].value_mm
    return finding.size_mm if value is None else value


def _axial(a: GroupedFinding, b: GroupedFinding) -> float:
    return math.hypot(
        a.center_lps_mm[0] - b.center_lps_mm[0], a.center_lps_mm[1] - b.center_lps_mm[1]
    )


def _one_vessel(a: GroupedFinding, b: GroupedFinding, size_a: float, size_b: float) -> bool:
    """Two vessel findings of these diameters (or box sizes) are pieces of one vessel."""
    return _axial(a, b) < max(_VESSEL_REACH_MM, 0.5 * max(size_a, size_b))


def _runs_through(planes: int, examined_planes: int) -> bool:
    """Seen on at least half of the examined planes, as a vessel through the study is."""
    return 2 * planes >= examined_planes


def _check_hu(
    findings: Sequence[GroupedFinding],
    centre_hu: Sequence[float] | None,
    tubes: Sequence[bool] | None = None,
) -> None:
    if centre_hu is not None and len(centre_hu) != len(findings):
        raise ValueError(f"{len(findings)} findings but {len(centre_hu)} centre HU values")
    if tubes is not None and len(tubes) != len(findings):
        raise ValueError(f"{len(findings)} findings but {len(tubes)} tube flags")


def is_tube(profile_hu: Sequence[float], min_hu: float = TUBE_MIN_HU) -> bool:
    """Whether a centre whose median HU on each slice of the study is ``profile_hu`` is
    contrast-filled (at least ``min_hu``) on at least :data:`TUBE_MIN_FRACTION` of them."""
    if not len(profile_hu):
        raise ValueError("is_tube needs the centre's HU on at least one slice")
    filled = sum(hu >= min_hu for hu in profile_hu)
    return filled >= TUBE_MIN_FRACTION * len(profile_hu)


def _inside_lesion(
    point: GroupedFinding,
    lesion: GroupedFinding,
    outcome: MeasureOutcome,
    axes: Sequence[Segment3] | None,
) -> bool:
    """Whether ``point``'s centre lies inside ``lesion``'s measured axial cross-section (the
    ellipse of its axes; without axes, the disk of its short axis) and within
    :data:`_SAME_LESION_Z` of its long axis along z."""
    long, short = _value(lesion, outcome, 0), _value(lesion, outcome, 1)
    dx = point.center_lps_mm[0] - lesion.center_lps_mm[0]
    dy = point.center_lps_mm[1] - lesion.center_lps_mm[1]
    if abs(point.center_lps_mm[2] - lesion.center_lps_mm[2]) >= _SAME_LESION_Z * long:
        return False
    if not axes or long <= 0 or short <= 0:
        return math.hypot(dx, dy) < 0.5 * short
    (a, b) = axes[0]
    ux, uy = b[0] - a[0], b[1] - a[1]
    norm = math.hypot(ux, uy)
    if norm == 0:
        return math.hypot(dx, dy) < 0.5 * short
    ux, uy = ux / norm, uy / norm
    along, across = dx * ux + dy * uy, -dx * uy + dy * ux
    return (along / (0.5 * long)) ** 2 + (across / (0.5 * short)) ** 2 < 1.0


def consolidate(
    findings: Sequence[GroupedFinding],
    outcomes: Sequence[MeasureOutcome],
    examined_planes: int,
    centre_hu: Sequence[float] | None = None,
    vessel_min_hu: float = VESSEL_MIN_HU,
    axes: Sequence[Sequence[Segment3] | None] | None = None,
    tubes: Sequence[bool] | None = None,
) -> list[int]:
    """Indices (increasing) of the findings to report; ``outcomes`` are their measurements,
    ``examined_planes`` how many planes the find step examined, ``centre_hu`` the median HU at
    each finding's centre (None: not used), ``axes`` each finding's measured axes in LPS (long
    axis first; None: the disk of the short axis stands in for a lesion's cross-section),
    ``tubes`` whether each finding's centre is a contrast-filled tube through the study
    (:func:`is_tube`; given, a lesion inside a vessel is a piece of it exactly when either
    centre is a tube)."""
    if len(findings) != len(outcomes):
        raise ValueError(f"{len(findings)} findings but {len(outcomes)} outcomes")
    if axes is not None and len(axes) != len(findings):
        raise ValueError(f"{len(findings)} findings but {len(axes)} axes")
    _check_hu(findings, centre_hu, tubes)
    vessels = [i for i, f in enumerate(findings) if f.kind is FindingKind.VESSEL]
    vessels.sort(key=lambda i: -len(findings[i].planes))  # stable: ties keep their order
    kept: list[int] = []
    for i in vessels:
        diameter = _value(findings[i], outcomes[i], 0)
        if not any(
            _one_vessel(findings[i], findings[k], diameter, _value(findings[k], outcomes[k], 0))
            for k in kept
        ):
            kept.append(i)
    lesions = []
    for i, f in enumerate(findings):
        if f.kind is not FindingKind.LESION:
            continue
        contrast_filled = centre_hu is not None and centre_hu[i] >= vessel_min_hu
        if any(
            _axial(f, findings[k]) < 0.5 * _value(findings[k], outcomes[k], 0)
            and (
                tubes[i] or tubes[k]
                if tubes is not None
                else contrast_filled or _runs_through(len(findings[k].planes), examined_planes)
            )
            for k in kept
        ):
            continue  # inside a vessel that runs through the study: a piece of it
        lesions.append(i)
    lesions.sort(key=lambda i: -_value(findings[i], outcomes[i], 0))
    kept_lesions: list[int] = []
    for i in lesions:
        inside = any(
            _inside_lesion(findings[i], findings[k], outcomes[k], None if axes is None else axes[k])
            for k in kept_lesions
        )
        if not inside:
            kept_lesions.append(i)
    return sorted(kept + kept_lesions)


def short_vessels_as_lesions(
    findings: Sequence[GroupedFinding],
    examined_planes: int,
    centre_hu: Sequence[float] | None = None,
    vessel_min_hu: float = VESSEL_MIN_HU,
    tubes: Sequence[bool] | None = None,
) -> list[GroupedFinding]:
    """``findings`` with every vessel relabelled a lesion that is not seen on at least half of
    the examined planes, counting all vessel pieces at its axial position (centres closer than
    ``max(5 mm, half the larger box side)``), and whose ``centre_hu`` (the median HU at its
    centre, one per finding; None: not checked) is below ``vessel_min_hu`` (module doc). With
    ``tubes`` (one per finding, :func:`is_tube`), a vessel is relabelled exactly when its
    centre is no tube. Order and everything else are kept."""
    _check_hu(findings, centre_hu, tubes)
    if tubes is not None:
        return [
            dataclasses.replace(f, kind=FindingKind.LESION)
            if f.kind is FindingKind.VESSEL and not tube
            else f
            for f, tube in zip(findings, tubes, strict=True)
        ]
    vessels = [f for f in findings if f.kind is FindingKind.VESSEL]
    out = []
    for i, finding in enumerate(findings):
        if finding.kind is FindingKind.VESSEL and (
            centre_hu is None or centre_hu[i] < vessel_min_hu
        ):
            pieces = [v for v in vessels if _one_vessel(finding, v, finding.size_mm, v.size_mm)]
            seen = {plane for piece in pieces for plane in piece.planes}
            if not _runs_through(len(seen), examined_planes):
                finding = dataclasses.replace(finding, kind=FindingKind.LESION)
        out.append(finding)
    return out


def long_lesions_as_vessels(
    findings: Sequence[GroupedFinding],
    examined_planes: int,
    plane_spacing_mm: float,
    centre_hu: Sequence[float],
    vessel_min_hu: float = VESSEL_MIN_HU,
) -> list[GroupedFinding]:
    """``findings`` with every "lesion" relabelled a vessel that runs through the study (seen
    on at least half of the examined planes), spans along z more than one and a half times
    its largest box side (a lesion's cranio-caudal extent is at most its long axis: this is a
    tube), and whose centre is contrast-filled (``centre_hu`` at least ``vessel_min_hu``).
    Order and everything else are kept."""
    _check_hu(findings, centre_hu)
    out = []
    for finding, hu in zip(findings, centre_hu, strict=True):
        if (
            finding.kind is FindingKind.LESION
            and hu >= vessel_min_hu
            and _runs_through(len(finding.planes), examined_planes)
            and (finding.planes[-1] - finding.planes[0] + 1) * plane_spacing_mm
            > 1.5 * finding.size_mm
        ):
            finding = dataclasses.replace(finding, kind=FindingKind.VESSEL)
        out.append(finding)
    return out


def centred_in_air(centre_hu: Sequence[float], air_max_hu: float = AIR_MAX_HU) -> list[bool]:
    """For each finding, whether its centre is air (median below ``air_max_hu``): outside the
    body, where no lesion or vessel of a CT lies; the pipeline drops those."""
    return [hu < air_max_hu for hu in centre_hu]
