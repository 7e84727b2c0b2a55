"""What the DICOM SEG and SR importers (``seg``, ``sr``) share, so that each importer holds only
its own format's reading:

- small DICOM readings: code values and meanings, whether a code names a blood vessel, person
  names and content date/time as people read them, and :class:`UnusableError`, the one error
  that turns an item into a Skipped line (it never leaves the importers);
- the image series under a folder (:class:`ImageIndex`), indexed to find where an annotation
  lies: by series, by SOP instance (and frame), and by frame of reference and a point in
  patient space. The folder is scanned once, headers only (``ingestion.scan``): the same
  series, slice order and geometry ``load_path`` gives, so a slice index found here is the
  slice a loaded volume has. A series split into several stacks is refused (its slice indices
  would be ambiguous), and a point outside every image is refused: nothing is guessed;
- finding their files under a source and collecting rows into one ``ImportResult``
  (:func:`import_objects`).

pydicom is imported inside the functions that need it: importing this module reads nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    ImportProgress,
    ImportResult,
    Provenance,
    Skipped,
    SourceType,
)
from ingestion.errors import ConfigurationError, IngestionError
from ingestion.scan import iter_files, scan_path

if TYPE_CHECKING:
    from pydicom import Dataset

    from ingestion.dicom.stack import SeriesRef

__all__ = [
    "Collected",
    "FileImporter",
    "ImageIndex",
    "SliceAt",
    "UnusableError",
    "code_meaning",
    "code_value",
    "content_time",
    "image_points_to_lps",
    "import_objects",
    "is_vessel_code",
    "nearest_slice",
    "person_name",
]

logger = logging.getLogger(__name__)

# -- DICOM values ---------------------------------------------------------------------------------
_VESSEL_WORDS = ("vessel", "artery", "aorta", "vein", "vena cava")  # not "aortic" (valve)


class UnusableError(IngestionError):
    """An item of an input that cannot be imported; the message is the Skipped line's reason.
    The importers turn it into a Skipped line: it never leaves them."""


def code_meaning(code: Any) -> str:
    """A code's meaning: a pydicom ``Code``'s ``meaning``, a code item's CodeMeaning, else the
    code as text."""
    return str(getattr(code, "meaning", None) or getattr(code, "CodeMeaning", "") or code)


def code_value(code: Dataset) -> str:
    """A code item's value (CodeValue, or the Long / URN code value of a longer code)."""
    for keyword in ("CodeValue", "LongCodeValue", "URNCodeValue"):
        if keyword in code:
            return str(code.get(keyword))
    return ""


def is_vessel_code(code: Any) -> bool:
    """Whether a code (finding type, site, segmented property) names a blood vessel: SCT Blood
    Vessel, Artery, Vein, Aorta, or a meaning with a vessel word (artery, vein, vena cava, ...)."""
    from pydicom.sr.codedict import codes

    vessels = (codes.SCT.BloodVessel, codes.SCT.Artery, codes.SCT.Vein, codes.SCT.Aorta)
    if any(code == c for c in vessels):
        return True
    meaning = code_meaning(code).lower()
    return any(word in meaning for word in _VESSEL_WORDS)


def person_name(value: Any) -> str:
    """A DICOM person name for people: "Jane Doe" for ``Doe^Jane``, "alice" for ``alice^``."""
    from pydicom.valuerep import PersonName

    name = value if isinstance(value, PersonName) else PersonName(str(value))
    parts = (name.name_prefix, name.given_name, name.middle_name, name.family_name)
    return " ".join(p for p in (*parts, name.name_suffix) if p) or str(value)


def content_time(dataset: Dataset) -> str | None:
    """The object's ContentDate / ContentTime as ISO 8601 (None without a date)."""
    date = str(dataset.get("ContentDate", "") or "")
    if len(date) != 8 or not date.isdigit():
        return None
    out = f"{date[:4]}-{date[4:6]}-{date[6:]}"
    time = str(dataset.get("ContentTime", "") or "")
    if len(time) >= 4 and time[:6].isdigit():
        seconds = time[4:6] if len(time) >= 6 else "00"
        out += f"T{time[:2]}:{time[2:4]}:{seconds}"
    return out


# -- the image series under a folder --------------------------------------------------------------
_PIXEL_TOLERANCE = 1e-3  # how far (pixels) a point may sit outside the image


@dataclass(frozen=True)
class SliceAt:
    """A referenced image: its stack and slice index (in ``load_path``'s slice order)."""

    ref: SeriesRef
    index: int


class ImageIndex:
    """The DICOM series under a folder (headers only), by series, SOP instance and frame of
    reference. A series split into several stacks is refused (its slice indices would be
    ambiguous)."""

    def __init__(self, root: Path, *, scan: bool = True) -> None:
        self.root = root
        self._series: dict[str, list[SeriesRef]] = {}
        self._slices: dict[str, list[tuple[int | None, SliceAt]]] = {}
        self._frames_of_reference: dict[str, str | None] = {}
        for ref in scan_path(root).series if scan else ():
            self._series.setdefault(ref.info.series_instance_uid, []).append(ref)
            for i, s in enumerate(ref.slices):
                frame = None if s.frame is None else s.frame + 1
                self._slices.setdefault(s.sop_instance_uid, []).append((frame, SliceAt(ref, i)))

    @classmethod
    def empty(cls, root: Path) -> ImageIndex:
        """An index of nothing (where nothing refers to images)."""
        return cls(root, scan=False)

    def series_uids(self) -> list[str]:
        return sorted(self._series)

    def stack(self, series_instance_uid: str) -> SeriesRef | None:
        """The series' stack; None when it is not under the folder.

        Raises:
            UnusableError: the series is split into several stacks.
        """
        refs = self._series.get(series_instance_uid)
        if refs is None:
            return None
        if len(refs) > 1:
            raise UnusableError(
                f"series {series_instance_uid} under {self.root} is split into {len(refs)} "
                "stacks (sizes, orientations or positions differ); its slices are ambiguous"
            )
        return refs[0]

    def image(self, sop_instance_uid: str, frame: int | None = None) -> SliceAt | None:
        """Where the image (1-based ``frame`` of a multi-frame image) lies; None if absent.

        Raises:
            UnusableError: a multi-frame image is named without a frame, or its series is split.
        """
        found = self._slices.get(sop_instance_uid, [])
        if frame is not None:
            found = [f for f in found if f[0] == frame]
        elif len(found) > 1:
            raise UnusableError(
                f"image {sop_instance_uid} has {len(found)} frames and the reference names none"
            )
        if not found:
            return None
        at = found[0][1]
        self.stack(at.ref.info.series_instance_uid)  # refuses a split series
        return at

    def frame_of_reference(self, ref: SeriesRef) -> str | None:
        """The series' Frame of Reference UID (read from its first file's header)."""
        uid = ref.info.series_instance_uid
        if uid not in self._frames_of_reference:
            from pydicom import dcmread

            header = dcmread(
                ref.slices[0].path, stop_before_pixels=True, specific_tags=["FrameOfReferenceUID"]
            )
            value = header.get("FrameOfReferenceUID")
            self._frames_of_reference[uid] = None if value is None else str(value)
        return self._frames_of_reference[uid]

    def stacks_in(self, frame_of_reference_uid: str) -> list[SeriesRef]:
        """Every (unsplit) stack in that frame of reference, by series UID."""
        out = []
        for uid in self.series_uids():
            refs = self._series[uid]
            if len(refs) == 1 and self.frame_of_reference(refs[0]) == frame_of_reference_uid:
                out.append(refs[0])
        return out

    def slice_near(
        self,
        frame_of_reference_uid: str,
        points: npt.NDArray[np.float64],
        prefer: Iterable[frozenset[str]] = (),
    ) -> SliceAt:
        """The slice nearest the middle of ``points`` ((N, 3) LPS mm) among the stacks in that
        frame of reference.

        ``prefer`` narrows the stacks: the first set of series UIDs that names any of them
        (e.g. the series an annotation names, then those its document names).

        Raises:
            UnusableError: no series is in the frame of reference, the middle lies outside
                every one, or inside several and ``prefer`` names none of them.
        """
        stacks = self.stacks_in(frame_of_reference_uid)
        if not stacks:
            raise UnusableError(
                f"3-D coordinates are in frame of reference {frame_of_reference_uid}, which no "
                f"series under {self.root} is in"
            )
        for named in prefer:
            chosen = [s for s in stacks if s.info.series_instance_uid in named]
            if chosen:
                stacks = chosen
                break
        middle = points.mean(axis=0)
        found = [at for s in stacks if (at := nearest_slice(s, middle)) is not None]
        if not found:
            raise UnusableError(
                f"3-D coordinates {middle.round(2).tolist()} lie outside every series of frame of "
                f"reference {frame_of_reference_uid} under {self.root}"
            )
        if len(found) > 1:
            uids = ", ".join(at.ref.info.series_instance_uid for at in found)
            raise UnusableError(
                f"3-D coordinates lie in {len(found)} series of frame of reference "
                f"{frame_of_reference_uid} ({uids}) and neither the group nor the document "
                "names one of them"
            )
        return found[0]

    @staticmethod
    def image_ref(ref: SeriesRef) -> ImageRef:
        """What loads the series: the folder that holds all its files."""
        folder = os.path.commonpath([str(s.path.parent.resolve()) for s in ref.slices])
        return ImageRef(folder, "dicom", ref.info.modality.value)


def image_points_to_lps(points: npt.NDArray[np.float64], at: SliceAt) -> npt.NDArray[np.float64]:
    """(column, row) image coordinates of ``at`` -> LPS mm, (N, 2) -> (N, 3).

    DICOM's convention: the top left corner of the top left pixel is (0, 0), its centre
    (0.5, 0.5), so voxel index = (slice of the image, row - 0.5, column - 0.5).

    Raises:
        UnusableError: a point lies outside the image.
    """
    rows, columns = at.ref.slices[0].rows, at.ref.slices[0].columns
    inside = (points >= -_PIXEL_TOLERANCE) & (
        points <= np.array([columns, rows]) + _PIXEL_TOLERANCE
    )
    if not np.all(inside):
        raise UnusableError(
            f"coordinates {points.tolist()} lie outside the {columns} x {rows} image "
            f"{at.ref.slices[at.index].sop_instance_uid}"
        )
    index = np.stack(
        [np.full(len(points), float(at.index)), points[:, 1] - 0.5, points[:, 0] - 0.5], axis=1
    )
    return np.asarray(at.ref.geometry.index_to_lps(index), dtype=np.float64)


def nearest_slice(ref: SeriesRef, point: npt.NDArray[np.float64]) -> SliceAt | None:
    """The slice of ``ref`` nearest ``point`` (LPS), None when the point is outside the stack."""
    s, r, c = ref.geometry.lps_to_index(point)
    shape = (len(ref.slices), ref.slices[0].rows, ref.slices[0].columns)
    if any(not (-0.5 - 1e-6 <= v <= n - 0.5 + 1e-6) for v, n in zip((s, r, c), shape, strict=True)):
        return None
    return SliceAt(ref, min(max(round(float(s)), 0), shape[0] - 1))


# -- importing the objects under a source ---------------------------------------------------------
@dataclass
class Collected:
    """What an import found so far: studies by series UID, findings, skipped items."""

    studies: dict[str, DatasetStudy] = field(default_factory=dict)
    findings: list[DatasetFinding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


FileImporter = Callable[[Path, str, ImageIndex, Provenance, Collected], None]
"""Imports one file: (path, its path relative to the source ("" for a file source), the index of
image series, the input's provenance, what was collected so far)."""


def import_objects(
    kind: SourceType,
    source: Path,
    *,
    images: Path | None,
    annotator: str | None,
    licence: str,
    is_object: Callable[[Path], bool],
    name: str,
    import_file: FileImporter,
    on_item: ImportProgress | None = None,
) -> ImportResult:
    """Import every file of ``source`` (a file, or a folder searched recursively) for which
    ``is_object`` holds, with ``import_file``, against the series under ``images`` (default:
    ``source`` when it is a folder, else the file's folder).

    Raises:
        ConfigurationError: ``source`` or ``images`` does not exist.
    """
    source = Path(source).resolve()
    if not source.exists():
        raise ConfigurationError(f"{source}: no such {name} file or folder")
    folder = (
        Path(images).resolve()
        if images is not None
        else (source if source.is_dir() else source.parent)
    )
    if not folder.is_dir():
        raise ConfigurationError(f"{folder}: no such folder of images (give --images)")
    base = Provenance(kind, str(source), "", annotator or "unknown", licence)
    out = Collected()
    files = [p for p in iter_files(source) if is_object(p)]
    if not files:
        reason = (
            f"not a DICOM {name}" if source.is_file() else f"no DICOM {name} file under this folder"
        )
        out.skipped.append(Skipped(kind, base.path, str(source), "", reason))
    index = ImageIndex(folder) if files else ImageIndex.empty(folder)
    for done, path in enumerate(files):
        if on_item is not None:
            on_item(done, len(files), str(path))
        relative = "" if source.is_file() else path.relative_to(source).as_posix()
        import_file(path, relative, index, base, out)
    logger.info(
        "%s import of %s: %d findings, %d series, %d skipped",
        name,
        source,
        len(out.findings),
        len(out.studies),
        len(out.skipped),
    )
    return ImportResult(
        kind,
        base.path,
        tuple(out.studies[uid] for uid in sorted(out.studies)),
        tuple(out.findings),
        tuple(out.skipped),
    )
