"""Which series of a study to measure: the batch's selection rules, from cataloged headers.

Per study (README "Batch processing"):

1. Copies of the same image (same SOPInstanceUID in several files) are used once: the first
   path in byte order; the others are skipped as duplicates.
2. A series is not a candidate when its modality is not one of ``modalities`` (default CT),
   when its images are DERIVED or SECONDARY (unless ``include_derived``), when one of its files
   is rejected (the series is incomplete; not for a damaged copy of an image that another file
   holds intact, which is used instead), when a file in one of its folders cannot be read at
   all (permission denied: it may be any of the series' slices), or when it has fewer than
   ``min_slices`` planes.
   Localizers, secondary captures and non-image objects never get this far (the catalog
   skips them).
3. The candidates are ranked: axial first, then the thinnest reconstruction (slice spacing
   from the plane positions), then the most planes, then the lowest series number, then the
   UID. The batch measures the first candidate that loads (or every one with ``all_series``).

Each series that is not a candidate gets a :class:`Note` with the reason.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ingestion.catalog import FileRecord, ImageAttributes
from ingestion.scan import Incompleteness

__all__ = ["Note", "NoteKind", "SelectionRules", "SeriesCandidate", "StudyPlan", "plan_study"]


class NoteKind(enum.StrEnum):
    SKIPPED = "skipped"  # not used, by the rules (duplicates, series not chosen)
    REJECTED = "rejected"  # meant to be used, but unusable (a broken series)


@dataclass(frozen=True)
class Note:
    """A file or series a batch did not use, and why."""

    kind: NoteKind
    path: Path | None
    series_instance_uid: str | None
    reason: str


@dataclass(frozen=True)
class SelectionRules:
    """The series selection rules (module doc); the defaults are the command line's."""

    modalities: tuple[str, ...] = ("CT",)
    min_slices: int = 10
    include_derived: bool = False
    all_series: bool = False

    def __post_init__(self) -> None:
        known = {"CT", "MR"}
        if not self.modalities or not set(self.modalities) <= known:
            raise ValueError(
                f"modalities must be CT and/or MR, got {', '.join(self.modalities) or 'none'}"
            )
        if isinstance(self.min_slices, bool) or not isinstance(self.min_slices, int):
            raise ValueError(f"min_slices must be an integer, got {self.min_slices!r}")
        if self.min_slices < 1:
            raise ValueError(f"min_slices must be >= 1, got {self.min_slices}")

    def to_json(self) -> dict[str, object]:
        return {
            "modalities": list(self.modalities),
            "min_slices": self.min_slices,
            "include_derived": self.include_derived,
            "all_series": self.all_series,
        }


@dataclass(frozen=True)
class SeriesCandidate:
    """A series that may be measured: its files (one per image) and what ranks it."""

    series_instance_uid: str
    paths: tuple[Path, ...]
    planes: int
    spacing_mm: float | None  # from the plane positions; None for one plane
    axial: bool
    series_number: int | None
    first: ImageAttributes  # the first file's attributes (modality, image type, ...)

    def describe(self) -> str:
        spacing = "?" if self.spacing_mm is None else f"{self.spacing_mm:.3g} mm"
        plane = "axial" if self.axial else "not axial"
        return f"{self.series_instance_uid} ({plane}, {spacing} apart, {self.planes} planes)"

    @property
    def rank(self) -> tuple[bool, float, int, int, str]:
        spacing = math.inf if self.spacing_mm is None else round(self.spacing_mm, 3)
        number = self.series_number if self.series_number is not None else 1 << 31
        return (not self.axial, spacing, -self.planes, number, self.series_instance_uid)


@dataclass(frozen=True)
class StudyPlan:
    """A study's candidates, best first, and the notes on everything left out."""

    study_instance_uid: str
    candidates: tuple[SeriesCandidate, ...]
    notes: tuple[Note, ...]

    def no_candidate_reason(self) -> str:
        reasons = "; ".join(n.reason for n in self.notes if n.path is None)
        return f"no series to measure: {reasons or 'no CT/MR image series'}"


def _candidate(uid: str, images: Sequence[FileRecord]) -> SeriesCandidate:
    attrs = [r.image for r in images if r.image is not None]
    planes = sum(a.planes for a in attrs)
    low = min(a.depth_min_mm for a in attrs)
    high = max(a.depth_max_mm for a in attrs)
    first = attrs[0]
    return SeriesCandidate(
        series_instance_uid=uid,
        paths=tuple(r.path for r in images),
        planes=planes,
        spacing_mm=(high - low) / (planes - 1) if planes > 1 else first.nominal_thickness_mm,
        axial=first.axial,
        series_number=first.series_number,
        first=first,
    )


def _left_out(
    uid: str, attrs: ImageAttributes, planes: int, incomplete: str | None, rules: SelectionRules
) -> str | None:
    """Why series ``uid`` is not a candidate, or None."""
    if attrs.modality not in rules.modalities:
        return (
            f"series {uid}: modality {attrs.modality}; this batch measures "
            f"{', '.join(rules.modalities)} (--modality)"
        )
    if attrs.derived and not rules.include_derived:
        return (
            f"series {uid}: derived images (ImageType {attrs.image_type}), e.g. a "
            "reformat; not measured (--include-derived)"
        )
    if incomplete is not None:
        return incomplete
    if planes < rules.min_slices:
        return f"series {uid}: {planes} slice(s), fewer than --min-slices {rules.min_slices}"
    return None


def plan_study(
    study_instance_uid: str,
    images: Sequence[FileRecord],
    damaged: Sequence[FileRecord],
    rules: SelectionRules,
) -> StudyPlan:
    """Rank the series of one study (its cataloged image files; the rejected files of its series
    and the unreadable files of its folders) under ``rules``."""
    notes: list[Note] = []
    first_copy: dict[str, Path] = {}
    by_series: dict[str, list[FileRecord]] = {}
    for record in sorted(images, key=lambda r: bytes(r.path)):
        attrs = record.image
        if attrs is None:
            raise ValueError(f"{record.path} is not an image record")
        uid = attrs.series_instance_uid
        seen = first_copy.setdefault(attrs.sop_instance_uid, record.path)
        if seen != record.path:
            notes.append(
                Note(
                    NoteKind.SKIPPED,
                    record.path,
                    uid,
                    f"{record.path}: duplicate of {seen} (same SOPInstanceUID); the first "
                    "copy is used",
                )
            )
            continue
        by_series.setdefault(uid, []).append(record)
    incomplete = Incompleteness()
    for record in damaged:
        if record.intact_copy is None:  # a damaged copy: the intact one is used
            incomplete.add(record.path, record.series_instance_uid, unreadable=record.unreadable)
    candidates = []
    for uid, files in sorted(by_series.items()):
        candidate = _candidate(uid, files)
        broken = incomplete.reason(uid, (r.path for r in files))
        reason = _left_out(uid, candidate.first, candidate.planes, broken, rules)
        if reason is None:
            candidates.append(candidate)
        else:
            notes.append(Note(NoteKind.SKIPPED, None, uid, reason))
    candidates.sort(key=lambda c: c.rank)
    return StudyPlan(study_instance_uid, tuple(candidates), tuple(notes))
