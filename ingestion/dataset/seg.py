"""DICOM SEG importer: a segmentation (read with highdicom) on its referenced CT/MR series becomes
dataset rows, by the masks importer's rules (``ingestion.dataset.masks.findings_from_labels``:
lesions = 3-D connected components measured by RECIST on their largest slice, vessels = the
section of largest diameter).

What it reads, and the choices made (README "Datasets"):

- **Input**: one SEG file or a folder tree of them; files that are not DICOM SEG are ignored.
  ``images`` (default: the source folder, or the SEG file's own folder) is scanned once, headers
  only (``ingestion.dataset._dicom_import``: the slice order and geometry ``load_path`` gives).
- **The referenced series** (ReferencedSeriesSequence) is looked up by its Series Instance UID;
  missing: a Skipped line ("referenced series <uid> not found under <images>") and the rest
  imports. A SEG of several series is refused.
- **Grid**: each frame is placed on the series' (slice, row, column) grid by the SOP Instance
  UID (and frame) of its source image (DerivationImageSequence), else by its plane position;
  then checked: the same rows and columns, orientation and pixel spacing as the series, and
  its plane position that slice's position (within ``POSITION_TOLERANCE_MM``). Any difference
  refuses the file with the reason: nothing is resampled.
- **Pixels**: BINARY as stored; FRACTIONAL: a voxel belongs to the segment when its fraction is
  at least 0.5; LABELMAP: the stored value is the segment number.
- **Roles**: from each segment's segmented property type: Lesion, Neoplasm / Tumor, Mass,
  Nodule, Metastasis, Carcinoma, ... -> lesion; Blood Vessel, Artery, Vein, Aorta, ...
  -> vessel (``_dicom_import.is_vessel_code``); other segments are ignored. A ``label_file``
  (the masks importer's formats) overrides the codes: it decides alone, by segment label or
  segment number (:func:`segment_roles`).
- Each segment with a role is measured on its own label array (its segment number as the label
  value), so overlapping segments are each measured whole.
- **Provenance**: annotator = the ``annotator`` argument, else the segment's algorithm
  ("<name> (automatic)") where it was not drawn by hand, else ContentCreatorName, else the
  device (Manufacturer, ManufacturerModelName); ``annotated_at`` = ContentDate / ContentTime.
- **Study**: the referenced series, annotated with the kinds of its segments that have a role
  (a segmentation outlines every finding of the structures it segments).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ingestion.dataset._dicom_import import (
    Collected,
    ImageIndex,
    UnusableError,
    content_time,
    import_objects,
    is_vessel_code,
    person_name,
)
from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImportProgress,
    ImportResult,
    KindName,
    Provenance,
    Skipped,
    SourceType,
    finding_id,
)
from ingestion.errors import ConfigurationError

if TYPE_CHECKING:
    from pydicom import Dataset

    from ingestion.dicom.stack import SeriesRef

__all__ = ["POSITION_TOLERANCE_MM", "import_seg", "segment_roles"]

logger = logging.getLogger(__name__)

POSITION_TOLERANCE_MM = 0.01  # a frame's plane position vs its slice's (DS rounding is far less)
_DIRECTION_TOLERANCE = 1e-4
_SPACING_TOLERANCE_MM = 1e-4
_LESION_WORDS = (
    "lesion",
    "neoplasm",
    "tumor",
    "tumour",
    "mass",
    "nodule",
    "metasta",
    "carcinoma",
    "cancer",
)


# -- roles -------------------------------------------------------------------------------------


def _code_kind(code: Any) -> KindName | None:
    from pydicom.sr.codedict import codes

    if code is None:
        return None
    if is_vessel_code(code):
        return "vessel"
    lesions = (codes.SCT.Lesion, codes.SCT.Neoplasm, codes.SCT.Mass, codes.SCT.Nodule)
    if any(code == c for c in lesions):
        return "lesion"
    meaning = str(getattr(code, "meaning", "")).lower()
    return "lesion" if any(word in meaning for word in _LESION_WORDS) else None


def segment_roles(seg: Any, label_file: Path | None = None) -> dict[int, tuple[str, KindName]]:
    """Segment number -> (segment label, "lesion" | "vessel") for the segments with a role.

    Without ``label_file``, the segmented property type decides (its category, e.g.
    "Morphologically Abnormal Structure", is not enough on its own). With one (the masks
    importer's formats, ``masks.read_label_file``), the label file decides alone: a segment
    takes the role of the entry named as its segment label (case-insensitive; so a
    TotalSegmentator label file fits its SEG whatever the numbers), else of the entry with its
    segment number; a segment it does not name is ignored.

    Raises:
        ConfigurationError: the label file cannot be read or names no lesion and no vessel.
    """
    listed = None
    if label_file is not None:
        from ingestion.dataset.label_file import read_label_file

        listed = read_label_file(label_file)
    by_name = {name.lower(): kind for name, kind in (listed or {}).values()}
    roles: dict[int, tuple[str, KindName]] = {}
    for number in seg.segment_numbers:
        description = seg.get_segment_description(number)
        name = str(description.segment_label or f"segment {number}")
        if listed is None:
            kind = _code_kind(description.segmented_property_type)
        elif name.lower() in by_name:
            kind = by_name[name.lower()]
        else:
            kind = listed[number][1] if number in listed else None
        if kind is not None:
            roles[int(number)] = (name, kind)
    return roles


# -- the label arrays on the series grid --------------------------------------------------------


def _functional(seg: Dataset, frame: int, group: str, keyword: str) -> Any:
    """``keyword`` of functional group ``group`` for 0-based ``frame`` (per-frame, then shared)."""
    for holder in (
        seg.get("PerFrameFunctionalGroupsSequence", [None] * (frame + 1))[frame],
        (seg.get("SharedFunctionalGroupsSequence") or [None])[0],
    ):
        if holder is not None and group in holder and holder.get(group):
            item = holder.get(group)[0]
            if keyword in item:
                return item.get(keyword)
    return None


def _source_image(seg: Dataset, frame: int) -> tuple[str, int | None] | None:
    derivations = _functional(seg, frame, "DerivationImageSequence", "SourceImageSequence")
    if not derivations:
        return None
    source = derivations[0]
    frames = source.get("ReferencedFrameNumber")
    if frames is not None and not isinstance(frames, str | int):
        frames = frames[0]
    return str(source.ReferencedSOPInstanceUID), None if frames is None else int(frames)


def _check_plane(seg: Dataset, ref: SeriesRef) -> None:
    """The SEG's frames have the series' size, orientation and pixel spacing."""
    first = ref.slices[0]
    if (int(seg.Rows), int(seg.Columns)) != (first.rows, first.columns):
        raise UnusableError(
            f"frames are {seg.Columns} x {seg.Rows} pixels, the series' images "
            f"{first.columns} x {first.rows}: not on the series' grid (never resampled)"
        )
    for frame in range(int(seg.get("NumberOfFrames", 1))):
        orientation = _functional(seg, frame, "PlaneOrientationSequence", "ImageOrientationPatient")
        spacing = _functional(seg, frame, "PixelMeasuresSequence", "PixelSpacing")
        if orientation is None or spacing is None:
            raise UnusableError(f"frame {frame + 1} has no plane orientation or pixel spacing")
        expected = (*first.row_direction, *first.column_direction)
        if np.max(np.abs(np.asarray(orientation, float) - expected)) > _DIRECTION_TOLERANCE:
            raise UnusableError(
                f"frame {frame + 1}: orientation {list(orientation)} differs from the series' "
                f"{list(expected)}: not on the series' grid (never resampled)"
            )
        if np.max(np.abs(np.asarray(spacing, float) - first.pixel_spacing)) > _SPACING_TOLERANCE_MM:
            raise UnusableError(
                f"frame {frame + 1}: pixel spacing {list(spacing)} mm differs from the series' "
                f"{list(first.pixel_spacing)} mm: not on the series' grid (never resampled)"
            )


def _slice_of(seg: Dataset, frame: int, ref: SeriesRef, index: ImageIndex) -> int:
    """The series slice ``frame`` (0-based) lies on, checked against its plane position."""
    position = _functional(seg, frame, "PlanePositionSequence", "ImagePositionPatient")
    if position is None:
        raise UnusableError(f"frame {frame + 1} has no plane position")
    point = np.asarray(position, dtype=np.float64)
    source = _source_image(seg, frame)
    at = None if source is None else index.image(*source)
    if at is not None and at.ref is not ref:
        raise UnusableError(
            f"frame {frame + 1} is derived from image {source[0] if source else ''} of series "
            f"{at.ref.info.series_instance_uid}, not the referenced series"
        )
    if at is not None:
        slice_index = at.index
    else:
        slice_index = round(float(ref.geometry.lps_to_index(point)[0]))
        if not 0 <= slice_index < len(ref.slices):
            raise UnusableError(
                f"frame {frame + 1} at {point.round(3).tolist()} lies on no slice of the series"
            )
    expected = ref.geometry.index_to_lps([float(slice_index), 0.0, 0.0])
    off = float(np.linalg.norm(point - expected))
    if off > POSITION_TOLERANCE_MM:
        raise UnusableError(
            f"frame {frame + 1}: plane position {point.round(3).tolist()} is {off:.3f} mm from "
            f"slice {slice_index} of the series: not on the series' grid (never resampled)"
        )
    return slice_index


def _masks(
    seg: Any, ref: SeriesRef, index: ImageIndex, numbers: set[int]
) -> dict[int, npt.NDArray[np.bool_]]:
    """Segment number -> its mask on the series' (slice, row, column) grid, for ``numbers``."""
    _check_plane(seg, ref)
    shape = (len(ref.slices), ref.slices[0].rows, ref.slices[0].columns)
    out = {n: np.zeros(shape, dtype=bool) for n in sorted(numbers)}
    kind = str(seg.SegmentationType)
    maximum = float(seg.get("MaximumFractionalValue", 1) or 1)
    for frame in range(int(seg.get("NumberOfFrames", 1))):
        slice_index = _slice_of(seg, frame, ref, index)
        if kind == "LABELMAP":  # the stored value is the segment number
            pixels = np.asarray(seg.get_stored_frame(frame + 1))
            for n, mask in out.items():
                mask[slice_index] |= pixels == n
            continue
        number = _functional(seg, frame, "SegmentIdentificationSequence", "ReferencedSegmentNumber")
        if number is None or int(number) not in out:
            continue
        pixels = np.asarray(seg.get_stored_frame(frame + 1))
        inside = pixels.astype(np.float64) * 2 >= maximum if kind == "FRACTIONAL" else pixels > 0
        out[int(number)][slice_index] |= inside
    return out


# -- files --------------------------------------------------------------------------------------


def _is_seg(path: Path) -> bool:
    from pydicom import dcmread
    from pydicom.errors import InvalidDicomError

    try:
        header = dcmread(path, stop_before_pixels=True, specific_tags=["Modality"])
    except (InvalidDicomError, OSError, ValueError, EOFError):
        return False
    return bool(header.get("Modality") == "SEG")


def _annotator(seg: Any, number: int) -> str:
    description = seg.get_segment_description(number)
    if str(description.get("SegmentAlgorithmType", "MANUAL")) != "MANUAL":
        name = description.get("SegmentAlgorithmName")
        if name:
            return f"{name} ({str(description.SegmentAlgorithmType).lower()})"
    creator = seg.get("ContentCreatorName")
    if creator:
        return person_name(creator)
    device = " ".join(
        str(v) for v in (seg.get("Manufacturer"), seg.get("ManufacturerModelName")) if v
    )
    return device or "unknown"


def _by_file(finding: DatasetFinding, relative: str, base: Provenance) -> DatasetFinding:
    """A finding of a folder's SEG file: its id and item name the file (a folder may hold
    several SEGs of one series, with the same segment numbers)."""
    if not relative:
        return finding
    key = f"{relative}\x1f{finding.id}"
    return replace(
        finding,
        id=finding_id(base, finding.series_instance_uid, key),
        provenance=replace(finding.provenance, item=f"{relative}, {finding.provenance.item}"),
    )


def _referenced_series(seg: Any, index: ImageIndex) -> SeriesRef:
    uids = sorted({str(s.SeriesInstanceUID) for s in seg.get("ReferencedSeriesSequence", [])})
    if not uids:
        raise UnusableError("the SEG names no referenced series (ReferencedSeriesSequence)")
    if len(uids) > 1:
        raise UnusableError(
            f"the SEG references {len(uids)} series ({', '.join(uids)}); one series per SEG"
        )
    ref = index.stack(uids[0])
    if ref is None:
        raise UnusableError(f"referenced series {uids[0]} not found under {index.root}")
    return ref


def _import_file(
    path: Path,
    relative: str,
    index: ImageIndex,
    base: Provenance,
    label_file: Path | None,
    out: Collected,
) -> None:
    import highdicom as hd

    from ingestion.dataset.masks import findings_from_labels

    def skip(item: str, reason: str) -> None:
        out.skipped.append(Skipped(SourceType.SEG, base.path, str(path), item, reason))

    try:
        seg = hd.seg.segread(path)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, RuntimeError) as error:
        skip("", f"highdicom cannot read this SEG: {error}")
        return
    roles = segment_roles(seg, label_file)
    if not roles:
        described = ", ".join(
            f"{n} {seg.get_segment_description(n).segmented_property_type.meaning}"
            for n in seg.segment_numbers
        )
        skip("", f"no segment is a lesion or a vessel ({described}); a label file can say so")
        return
    try:
        ref = _referenced_series(seg, index)
        masks = _masks(seg, ref, index, set(roles))
    except UnusableError as error:
        skip("", str(error))
        return
    info = ref.info
    image = index.image_ref(ref)
    for number, (name, kind) in sorted(roles.items()):
        provenance = Provenance(
            SourceType.SEG,
            base.path,
            "",
            base.annotator if base.annotator != "unknown" else _annotator(seg, number),
            base.licence,
            content_time(seg),
        )
        labels = np.where(masks[number], number, 0).astype(np.int32)
        found, left_out = findings_from_labels(
            labels,
            ref.geometry,
            {number: (name, kind)},
            study_instance_uid=info.study_instance_uid,
            series_instance_uid=info.series_instance_uid,
            image=image,
            provenance=provenance,
            file=str(path),
        )
        if not found and not left_out:
            skip(f"segment {number} ({name})", "the segment is empty")
        out.findings.extend(_by_file(f, relative, base) for f in found)
        out.skipped.extend(left_out)
    uid = info.series_instance_uid
    earlier = out.studies[uid].annotated if uid in out.studies else ()
    out.studies[uid] = DatasetStudy(
        info.study_instance_uid,
        uid,
        image,
        tuple(sorted({*earlier, *(kind for _, kind in roles.values())})),
        Provenance(SourceType.SEG, base.path, "", base.annotator, base.licence),
    )


def import_seg(
    source: Path,
    *,
    images: Path | None = None,
    label_file: Path | None = None,
    annotator: str | None = None,
    licence: str = "unknown",
    on_item: ImportProgress | None = None,
) -> ImportResult:
    """Import the DICOM SEG files of ``source`` (a file or a folder tree) on their series.

    Args:
        source: a DICOM SEG file, or a folder searched recursively (other files are ignored).
        images: where the referenced series are (a folder tree of DICOM files); default:
            ``source`` when it is a folder, else the SEG file's folder.
        label_file: roles of segments by number or label (the masks importer's formats);
            overrides the segments' codes.
        annotator: who made the segmentation; default: from each SEG (module doc).
        licence: the input's licence or terms of use.
        on_item: progress, called before each file.

    Returns:
        The findings of every segment with a role, one study per SEG and series, and a Skipped
        line (file, item, reason) for what was left out.

    Raises:
        ConfigurationError: ``source``, ``images`` or ``label_file`` does not exist or cannot
            be read.
    """
    if label_file is not None and not Path(label_file).is_file():
        raise ConfigurationError(f"{label_file}: no such label file")
    return import_objects(
        SourceType.SEG,
        source,
        images=images,
        annotator=annotator,
        licence=licence,
        is_object=_is_seg,
        name="SEG",
        import_file=lambda path, relative, index, base, out: _import_file(
            path, relative, index, base, label_file, out
        ),
        on_item=on_item,
    )
