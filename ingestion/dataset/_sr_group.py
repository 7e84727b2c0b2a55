"""One TID 1500 measurement group read (``sr``): which of its measurements make a lesion or a
vessel, their values in mm, their end points in LPS and the image they lie on, and the finding's
position. The rules are ``sr``'s (its module doc: Measurements, Coordinates, Position, Values,
Review); every reason a group cannot be used is an :class:`UnusableError` whose message is the
Skipped line's reason.

Also the small readers of SR content items that the document level uses too (children of a
content item, concept names, TEXT values, radcaliper's review statuses). Kept apart from
``sr`` so that each module holds one stage: here a group, there a document and its rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from ingestion.dataset._dicom_import import (
    ImageIndex,
    SliceAt,
    UnusableError,
    code_meaning,
    code_value,
    image_points_to_lps,
    is_vessel_code,
    nearest_slice,
)
from ingestion.dataset.format import KindName

if TYPE_CHECKING:
    from pydicom import Dataset

__all__ = [
    "Axis",
    "GroupRead",
    "ReadContext",
    "ValueLimits",
    "children",
    "concept_name",
    "read_group",
    "review_statuses",
    "text_of",
]

logger = logging.getLogger(__name__)

Points = npt.NDArray[np.float64]  # (2, 3) LPS mm

_LENGTH_UNITS = {"mm": 1.0, "um": 1e-3, "cm": 10.0, "m": 1000.0}  # UCUM -> mm
_REVIEW_SCHEME = "99RADCAL"  # app.sr's private scheme of review statuses


@dataclass(frozen=True)
class Axis:
    """One measurement of the group: its value and, where it has them, its end points."""

    name: str  # long_axis | short_axis | diameter
    value_mm: float
    points: Points | None  # end points, LPS mm
    at: SliceAt | None  # the image the points are on (SCOORD) or the slice nearest (SCOORD3D)


def _codes() -> dict[str, Any]:
    from pydicom.sr.codedict import codes

    return {
        "long_axis": codes.SCT.LongAxis,
        "short_axis": codes.SCT.ShortAxis,
        "diameter": codes.SCT.Diameter,
    }


def children(item: Dataset, value_type: str | None = None) -> Iterator[Dataset]:
    """The content items under ``item`` (of ``value_type`` only, when given)."""
    for child in item.get("ContentSequence", []):
        if value_type is None or child.ValueType == value_type:
            yield child


def concept_name(item: Dataset) -> Any:
    """A content item's concept name, as a pydicom ``Code`` (compares SRT with SCT codes)."""
    from highdicom.sr.utils import get_coded_name

    return get_coded_name(item)


def text_of(group: Dataset, value: str) -> str | None:
    """The TEXT child of ``group`` whose concept code value is ``value`` (DCM), if any."""
    for child in children(group, "TEXT"):
        name = child.ConceptNameCodeSequence[0]
        if code_value(name) == value and name.CodingSchemeDesignator == "DCM":
            return str(child.TextValue)
    return None


def review_statuses(group: Dataset) -> dict[str, str]:
    """radcaliper's review status of each measurement name (``app.sr``), e.g.
    {"long_axis": "corrected"}."""
    out = {}
    for child in children(group, "CODE"):
        name, value = child.ConceptNameCodeSequence[0], child.ConceptCodeSequence[0]
        if name.CodingSchemeDesignator == _REVIEW_SCHEME and code_value(name).startswith("review-"):
            out[code_value(name).removeprefix("review-")] = code_value(value)
    return out


def _value_mm(item: Dataset) -> float:
    measured = item.get("MeasuredValueSequence") or []
    if not measured:
        qualifier = item.get("NumericValueQualifierCodeSequence") or []
        why = f" ({qualifier[0].CodeMeaning})" if qualifier else ""
        raise UnusableError(f"{code_meaning(concept_name(item))} has no value{why}")
    value = measured[0]
    number = value.get("FloatingPointValue")
    number = float(value.NumericValue if number is None else number)
    unit = value.MeasurementUnitsCodeSequence[0]
    scale = _LENGTH_UNITS.get(code_value(unit)) if unit.CodingSchemeDesignator == "UCUM" else None
    if scale is None:
        scheme = unit.CodingSchemeDesignator
        raise UnusableError(
            f"{code_meaning(concept_name(item))} is in {code_value(unit)} ({scheme}), not a length"
        )
    if not math.isfinite(number) or number <= 0:
        raise UnusableError(f"{code_meaning(concept_name(item))} is {number:g}: not a length > 0")
    return number * scale


def _referenced(item: Dataset, index: ImageIndex) -> SliceAt:
    """The image a SCOORD item is SELECTED FROM."""
    images = list(children(item, "IMAGE"))
    if not images:
        raise UnusableError("2-D coordinates name no image")
    sop = images[0].ReferencedSOPSequence[0]
    frames = sop.get("ReferencedFrameNumber")
    if frames is not None and not isinstance(frames, str | int):
        frames = frames[0]  # several values: a SCOORD lies on one frame, the first named
    frame = None if frames is None else int(frames)
    uid = str(sop.ReferencedSOPInstanceUID)
    at = index.image(uid, frame)
    if at is None:
        raise UnusableError(
            f"coordinates reference images not in the dataset (SOP Instance UID {uid} is not "
            f"under {index.root})"
        )
    return at


class ValueLimits(Protocol):
    """Which values are plausible: ``db.review.CorrectionLimits`` (the limits a reviewer's
    correction must keep, the settings' ``RADCALIPER_MAX_*_MM``) is one."""

    def problem(self, name: str, value_mm: float | None, /) -> str | None:
        """Why ``value_mm`` is not a plausible value of measurement ``name``, or None."""
        ...


@dataclass(frozen=True)
class ReadContext:
    """What a group is read against: the images, the series the document names and the
    plausible values."""

    index: ImageIndex
    evidence: frozenset[str]  # series UIDs the document's evidence lists
    limits: ValueLimits


def _in_space(
    item: Dataset, ctx: ReadContext, group_series: frozenset[str]
) -> tuple[Points, SliceAt]:
    """A SCOORD3D item's points (LPS) and the slice nearest their middle."""
    points = np.asarray(item.GraphicData, dtype=np.float64).reshape(-1, 3)
    frame_uid = str(item.ReferencedFrameOfReferenceUID)
    return points, ctx.index.slice_near(frame_uid, points, (group_series, ctx.evidence))


def _line(item: Dataset, ctx: ReadContext, group_series: frozenset[str]) -> tuple[Points, SliceAt]:
    """A measurement's SCOORD / SCOORD3D coordinates as LPS points and their image."""
    if item.ValueType == "SCOORD3D":
        return _in_space(item, ctx, group_series)
    at = _referenced(item, ctx.index)
    points = np.asarray(item.GraphicData, dtype=np.float64).reshape(-1, 2)
    return image_points_to_lps(points, at), at


def _agrees(name: str, value: float, points: Points, at: SliceAt) -> None:
    """Refuses a value that contradicts its own end points by more than a pixel of the image
    they lie on (the larger pixel spacing: rounding the value, or the end points to pixels,
    stays within it)."""
    length = float(np.linalg.norm(points[-1] - points[0]))
    geometry = at.ref.geometry
    pixel = max(geometry.row_spacing, geometry.column_spacing)
    if not abs(value - length) <= pixel:
        raise UnusableError(
            f"the {name.replace('_', ' ')} is {value:g} mm but its end points are {length:.4g} "
            f"mm apart: the value contradicts its own coordinates by more than a pixel "
            f"({pixel:g} mm)"
        )


def _axis(name: str, item: Dataset, ctx: ReadContext, group_series: frozenset[str]) -> Axis:
    value = _value_mm(item)
    problem = ctx.limits.problem(name, value)
    if problem is not None:
        raise UnusableError(problem)
    for child in children(item):
        if child.ValueType not in ("SCOORD", "SCOORD3D"):
            continue
        if child.GraphicType != "POLYLINE" or len(child.GraphicData) != (
            4 if child.ValueType == "SCOORD" else 6
        ):
            logger.info("%s: coordinates are not a 2-point line; not used", name)
            continue
        points, at = _line(child, ctx, group_series)
        _agrees(name, value, points, at)
        return Axis(name, value, points, at)
    return Axis(name, value, None, None)


def _region(
    group: Dataset, ctx: ReadContext, group_series: frozenset[str]
) -> tuple[Points, SliceAt]:
    """The centre of the group's Image Region (TID 1410), as a 1-point array and its image."""
    from pydicom.sr.codedict import codes

    for child in children(group):
        if (
            child.ValueType not in ("SCOORD", "SCOORD3D")
            or concept_name(child) != codes.DCM.ImageRegion
        ):
            continue
        points, at = _line(child, ctx, group_series)
        kind = str(child.GraphicType)
        if (
            kind in ("POLYGON", "POLYLINE")
            and len(points) > 1
            and np.allclose(points[0], points[-1])
        ):
            points = points[:-1]  # a closed outline repeats its first point
        centre = points[:1] if kind == "CIRCLE" else points.mean(axis=0, keepdims=True)
        if child.ValueType == "SCOORD3D":
            near = nearest_slice(at.ref, centre[0])
            at = near if near is not None else at
        return centre, at
    raise UnusableError("no coordinates give the finding's position (values only)")


def _source_series(group: Dataset, index: ImageIndex) -> frozenset[str]:
    """Series of the images the group names as its source (TID 1501)."""
    out = set()
    for child in children(group, "IMAGE"):
        sop = child.ReferencedSOPSequence[0]
        try:
            at = index.image(str(sop.ReferencedSOPInstanceUID), None)
        except UnusableError:
            at = None
        if at is not None:
            out.add(at.ref.info.series_instance_uid)
    return frozenset(out)


def _kind(group: Dataset, axes: dict[str, Dataset], others: list[str]) -> KindName:
    """lesion or vessel, from what the group measured and its finding type / sites."""
    from pydicom.sr.codedict import codes

    typed = [
        child.ConceptCodeSequence[0]
        for child in children(group, "CODE")
        if concept_name(child) in (codes.DCM.Finding, codes.SCT.FindingSite)
    ]
    vessel = any(is_vessel_code(code) for code in typed)
    what = ", ".join(code_meaning(c) for c in typed) or "none"
    if "diameter" in axes and vessel:
        return "vessel"
    if "long_axis" in axes and "short_axis" in axes:
        if vessel:
            raise UnusableError(
                f"a blood vessel (finding type/site: {what}) measured with long and short axis: "
                "a vessel row needs a diameter"
            )
        return "lesion"
    if "diameter" in axes:
        raise UnusableError(
            f"a diameter of a finding that is not a blood vessel (finding type/site: {what}): "
            "a lesion needs long and short axis"
        )
    if axes:
        (lone,) = axes
        other = "short axis" if lone == "long_axis" else "long axis"
        raise UnusableError(f"{lone.replace('_', ' ')} without {other}")
    if others and {o.lower() for o in others} <= {"area"}:
        raise UnusableError("area only: no long/short axis or diameter measurement")
    held = f" (it holds {', '.join(others)})" if others else " (it holds no measurement)"
    raise UnusableError(f"no long/short axis or diameter measurement{held}")


@dataclass(frozen=True)
class GroupRead:
    """A group read: the finding's geometry and values (before identity and provenance)."""

    kind: KindName
    at: SliceAt
    centre: npt.NDArray[np.float64]
    axes: dict[str, Axis]


def read_group(group: Dataset, ctx: ReadContext) -> GroupRead:
    """The finding a measurement group describes (module doc).

    Raises:
        UnusableError: the group does not make a lesion or vessel row, or its coordinates do
            not place it on a series under the index' folder.
    """
    statuses = review_statuses(group)
    names = _codes()
    found: dict[str, Dataset] = {}
    others: list[str] = []
    for item in children(group, "NUM"):
        name = concept_name(item)
        key = next((k for k, code in names.items() if name == code), None)
        if key is None:
            others.append(code_meaning(name))
        elif statuses.get(key) == "rejected":
            logger.info("%s was rejected by a reviewer; left out", key)
        elif key in found:
            raise UnusableError(f"more than one {key.replace('_', ' ')} measurement")
        else:
            found[key] = item
    kind = _kind(group, found, others)
    used = ("diameter",) if kind == "vessel" else ("long_axis", "short_axis")
    group_series = _source_series(group, ctx.index)
    axes = {k: _axis(k, found[k], ctx, group_series) for k in used}
    series = {a.at.ref.info.series_instance_uid for a in axes.values() if a.at is not None}
    if len(series) > 1:
        raise UnusableError(
            f"its measurements lie on different series ({', '.join(sorted(series))})"
        )
    for axis in axes.values():  # the first axis with coordinates gives the position
        if axis.points is not None and axis.at is not None:
            return GroupRead(kind, axis.at, axis.points.mean(axis=0), axes)
    centre, at = _region(group, ctx, group_series)
    return GroupRead(kind, at, centre[0], axes)
