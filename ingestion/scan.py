"""Walk files and folders; group DICOM images into series; list NIfTI files; reject the rest.

Nothing here raises for a bad file: every file that cannot contribute becomes a
:class:`Rejected` with a reason that names the file and the problem.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ingestion.dicom_header import DicomObject, SeriesInfo, SliceRef, read_dicom_object
from ingestion.errors import IngestionError
from ingestion.stack import SeriesRef, build_stack

__all__ = ["Rejected", "ScanResult", "is_nifti_path", "iter_files", "scan_files", "scan_path"]

logger = logging.getLogger(__name__)

_SAME_ORIENTATION = 1e-4
_SAME_SPACING_MM = 1e-4


@dataclass(frozen=True)
class Rejected:
    """A file (or series) that will not be loaded, and why."""

    path: Path
    reason: str


@dataclass
class ScanResult:
    """What a scan found: DICOM stacks ready to load, NIfTI files, and rejections."""

    series: list[SeriesRef] = field(default_factory=list)
    nifti: list[Path] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


def is_nifti_path(path: Path) -> bool:
    """True for ``.nii`` and ``.nii.gz`` file names."""
    name = path.name.lower()
    return name.endswith(".nii") or name.endswith(".nii.gz")


def iter_files(root: Path, on_error: Callable[[OSError], None] | None = None) -> Iterator[Path]:
    """Yield every regular file under ``root`` (or ``root`` itself), in a stable order.

    Streams: memory does not grow with the size of the tree (one folder listing at a time).
    Hidden files and folders (starting with '.') are skipped. A folder that cannot be listed
    is passed to ``on_error`` (its ``filename`` names it) and skipped.
    """
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, onerror=on_error):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield Path(dirpath) / name


@dataclass
class _Group:
    info: SeriesInfo
    slices: list[SliceRef]

    def accepts(self, ref: SliceRef) -> bool:
        first = self.slices[0]
        return (
            (ref.rows, ref.columns) == (first.rows, first.columns)
            and np.allclose(ref.row_direction, first.row_direction, atol=_SAME_ORIENTATION)
            and np.allclose(ref.column_direction, first.column_direction, atol=_SAME_ORIENTATION)
            and np.allclose(ref.pixel_spacing, first.pixel_spacing, atol=_SAME_SPACING_MM)
        )


def _describe_split(groups: list[_Group]) -> str:
    parts = []
    for g in groups:
        s = g.slices[0]
        parts.append(
            f"{s.rows}x{s.columns}, orientation "
            f"{[round(v, 3) for v in (*s.row_direction, *s.column_direction)]}, "
            f"{len(g.slices)} image(s)"
        )
    return "; ".join(parts)


def scan_files(paths: Iterable[Path]) -> ScanResult:
    """Read the header of every path and group the images into series stacks."""
    result = ScanResult()
    by_series: dict[tuple[str, str], list[_Group]] = {}
    seen: dict[tuple[str, int | None], Path] = {}
    damaged: dict[str, Path] = {}  # series UID -> first damaged file of that series
    for path in paths:
        if is_nifti_path(path):
            result.nifti.append(path)
            continue
        try:
            obj: DicomObject = read_dicom_object(path)
        except IngestionError as exc:
            result.rejected.append(Rejected(path, str(exc)))
            if exc.series_instance_uid is not None:
                damaged.setdefault(exc.series_instance_uid, path)
            continue
        except OSError as exc:
            result.rejected.append(Rejected(path, f"{path}: cannot read file ({exc.strerror})"))
            continue
        key = (obj.info.study_instance_uid, obj.info.series_instance_uid)
        groups = by_series.setdefault(key, [])
        for ref in obj.slices:
            ident = (ref.sop_instance_uid, ref.frame)
            if ident in seen:
                if seen[ident] != path:
                    result.rejected.append(
                        Rejected(
                            path,
                            f"{path}: duplicate of {seen[ident]} (same SOPInstanceUID); "
                            "the first copy is used",
                        )
                    )
                continue
            seen[ident] = path
            group = next((g for g in groups if g.accepts(ref)), None)
            if group is None:
                groups.append(_Group(obj.info, [ref]))
            else:
                group.slices.append(ref)
    for (_, series_uid), groups in by_series.items():
        if series_uid in damaged:
            result.rejected.append(
                Rejected(
                    groups[0].slices[0].path,
                    f"series {series_uid}: incomplete, because {damaged[series_uid]} is damaged "
                    "(see its own entry); fix or re-export that file",
                )
            )
            continue
        split = len(groups) > 1
        if split:
            logger.info("series split into %d parts: %s", len(groups), _describe_split(groups))
        for index, group in enumerate(groups, start=1):
            note = (
                f"part {index} of {len(groups)}: the series mixes image sizes, orientations "
                "or pixel spacings and was split"
                if split
                else None
            )
            try:
                stack = build_stack(group.info, group.slices, part=index if split else None)
            except IngestionError as exc:
                result.rejected.append(Rejected(group.slices[0].path, str(exc)))
                continue
            if note is not None:
                stack = SeriesRef(
                    stack.info, stack.slices, stack.geometry, stack.part, (note, *stack.warnings)
                )
            result.series.append(stack)
    logger.info(
        "scan: %d series, %d NIfTI, %d rejected",
        len(result.series),
        len(result.nifti),
        len(result.rejected),
    )
    return result


def scan_path(path: Path) -> ScanResult:
    """Scan a file or folder tree. A missing path is reported as a rejection, not raised."""
    if not path.exists():
        return ScanResult(rejected=[Rejected(path, f"{path}: no such file or folder")])
    return scan_files(iter_files(path))
