"""Walk files and folders; group DICOM images into series; list NIfTI and NRRD files; reject the
rest (an NRRD segmentation, ``*.seg.nrrd``, is a label map, not an image: rejected with that
reason).

Nothing here raises for a bad file: every file that cannot contribute becomes a
:class:`Rejected` with a reason that names the file and the problem.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ingestion.errors import InconsistentGeometryError, IngestionError, UnreadableFileError

if TYPE_CHECKING:  # pydicom (ingestion.dicom.header) is imported by the functions that read files
    from ingestion.dicom.header import DicomObject, SeriesInfo, SliceRef
    from ingestion.dicom.stack import SeriesRef

__all__ = [
    "Incompleteness",
    "Rejected",
    "ScanResult",
    "damaged_copy_reason",
    "is_nifti_path",
    "is_nrrd_path",
    "is_segmentation_path",
    "iter_files",
    "scan_files",
    "scan_path",
    "segmentation_reason",
]

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
    """What a scan found: DICOM stacks ready to load, NIfTI and NRRD files, and rejections."""

    series: list[SeriesRef] = field(default_factory=list)
    nifti: list[Path] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    nrrd: list[Path] = field(default_factory=list)


def is_nifti_path(path: Path) -> bool:
    """True for ``.nii`` and ``.nii.gz`` file names."""
    name = path.name.lower()
    return name.endswith(".nii") or name.endswith(".nii.gz")


def is_nrrd_path(path: Path) -> bool:
    """True for ``.nrrd`` file names (images and ``.seg.nrrd`` segmentations alike)."""
    return path.name.lower().endswith(".nrrd")


def is_segmentation_path(path: Path) -> bool:
    """True for ``.seg.nrrd`` file names: 3D Slicer's segmentations (label maps), not images."""
    return path.name.lower().endswith(".seg.nrrd")


def segmentation_reason(path: Path) -> str:
    """Why a segmentation file is not loaded as an image."""
    return (
        f"{path}: a segmentation (label map), not an image: import it with "
        "radcaliper dataset import --from masks"
    )


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


@dataclass(frozen=True)
class _Damaged:
    """A rejected file that may make a series incomplete."""

    index: int  # its entry in ScanResult.rejected
    path: Path
    series_instance_uid: str | None
    sop_instance_uid: str | None
    unreadable: bool  # nothing is known of its content (permission denied, I/O error)


def damaged_copy_reason(reason: str, intact: Path) -> str:
    """``reason`` of a damaged file, said to be a damaged copy of the readable ``intact``."""
    return f"{reason} (a damaged copy: the readable copy {intact}, same SOPInstanceUID, is used)"


class Incompleteness:
    """Which damaged files make which series incomplete (README "Damaged files"), for the scan
    of a tree and for the batch's series selection alike: a damaged file of a known series makes
    that series incomplete; a file that cannot be read at all makes every series with a file in
    its folder incomplete (it may be any of their slices). A damaged copy of an image that
    another file holds intact is not added: that copy is used instead."""

    def __init__(self) -> None:
        self._by_series: dict[str, Path] = {}  # series UID -> its first damaged file
        self._unreadable_in: dict[Path, Path] = {}  # folder -> its first unreadable file

    def add(self, path: Path, series_instance_uid: str | None, *, unreadable: bool) -> None:
        if unreadable:
            self._unreadable_in.setdefault(path.parent, path)
        elif series_instance_uid:
            self._by_series.setdefault(series_instance_uid, path)

    def reason(self, series_instance_uid: str, paths: Iterable[Path]) -> str | None:
        """Why the series (its files ``paths``) is incomplete, or None."""
        damaged, why = self._by_series.get(series_instance_uid), "is damaged"
        if damaged is None:
            why = "cannot be read"
            damaged = next(
                (self._unreadable_in[p.parent] for p in paths if p.parent in self._unreadable_in),
                None,
            )
        if damaged is None:
            return None
        return (
            f"series {series_instance_uid}: incomplete, because {damaged} {why} (see its own "
            "entry); fix or re-export that file"
        )


def scan_files(paths: Iterable[Path]) -> ScanResult:
    """Read the header of every path and group the images into series stacks.

    Copies of one image (same SOPInstanceUID) are used once: the first readable one; each other
    copy gets one entry. A damaged file makes its series incomplete, unless it is a damaged copy
    of an image read intact from another file; a file that cannot be read at all (permission
    denied) makes every series with a file in its folder incomplete (it may be any of their
    slices).
    """
    from ingestion.dicom.header import read_dicom_object

    result = ScanResult()
    by_series: dict[tuple[str, str], list[_Group]] = {}
    first_copy: dict[str, Path] = {}  # SOPInstanceUID -> the file used for it
    damaged: list[_Damaged] = []
    for path in paths:
        if is_nifti_path(path):
            result.nifti.append(path)
            continue
        if is_nrrd_path(path):
            if is_segmentation_path(path):
                result.rejected.append(Rejected(path, segmentation_reason(path)))
            else:
                result.nrrd.append(path)
            continue
        try:
            obj: DicomObject = read_dicom_object(path)
        except IngestionError as exc:
            unreadable = isinstance(exc, UnreadableFileError)
            if unreadable or exc.series_instance_uid or exc.sop_instance_uid:
                damaged.append(
                    _Damaged(
                        len(result.rejected),
                        path,
                        exc.series_instance_uid,
                        exc.sop_instance_uid,
                        unreadable,
                    )
                )
            result.rejected.append(Rejected(path, str(exc)))
            continue
        except OSError as exc:  # read_dicom_header says why; this is a stat() that failed
            reason = str(UnreadableFileError.from_os_error(path, exc))
            damaged.append(_Damaged(len(result.rejected), path, None, None, True))
            result.rejected.append(Rejected(path, reason))
            continue
        sop = obj.slices[0].sop_instance_uid
        if sop in first_copy:
            result.rejected.append(
                Rejected(
                    path,
                    f"{path}: duplicate of {first_copy[sop]} (same SOPInstanceUID); "
                    "the first copy is used",
                )
            )
            continue
        first_copy[sop] = path
        key = (obj.info.study_instance_uid, obj.info.series_instance_uid)
        groups = by_series.setdefault(key, [])
        for ref in obj.slices:
            group = next((g for g in groups if g.accepts(ref)), None)
            if group is None:
                groups.append(_Group(obj.info, [ref]))
            else:
                group.slices.append(ref)
    incomplete = Incompleteness()
    for item in damaged:
        intact = first_copy.get(item.sop_instance_uid or "")
        if intact is not None:
            old = result.rejected[item.index]
            result.rejected[item.index] = Rejected(
                old.path, damaged_copy_reason(old.reason, intact)
            )
        else:
            incomplete.add(item.path, item.series_instance_uid, unreadable=item.unreadable)
    for (_, series_uid), groups in by_series.items():
        why = incomplete.reason(series_uid, (s.path for g in groups for s in g.slices))
        if why is not None:
            result.rejected.append(Rejected(groups[0].slices[0].path, why))
            continue
        result.series.extend(_stacks(groups, result))
    logger.info(
        "scan: %d series, %d NIfTI, %d NRRD, %d rejected",
        len(result.series),
        len(result.nifti),
        len(result.nrrd),
        len(result.rejected),
    )
    return result


def _stacks(groups: list[_Group], result: ScanResult) -> list[SeriesRef]:
    """The stacks of one series' groups (same size, orientation, pixel spacing). A group that
    does not stack as a whole is split by stack key when that gives valid stacks
    (``ingestion.dicom.stack``), else rejected."""
    from ingestion.dicom.stack import build_stack, split_by_stack_key

    if len(groups) > 1:
        logger.info("series split into %d parts: %s", len(groups), _describe_split(groups))
    parts: list[tuple[SeriesRef, str | None]] = []  # a stack, and what told it apart
    for group in groups:
        try:
            parts.append((build_stack(group.info, group.slices), None))
        except InconsistentGeometryError as exc:
            split = split_by_stack_key(group.slices)
            stacks = None if split is None else _each_stacks(group.info, split)
            if stacks is None:
                result.rejected.append(Rejected(group.slices[0].path, str(exc)))
                continue
            logger.info("series holds %d stacks told apart by their stack key", len(stacks))
            parts += stacks
        except IngestionError as exc:
            result.rejected.append(Rejected(group.slices[0].path, str(exc)))
    if len(parts) < 2:
        return [stack for stack, _ in parts]
    out = []
    for part, (stack, said) in enumerate(parts, start=1):
        why = (
            "the series mixes image sizes, orientations or pixel spacings and was split"
            if said is None
            else f"the series holds stacks at overlapping positions, told apart by their "
            f"headers; this one has {said}"
        )
        note = f"part {part} of {len(parts)}: {why}"
        out.append(replace(stack, part=part, warnings=(note, *stack.warnings)))
    return out


def _each_stacks(
    info: SeriesInfo, split: list[tuple[list[SliceRef], str]]
) -> list[tuple[SeriesRef, str | None]] | None:
    """The stack of each group of ``split`` when every one stacks on its own, else None."""
    from ingestion.dicom.stack import build_stack

    try:
        return [(build_stack(info, planes), said) for planes, said in split]
    except IngestionError:
        return None


def scan_path(path: Path) -> ScanResult:
    """Scan a file or folder tree. A missing path is reported as a rejection, not raised."""
    if not path.exists():
        return ScanResult(rejected=[Rejected(path, f"{path}: no such file or folder")])
    return scan_files(iter_files(path))
