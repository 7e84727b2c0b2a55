"""Order the image planes of one series and derive the volume geometry from them.

Rules (documented in README "Ingestion rules"):

- Slices are ordered by ImagePositionPatient projected on the image normal (row x column
  direction), ascending; file names and InstanceNumber are never used.
- Slice spacing is the distance between consecutive slice positions. Every gap must equal the
  median gap within ``max(0.01 mm, 1 %)``; positions must lie on one line within the same tolerance.
- Two slices at the same position (within 0.001 mm) reject the series, naming both files.
- A gap that is a whole multiple (>= 2) of the median gap is a *missing slice*: the series is
  rejected, naming the files on both sides of the gap, because measuring across a hole would
  silently distort every length that crosses it. Any other uneven gap rejects the series too.
- A slice axis that is not perpendicular to the image plane (gantry tilt) is kept exactly (the
  geometry is sheared) and reported as a warning. The tilt's size comes from the positions; its
  sign is the GantryDetectorTilt tag's (vendors differ in which way is positive, so no sign is
  made up when the tag is absent or 0; the warning says so). A tag whose size disagrees with
  the positions by more than 0.5 degrees is named in the warning.
- A single-slice series takes its slice spacing from SpacingBetweenSlices or SliceThickness, and
  is rejected if neither is present (naming a value that is there but not > 0).
- A series that does not stack as a whole (repeated positions, uneven gaps) but whose planes fall
  into stacks that each do, told apart by their stack key (``ingestion.dicom._header_values``:
  e.g. two slice thicknesses, magnitude and field map frames, time points), is split into those
  stacks, each with a note naming what tells them apart; each must have at least two planes (four
  acquisitions at one position are not four stacks). Otherwise the series is rejected.
- Header values that contradict themselves or the positions without being needed are named
  (tag and value) in a warning and not used: a SliceThickness or SpacingBetweenSlices that is
  not a number > 0, a SpacingBetweenSlices that differs from the distance between the planes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ingestion.dicom.header import SeriesInfo, SliceRef
from ingestion.errors import InconsistentGeometryError, MissingGeometryError
from ingestion.geometry import Geometry
from ingestion.volume import stack_key

__all__ = [
    "GAP_TOLERANCE_FRACTION",
    "GAP_TOLERANCE_MM",
    "SeriesRef",
    "build_stack",
    "split_by_stack_key",
]

GAP_TOLERANCE_MM = 0.01
GAP_TOLERANCE_FRACTION = 0.01
DUPLICATE_POSITION_MM = 1e-3
_TILT_WARNING_DEGREES = 0.01
_TILT_TAG_TOLERANCE_DEGREES = 0.5


@dataclass(frozen=True)
class SeriesRef:
    """One loadable stack: a series (or part of a split series) with its slices in order."""

    info: SeriesInfo
    slices: tuple[SliceRef, ...]
    geometry: Geometry
    part: int | None = None  # 1-based part number when one SeriesInstanceUID was split
    warnings: tuple[str, ...] = ()
    # the tilt (size from the positions) with the sign of the GantryDetectorTilt tag; None when
    # there is no tilt or no non-zero tag to take the sign from (geometry.tilt_degrees: the size)
    gantry_tilt_degrees: float | None = None

    @property
    def label(self) -> str:
        uid = self.info.series_instance_uid
        return uid if self.part is None else f"{uid} (part {self.part})"

    @property
    def series_key(self) -> str:
        """The key of the volume it loads (``Identifiers.series_key``): the UID, or for a part
        of a split series its :func:`~ingestion.volume.stack_key`."""
        uid = self.info.series_instance_uid
        if self.part is None:
            return uid
        return stack_key(
            uid,
            [s.sop_instance_uid for s in self.slices],
            [None if s.frame is None else s.frame + 1 for s in self.slices],
        )


def _where(ref: SliceRef) -> str:
    return str(ref.path) if ref.frame is None else f"{ref.path} frame {ref.frame + 1}"


def _signed_tilt(tilt: float, tag: float | None) -> tuple[float | None, str]:
    """``tilt`` (degrees, from the positions) signed as the GantryDetectorTilt ``tag``, and
    where the sign came from (module doc)."""
    if tag is None:
        return None, "no GantryDetectorTilt tag: its sign is not known"
    if tag == 0:
        return None, "GantryDetectorTilt says 0: its sign is not known"
    said = f"sign of GantryDetectorTilt {tag:g}"
    if abs(abs(tag) - tilt) > _TILT_TAG_TOLERANCE_DEGREES:
        said += f", which disagrees with the {tilt:.2f} degrees of the positions"
    return math.copysign(tilt, tag), said


def _stated_spacing_contradictions(
    ordered: Sequence[SliceRef], plane_mm: float, step_mm: float, tol: float
) -> list[str]:
    """A warning for each SpacingBetweenSlices that is neither the distance between the planes
    nor the step from one slice position to the next (they differ under gantry tilt)."""
    stated = {s.spacing_between_slices for s in ordered if s.spacing_between_slices is not None}
    return [
        f"SpacingBetweenSlices is {value:g} mm but the slices are {step_mm:.4g} mm apart "
        f"({plane_mm:.4g} mm between planes); the positions are used"
        for value in sorted(stated)
        if min(abs(value - step_mm), abs(value - plane_mm)) > tol
    ]


def build_stack(info: SeriesInfo, slices: Sequence[SliceRef]) -> SeriesRef:
    """Sort ``slices`` (same size, orientation and pixel spacing) into a :class:`SeriesRef`.

    Raises:
        InconsistentGeometryError: duplicated positions, missing slices, uneven gaps.
        MissingGeometryError: a single slice with no stated thickness.
    """
    if not slices:
        raise ValueError("build_stack needs at least one slice")
    first = slices[0]
    name = info.series_instance_uid
    normal = np.asarray(first.normal)
    normal = normal / np.linalg.norm(normal)
    problems = tuple(dict.fromkeys(p for s in slices for p in s.header_problems))
    warnings = [*info.text_warnings, *(f"{p}: ignored" for p in problems)]
    if len(slices) == 1:
        if first.nominal_thickness is None:
            stated = "; ".join(problems) or "neither SpacingBetweenSlices nor SliceThickness"
            raise MissingGeometryError(
                f"{first.path}: single-slice series {name}: {stated}; its slice spacing is unknown"
            )
        geometry = Geometry(
            origin=first.position,
            row_direction=first.row_direction,
            column_direction=first.column_direction,
            slice_direction=(float(normal[0]), float(normal[1]), float(normal[2])),
            spacing=(first.nominal_thickness, *first.pixel_spacing),
        )
        warnings.append("single slice: slice spacing taken from the stated slice thickness")
        return SeriesRef(info, tuple(slices), geometry, None, tuple(warnings))

    positions = np.array([s.position for s in slices], dtype=np.float64)  # (N, 3)
    depth = positions @ normal  # (N,)
    order = np.argsort(depth, kind="stable")
    ordered = [slices[i] for i in order]
    positions, depth = positions[order], depth[order]
    gaps = np.diff(depth)  # (N-1,)
    dup = np.flatnonzero(gaps < DUPLICATE_POSITION_MM)
    if dup.size:
        i = int(dup[0])
        raise InconsistentGeometryError(
            f"series {name}: duplicated slice position ({depth[i]:.3f} mm along the normal) in "
            f"{_where(ordered[i])} and {_where(ordered[i + 1])}; keep one of them (or split "
            "echoes/phases into their own series)"
        )
    step_mm = float(np.median(gaps))
    tol = max(GAP_TOLERANCE_MM, GAP_TOLERANCE_FRACTION * step_mm)
    bad = np.flatnonzero(np.abs(gaps - step_mm) > tol)
    if bad.size:
        i = int(bad[0])
        ratio = gaps[i] / step_mm
        where = f"between {_where(ordered[i])} and {_where(ordered[i + 1])}"
        if ratio >= 1.5 and abs(ratio - round(ratio)) * step_mm <= tol:
            missing = round(ratio) - 1
            raise InconsistentGeometryError(
                f"series {name}: {missing} missing slice(s): a gap of {gaps[i]:.3f} mm {where} "
                f"where the series steps {step_mm:.3f} mm; re-export the complete series"
            )
        raise InconsistentGeometryError(
            f"series {name}: non-uniform slice gaps: {gaps[i]:.3f} mm {where}, the series "
            f"otherwise steps {step_mm:.3f} mm (tolerance {tol:.3f} mm)"
        )
    n = len(ordered)
    step = (positions[-1] - positions[0]) / (n - 1)  # (3,) mean step vector
    expected = positions[0] + np.arange(n)[:, None] * step  # (N, 3)
    off_line = np.linalg.norm(positions - expected, axis=1)
    if float(off_line.max()) > tol:
        i = int(np.argmax(off_line))
        raise InconsistentGeometryError(
            f"series {name}: slice positions do not lie on one line ({_where(ordered[i])} is "
            f"{off_line[i]:.3f} mm off); the series mixes stacks"
        )
    spacing = float(np.linalg.norm(step))
    warnings += _stated_spacing_contradictions(ordered, step_mm, spacing, tol)
    direction = step / spacing
    tilt = math.degrees(math.acos(min(1.0, abs(float(direction @ normal)))))
    signed = None
    if tilt > _TILT_WARNING_DEGREES:
        tags = [s.gantry_tilt for s in ordered if s.gantry_tilt is not None]
        signed, said = _signed_tilt(tilt, next((t for t in tags if t), tags[0] if tags else None))
        warnings.append(
            f"gantry tilt of {signed if signed is not None else tilt:.2f} degrees ({said}): "
            "slices are sheared; geometry kept exact"
        )
    geometry = Geometry(
        origin=(float(positions[0, 0]), float(positions[0, 1]), float(positions[0, 2])),
        row_direction=first.row_direction,
        column_direction=first.column_direction,
        slice_direction=(float(direction[0]), float(direction[1]), float(direction[2])),
        spacing=(spacing, *first.pixel_spacing),
    )
    return SeriesRef(info, tuple(ordered), geometry, None, tuple(warnings), signed)


def split_by_stack_key(slices: Sequence[SliceRef]) -> list[tuple[list[SliceRef], str]] | None:
    """The planes of a series that did not stack as a whole, grouped by their stack key: each
    group with what tells it apart (``"FrameType M"``), or None when the key does not split
    them into groups of at least two planes (module doc)."""
    groups: dict[tuple[tuple[str, str], ...], list[SliceRef]] = {}
    for ref in slices:
        groups.setdefault(ref.stack_key, []).append(ref)
    if len(groups) < 2 or min(len(g) for g in groups.values()) < 2:
        return None
    keys = list(groups)
    differing = [
        i for i in range(len(keys[0])) if len({k[i] if i < len(k) else None for k in keys}) > 1
    ]
    return [
        (group, ", ".join(f"{key[i][0]} {key[i][1] or '(none)'}" for i in differing))
        for key, group in groups.items()
    ]
