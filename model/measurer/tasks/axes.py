"""The axes task: where a finding's measured axes lie on its crop (for overlays and DICOM SR).

The measure task says how long the axes are; this task says where they are, on the same crop:

==========  ============================  ===================================================
kind        prompt                        answer
==========  ============================  ===================================================
lesion      ``find the axis of the        ``long axis [r0, c0, r1, c1] ; short axis [r0, c0,
            lesion``                      r1, c1] ; end``
vessel      ``find the axis of the        ``diameter [r0, c0, r1, c1] ; end`` (a horizontal
            vessel``                      diameter through the centre of the cross-section)
==========  ============================  ===================================================

A segment is two end points ``(row, column)`` in pixels of the crop, as edges (pixel ``i``
covers ``[i, i + 1)``, like find boxes), the end point with the smaller column first (then the
smaller row). Numbers are written on the 0.1 grid; in RNED mode each is one ``[NUM]``.
:func:`parse_axes` never raises on model output and reports malformed answers with the reason.

Truth (training): a lesion's long axis is its ellipse's major axis through the centre at
``rotation_deg`` (from +x towards +y), the short axis the minor axis; a vessel's diameter runs
along +x through the centre of its cross-section (:func:`truth_segments`, in LPS mm).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from model.measurer.results import FindingKind
from model.numeric.text import format_box, parse_values

if TYPE_CHECKING:
    from ingestion.dataset.format import TrueFinding

__all__ = [
    "AXIS_NAMES",
    "ParsedAxes",
    "Segment",
    "axes_answer",
    "axes_prompt",
    "canonical_segment",
    "finding_axes",
    "parse_axes",
    "segments_to_pixels",
    "truth_segments",
]

Point = tuple[float, float]
Vector3 = tuple[float, float, float]
Segment = tuple[Point, Point]
"""Two end points (row, column) in crop pixels; or, in LPS, two (x, y, z) points."""

AXIS_NAMES: dict[FindingKind, tuple[str, ...]] = {
    FindingKind.LESION: ("long axis", "short axis"),
    FindingKind.VESSEL: ("diameter",),
}
_END = "end"
_MAX = 3000.0


@dataclass(frozen=True, slots=True)
class ParsedAxes:
    """What :func:`parse_axes` read; ``segments`` only on success."""

    segments: tuple[Segment, ...]
    success: bool
    reason: str | None = None


def axes_prompt(kind: FindingKind | str) -> str:
    return f"find the axis of the {FindingKind(kind).value}"


def canonical_segment(segment: Segment) -> Segment:
    """The end point with the smaller column first (then the smaller row)."""
    a, b = segment
    return (a, b) if (a[1], a[0]) <= (b[1], b[0]) else (b, a)


def axes_answer(kind: FindingKind | str, segments: Sequence[Segment]) -> str:
    """The answer for ``segments`` (crop pixels, edges); raises ``ValueError`` for a wrong
    count, a negative or non-finite coordinate, or a coordinate above 3000."""
    checked = FindingKind(kind)
    names = AXIS_NAMES[checked]
    if len(segments) != len(names):
        raise ValueError(f"a {checked.value} has {len(names)} axes, got {len(segments)}")
    items = []
    for name, segment in zip(names, segments, strict=True):
        (r0, c0), (r1, c1) = canonical_segment(segment)
        values = (r0, c0, r1, c1)
        if not all(math.isfinite(v) and 0 <= v <= _MAX for v in values):
            raise ValueError(f"{name} end points {values} must be finite pixels in [0, {_MAX:g}]")
        items.append(f"{name} {format_box(values, num_tokens=False, hi=_MAX).text}")
    return " ; ".join([*items, _END])


def parse_axes(text: str, kind: FindingKind | str) -> ParsedAxes:
    """Read an axes answer for a finding of ``kind``; never raises on ``text``."""
    checked = FindingKind(kind)
    names = AXIS_NAMES[checked]
    body = re.sub(r"(?:\s*<\|[a-z_]+\|>)+\s*$", "", text).strip()
    items = [item.strip() for item in body.split(";")]
    if not items or items[-1].lower() != _END:
        return ParsedAxes((), False, f"no 'end' after the axes: {body[:60]!r}")
    items = items[:-1]
    if len(items) != len(names):
        return ParsedAxes((), False, f"found {len(items)} axes, expected {len(names)} ({names})")
    segments = []
    for name, item in zip(names, items, strict=True):
        if not item.lower().startswith(name):
            return ParsedAxes((), False, f"expected {name!r}, got {item[:40]!r}")
        parsed = parse_values(item[len(name) :], 4, hi=_MAX)
        if not parsed.success:
            return ParsedAxes((), False, f"{name}: {parsed.reason}")
        r0, c0, r1, c1 = parsed.values
        segments.append(((r0, c0), (r1, c1)))
    return ParsedAxes(tuple(segments), True)


def truth_segments(
    kind: str,
    center_lps_mm: Sequence[float],
    *,
    long_axis_mm: float | None = None,
    short_axis_mm: float | None = None,
    rotation_deg: float | None = None,
    diameter_mm: float | None = None,
) -> tuple[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]], ...]:
    """The true axes of a finding as LPS end-point pairs (module doc)."""
    c = np.asarray(center_lps_mm, dtype=np.float64)
    if kind == "vessel":
        if diameter_mm is None:
            raise ValueError("a vessel needs diameter_mm")
        half = np.array([diameter_mm / 2, 0.0, 0.0])
        return ((c - half, c + half),)
    if long_axis_mm is None or short_axis_mm is None or rotation_deg is None:
        raise ValueError("a lesion needs long_axis_mm, short_axis_mm and rotation_deg")
    theta = math.radians(rotation_deg)
    along = np.array([math.cos(theta), math.sin(theta), 0.0])
    across = np.array([-math.sin(theta), math.cos(theta), 0.0])
    long_half, short_half = along * long_axis_mm / 2, across * short_axis_mm / 2
    return ((c - long_half, c + long_half), (c - short_half, c + short_half))


def finding_axes(finding: TrueFinding) -> tuple[tuple[Vector3, Vector3], ...]:
    """The true axes of a finding as LPS tuples: a dataset row's own end points where it has
    them (a real lesion's short axis need not cross its long axis' midpoint), else the
    ellipse's (:func:`truth_segments`)."""
    from ingestion.dataset.format import DatasetFinding

    if isinstance(finding, DatasetFinding):
        own = (
            (finding.long_axis_lps_mm, finding.short_axis_lps_mm)
            if finding.kind == "lesion"
            else (finding.diameter_lps_mm,)
        )
        if all(segment is not None for segment in own):
            return tuple(segment for segment in own if segment is not None)
    pairs = truth_segments(
        finding.kind,
        finding.center_lps_mm,
        long_axis_mm=finding.long_axis_mm,
        short_axis_mm=finding.short_axis_mm,
        rotation_deg=finding.rotation_deg,
        diameter_mm=finding.diameter_mm,
    )
    return tuple((_vector(a), _vector(b)) for a, b in pairs)


def _vector(point: npt.NDArray[np.float64]) -> Vector3:
    return (float(point[0]), float(point[1]), float(point[2]))


def segments_to_pixels(
    segments_lps: Sequence[tuple[npt.ArrayLike, npt.ArrayLike]], lps_to_index: object
) -> tuple[Segment, ...]:
    """LPS end points -> (row, column) crop pixel edges through a crop's ``lps_to_pixel``
    (index coordinates; + 0.5 makes them edges)."""
    convert = lps_to_index  # a callable (..., 3) -> (..., 3) (frame, row, column)
    out = []
    for a, b in segments_lps:
        pa, pb = convert(np.asarray(a)), convert(np.asarray(b))  # type: ignore[operator]
        out.append(
            (
                (float(pa[1]) + 0.5, float(pa[2]) + 0.5),
                (float(pb[1]) + 0.5, float(pb[2]) + 0.5),
            )
        )
    return tuple(out)
