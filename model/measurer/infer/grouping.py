"""From per-plane find answers to findings in 3-D.

The find step answers one prompt per prepared axial plane with boxes
(``model.measurer.inputs.find``). A lesion shows on several neighbouring planes and a vessel on all
of them, so boxes of the same
kind on nearby planes whose centres lie close together in the axial plane are one finding:

- link two boxes of the same kind on planes at most :attr:`GroupingRule.max_plane_gap` apart
  whose centres are within ``max(min_link_mm, link_fraction * the smaller box side)`` in-plane;
- every connected group becomes one finding. Its centre in the axial plane is the mean of the box
  centres weighted by box area, and along z the same weighted mean of the planes' z (a lesion's
  cross-section is largest at its centre, symmetric about it); a vessel's z is its middle plane.
- A lesion group seen on far fewer planes than a lesion of its size must cover
  (:attr:`GroupingRule.min_plane_fraction` of ``(0.4 * long side + slice spacing) /
  plane spacing``, the least visible extent the phantom spec allows) is dropped as noise.

After re-centring (``model.measurer.infer.pipeline``), two findings of the same kind whose centres
nearly coincide in the axial plane and whose z lie within half the larger one's size (plus two
plane spacings) are one finding split along z (a gap of missed planes): :func:`merge_duplicates`
keeps the one with the larger box, whose plane is nearer the finding's widest cross-section.

Pure NumPy; coordinates are LPS mm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ingestion.geometry import Geometry
from model.measurer.results import FindingKind
from model.measurer.tasks.text import FoundFinding

__all__ = [
    "Detection",
    "GroupedFinding",
    "GroupingRule",
    "group_detections",
    "merge_duplicates",
    "merge_groups",
    "plane_detections",
]


@dataclass(frozen=True)
class Detection:
    """One box of one plane, in patient space."""

    kind: FindingKind
    plane: int  # ordinal among the examined planes (consecutive examined planes differ by 1)
    center_lps_mm: tuple[float, float, float]
    size_mm: tuple[float, float]  # box (rows, columns) extent in mm

    @property
    def area(self) -> float:
        return self.size_mm[0] * self.size_mm[1]


@dataclass(frozen=True)
class GroupedFinding:
    """A finding assembled from the detections of several planes."""

    kind: FindingKind
    center_lps_mm: tuple[float, float, float]
    planes: tuple[int, ...]  # ordinals of the examined planes it was seen on, increasing
    size_mm: float  # the largest box side seen


@dataclass(frozen=True)
class GroupingRule:
    """How boxes are joined (module doc)."""

    max_plane_gap: int = 2
    min_link_mm: float = 5.0
    link_fraction: float = 0.5
    min_plane_fraction: float = 0.3
    duplicate_fraction: float = 0.25  # merge_duplicates: in-plane reach as a fraction of size


def plane_detections(
    answers: Sequence[Sequence[FoundFinding]], planes: Sequence[int], geometry: Geometry
) -> list[Detection]:
    """Boxes of the find answers of the examined ``planes`` (prepared plane indices,
    increasing) -> detections in LPS, numbered by ordinal among the examined planes.

    Box coordinates are pixel edges (pixel ``i`` covers ``[i, i + 1)``), so the centre index is
    the box middle minus 0.5.
    """
    out = []
    pixel_rows, pixel_columns = geometry.row_spacing, geometry.column_spacing
    for ordinal, (plane, found) in enumerate(zip(planes, answers, strict=True)):
        for finding in found:
            row0, col0, row1, col1 = finding.box
            index = np.array([plane, (row0 + row1) / 2 - 0.5, (col0 + col1) / 2 - 0.5])
            x, y, z = (float(v) for v in geometry.index_to_lps(index))
            size = ((row1 - row0) * pixel_rows, (col1 - col0) * pixel_columns)
            out.append(Detection(finding.kind, ordinal, (x, y, z), size))
    return out


def group_detections(
    detections: Sequence[Detection], plane_spacing_mm: float, rule: GroupingRule | None = None
) -> list[GroupedFinding]:
    """Join detections into findings (module doc), ordered by kind (lesions first), then z.

    ``plane_spacing_mm``: distance between consecutive examined planes.
    """
    rule = rule or GroupingRule()
    parent = list(range(len(detections)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(detections):
        for j in range(i + 1, len(detections)):
            b = detections[j]
            gap = abs(a.plane - b.plane)
            if a.kind is not b.kind or gap == 0 or gap > rule.max_plane_gap:
                continue
            reach = max(rule.min_link_mm, rule.link_fraction * min(*a.size_mm, *b.size_mm))
            dx = a.center_lps_mm[0] - b.center_lps_mm[0]
            dy = a.center_lps_mm[1] - b.center_lps_mm[1]
            if np.hypot(dx, dy) <= reach:
                parent[root(i)] = root(j)

    groups: dict[int, list[Detection]] = {}
    for i, detection in enumerate(detections):
        groups.setdefault(root(i), []).append(detection)
    out = []
    for members in groups.values():
        finding = _assemble(members)
        if finding.kind is FindingKind.LESION and not _enough_planes(
            finding, plane_spacing_mm, rule
        ):
            continue
        out.append(finding)
    out.sort(key=lambda f: (f.kind is not FindingKind.LESION, f.center_lps_mm[2]))
    return out


def _assemble(members: Sequence[Detection]) -> GroupedFinding:
    kind = members[0].kind
    centers = np.array([m.center_lps_mm for m in members])  # (n, 3)
    weights = np.array([max(m.area, 1e-6) for m in members])
    x, y, z = (float(v) for v in (weights[:, None] * centers).sum(axis=0) / weights.sum())
    planes = tuple(sorted({m.plane for m in members}))
    if kind is FindingKind.VESSEL:
        middle = planes[len(planes) // 2]
        z = float(np.mean([m.center_lps_mm[2] for m in members if m.plane == middle]))
    size = max(max(m.size_mm) for m in members)
    return GroupedFinding(kind, (x, y, z), planes, size)


def _enough_planes(finding: GroupedFinding, plane_spacing_mm: float, rule: GroupingRule) -> bool:
    """A lesion of long side L spans at least 0.4 L + one slice (cc extent >= L/2, labelled
    where its cross-section is >= 60 % of the central one); demand a fraction of that."""
    expected = (0.4 * finding.size_mm + plane_spacing_mm) / plane_spacing_mm
    return len(finding.planes) >= rule.min_plane_fraction * expected


def merge_duplicates(
    findings: Sequence[GroupedFinding], plane_spacing_mm: float, rule: GroupingRule | None = None
) -> list[GroupedFinding]:
    """Merge findings of one kind split along z (module doc), ordered as
    :func:`group_detections` orders them; the kept finding's planes become the union of both.

    ``plane_spacing_mm``: distance between consecutive examined planes.
    """
    return [finding for finding, _ in merge_groups(findings, plane_spacing_mm, rule)]


def merge_groups(
    findings: Sequence[GroupedFinding], plane_spacing_mm: float, rule: GroupingRule | None = None
) -> list[tuple[GroupedFinding, tuple[int, ...]]]:
    """:func:`merge_duplicates` with, for each merged finding, the indices into ``findings``
    of the findings it is made of (ascending)."""
    rule = rule or GroupingRule()
    kept: list[GroupedFinding] = []
    members: list[list[int]] = []
    order = sorted(
        range(len(findings)), key=lambda i: (-findings[i].size_mm, -len(findings[i].planes))
    )
    for index in order:
        finding = findings[index]
        for k, other in enumerate(kept):
            if other.kind is not finding.kind:
                continue
            reach = max(
                rule.min_link_mm, rule.duplicate_fraction * min(other.size_mm, finding.size_mm)
            )
            dx = other.center_lps_mm[0] - finding.center_lps_mm[0]
            dy = other.center_lps_mm[1] - finding.center_lps_mm[1]
            dz = abs(other.center_lps_mm[2] - finding.center_lps_mm[2])
            if np.hypot(dx, dy) <= reach and dz <= other.size_mm / 2 + 2 * plane_spacing_mm:
                planes = tuple(sorted(set(other.planes) | set(finding.planes)))
                kept[k] = GroupedFinding(other.kind, other.center_lps_mm, planes, other.size_mm)
                members[k].append(index)
                break
        else:
            kept.append(finding)
            members.append([index])
    merged = sorted(
        zip(kept, members, strict=True),
        key=lambda pair: (pair[0].kind is not FindingKind.LESION, pair[0].center_lps_mm[2]),
    )
    return [(finding, tuple(sorted(indices))) for finding, indices in merged]
