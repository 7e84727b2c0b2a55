"""Read one DICOM file's header and turn it into slice references, or say why not.

Only headers are read here (pixel data is deferred: its file offset is kept for a fast read
later). A file becomes a :class:`DicomObject` holding one :class:`SliceRef` per image plane
(one for a classic single-frame image, one per frame for an enhanced multi-frame object), or an
:class:`~ingestion.errors.IngestionError` subclass whose message names the file and the problem.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError
from pydicom.uid import UID

from ingestion.dicom._header_values import (
    StackKey,
    classic_stack_key,
    frame_stack_key,
    gantry_tilt,
    stated_spacing,
    undeclared_text,
)
from ingestion.dicom._pydicom import quiet_pydicom
from ingestion.dicom._truncation import cut_inside, revealed_sop, truncation_error
from ingestion.errors import (
    InconsistentGeometryError,
    IngestionError,
    MissingGeometryError,
    NotDicomError,
    PixelDataError,
    UnreadableFileError,
    UnsupportedObjectError,
)
from ingestion.geometry import Vector3
from ingestion.volume import Modality

__all__ = [
    "DicomObject",
    "PixelLocation",
    "SeriesInfo",
    "SliceRef",
    "dicom_object_from_dataset",
    "read_dicom_header",
    "read_dicom_object",
]

logger = logging.getLogger(__name__)

_PIXEL_DATA = 0x7FE00010
_DEFER_BYTES = 4096
_DICOMDIR_CLASS = "1.2.840.10008.1.3.10"
_NATIVE_LITTLE_ENDIAN = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1"}
# Words in a SOP class name that mark an object without an image to measure.
_NON_IMAGE_WORDS = {
    "SR Storage": "a structured report",
    "Segmentation": "a segmentation",
    "RT Structure Set": "an RT structure set",
    "RT Plan": "an RT plan",
    "RT Ion Plan": "an RT plan",
    "RT Beams Treatment Record": "an RT treatment record",
    "Waveform": "a waveform",
    "Presentation State": "a presentation state",
    "Key Object Selection": "a key object selection",
    "Encapsulated": "an encapsulated document",
    "Raw Data": "raw data",
    "Registration": "a registration",
}
_ORTHOGONALITY_TOLERANCE = 1e-3
_SECONDARY_CAPTURE_PREFIX = "1.2.840.10008.5.1.4.1.1.7"  # SC Image Storage and its multi-frame kin


@dataclass(frozen=True)
class SeriesInfo:
    """What all slices of one series share; used to group files."""

    study_instance_uid: str
    series_instance_uid: str
    modality: Modality
    patient_id: str | None
    study_date: str | None
    series_number: int | None
    series_description: str
    patient_name: str | None = None  # PatientName as text (``Family^Given``)
    # values read with a character set the file does not declare (names the tag, never the value)
    text_warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class PixelLocation:
    """Where native (uncompressed, little-endian) pixel data of one frame sits in its file."""

    offset: int
    dtype: str
    bits_stored: int


@dataclass(frozen=True)
class SliceRef:
    """One image plane: its file (and frame), geometry and value transform."""

    path: Path
    frame: int | None  # 0-based frame index in a multi-frame object, None for single-frame
    sop_instance_uid: str
    position: Vector3  # ImagePositionPatient, LPS mm
    row_direction: Vector3  # ImageOrientationPatient[0:3]
    column_direction: Vector3  # ImageOrientationPatient[3:6]
    pixel_spacing: tuple[float, float]  # (between rows, between columns) mm
    rows: int
    columns: int
    slope: float
    intercept: float
    native: PixelLocation | None  # set when the fast native read applies
    nominal_thickness: float | None = None  # SpacingBetweenSlices or SliceThickness, if given
    spacing_between_slices: float | None = None  # SpacingBetweenSlices, if given and > 0
    header_problems: tuple[str, ...] = ()  # values present but unusable, ignored (tag and value)
    gantry_tilt: float | None = None  # GantryDetectorTilt (degrees, signed as written), if given
    # what tells stacks of one series apart (ingestion.dicom._header_values)
    stack_key: StackKey = ()

    @property
    def normal(self) -> Vector3:
        n = np.cross(self.row_direction, self.column_direction)
        return (float(n[0]), float(n[1]), float(n[2]))


@dataclass(frozen=True)
class DicomObject:
    """A readable CT/MR image object: series identity plus its image planes."""

    info: SeriesInfo
    slices: tuple[SliceRef, ...]


def read_dicom_header(path: Path) -> Dataset:
    """Read a file's DICOM header; pixel data (and other large values) stay deferred on disk.

    Raises:
        NotDicomError: empty, truncated, gzip-compressed or not DICOM at all.
        UnreadableFileError: the file cannot be read (permission denied, I/O error).
    """
    try:
        with quiet_pydicom(str(path)):
            return _read_header(path)
    except OSError as exc:  # never "corrupt": the content was not even seen
        raise UnreadableFileError.from_os_error(path, exc) from exc


def _read_header(path: Path) -> Dataset:
    size = path.stat().st_size
    if size == 0:
        raise NotDicomError(f"{path}: empty file (0 bytes); re-export it from the source")
    try:
        return pydicom.dcmread(path, defer_size=_DEFER_BYTES)
    except InvalidDicomError:
        pass
    except OSError:
        raise
    except Exception as exc:  # pydicom raises many types on corrupt input
        raise NotDicomError(f"{path}: truncated or corrupt DICOM header ({exc})") from exc
    # No 'DICM' preamble: some exporters write bare datasets. Accept only if it parses to
    # something with a SOP class, otherwise it is not DICOM at all.
    try:
        ds = pydicom.dcmread(path, defer_size=_DEFER_BYTES, force=True)
        ok = "SOPClassUID" in ds and "SOPInstanceUID" in ds
    except OSError:
        raise
    except Exception:
        ok = False
    if not ok:
        with path.open("rb") as handle:
            magic = handle.read(2)
        if magic == b"\x1f\x8b":
            raise NotDicomError(f"{path}: gzip-compressed file; decompress it first (gunzip)")
        raise NotDicomError(f"{path}: not a DICOM file (no DICM marker, no DICOM header)")
    return ds


def _text(ds: Dataset, keyword: str) -> str | None:
    value = ds.get(keyword)
    if value is None or value == "":
        return None
    return str(value).strip() or None


def _int(ds: Dataset, keyword: str) -> int | None:
    value = ds.get(keyword)
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _floats(path: Path, value: Any, keyword: str, count: int) -> list[float]:
    try:
        out = [float(v) for v in (value if isinstance(value, Sequence) else [value])]
    except (TypeError, ValueError) as exc:
        raise InconsistentGeometryError(f"{path}: {keyword} is not numeric: {value!r}") from exc
    if len(out) != count or not all(math.isfinite(v) for v in out):
        raise InconsistentGeometryError(
            f"{path}: {keyword} must hold {count} finite numbers, got {value!r}"
        )
    return out


def _non_image_reason(sop_class: UID, ds: Dataset) -> str | None:
    if sop_class == _DICOMDIR_CLASS or "DirectoryRecordSequence" in ds:
        return "DICOMDIR (a media index, not an image); the files it lists are scanned on their own"
    name = sop_class.name if sop_class.is_valid else (str(sop_class) or "no SOPClassUID")
    for word, what in _NON_IMAGE_WORDS.items():
        if word in name:
            return f"{what} ({name}), not an image"
    if str(sop_class).startswith(_SECONDARY_CAPTURE_PREFIX):
        return f"a secondary capture ({name}): a picture of an image, not an acquisition to measure"
    if not str(sop_class):  # no SOP class at all: corrupt or cut short (see _damaged)
        return None
    if "Rows" not in ds:
        return f"no image in this object ({name}: no Rows/Columns)"
    if _PIXEL_DATA not in ds:
        return f"header only: {name} object without PixelData"
    return None


def _damaged(path: Path, sop_class: UID, ds: Dataset) -> None:
    """An image storage object (or one without any SOP class) lacking Rows/Columns or PixelData:
    the file was cut short or is damaged; an image's series is then incomplete."""
    missing = "Rows/Columns" if "Rows" not in ds else "PixelData" if _PIXEL_DATA not in ds else ""
    if missing and not str(sop_class):
        raise NotDicomError(
            f"{path}: truncated or corrupt DICOM header (no SOPClassUID, no {missing})"
        )
    if missing:
        raise PixelDataError(
            f"{path}: {sop_class.name} object without {missing}: truncated or damaged file; "
            "re-export it from the source",
            series_instance_uid=_text(ds, "SeriesInstanceUID"),
        )


def _info(path: Path, ds: Dataset, modality: Modality) -> SeriesInfo:
    study = _text(ds, "StudyInstanceUID")
    series = _text(ds, "SeriesInstanceUID")
    if study is None or series is None:
        missing = "StudyInstanceUID" if study is None else "SeriesInstanceUID"
        raise UnsupportedObjectError(f"{path}: missing {missing}; the image cannot be grouped")
    warnings: list[str] = []
    return SeriesInfo(
        study_instance_uid=study,
        series_instance_uid=series,
        modality=modality,
        patient_id=undeclared_text(ds, "PatientID", warnings),
        study_date=_text(ds, "StudyDate"),
        series_number=_int(ds, "SeriesNumber"),
        series_description=undeclared_text(ds, "SeriesDescription", warnings) or "",
        patient_name=undeclared_text(ds, "PatientName", warnings),
        text_warnings=tuple(warnings),
    )


def _orientation(path: Path, value: Any, where: str) -> tuple[Vector3, Vector3]:
    iop = _floats(path, value, f"ImageOrientationPatient{where}", 6)
    row, col = np.array(iop[:3]), np.array(iop[3:])
    for name, vec in (("row", row), ("column", col)):
        if abs(np.linalg.norm(vec) - 1.0) > 1e-2:
            raise InconsistentGeometryError(
                f"{path}: ImageOrientationPatient{where} {iop} has a {name} vector "
                f"{vec.tolist()} of length {float(np.linalg.norm(vec)):.4g}, not a unit vector"
            )
    row, col = row / np.linalg.norm(row), col / np.linalg.norm(col)
    if abs(float(np.dot(row, col))) > _ORTHOGONALITY_TOLERANCE:
        raise InconsistentGeometryError(
            f"{path}: ImageOrientationPatient{where} {iop} has row and column vectors that are "
            f"not perpendicular (dot = {float(np.dot(row, col)):.4f})"
        )
    return (
        (float(row[0]), float(row[1]), float(row[2])),
        (float(col[0]), float(col[1]), float(col[2])),
    )


def _spacing(path: Path, value: Any, where: str) -> tuple[float, float]:
    ps = _floats(path, value, f"PixelSpacing{where}", 2)
    if min(ps) <= 0:
        raise InconsistentGeometryError(
            f"{path}: PixelSpacing{where} is {ps} mm; both values must be > 0"
        )
    return (ps[0], ps[1])


def _require(path: Path, ds: Dataset, keyword: str, where: str = "") -> Any:
    if keyword not in ds or ds[keyword].value in (None, "", []):
        raise MissingGeometryError(
            f"{path}: missing {keyword}{where}; without it the geometry would be guessed, "
            "so the image is skipped"
        )
    return ds[keyword].value


def _native_location(path: Path, ds: Dataset, frame_count: int) -> PixelLocation | None:
    """Offset of native little-endian pixel data, or None when pydicom must decode it."""
    meta = getattr(ds, "file_meta", None)
    ts = meta.get("TransferSyntaxUID") if meta is not None else None
    bits = _int(ds, "BitsAllocated")
    elem = ds.get_item(_PIXEL_DATA, keep_deferred=True)
    if ts not in _NATIVE_LITTLE_ENDIAN or bits not in (8, 16, 32) or elem is None:
        return None
    tell = getattr(elem, "value_tell", None)
    length = getattr(elem, "length", None)
    if getattr(elem, "value", 0) is not None or tell is None or length in (None, 0xFFFFFFFF):
        return None  # not deferred (small) or undefined length: let pydicom read it
    rows, cols = int(ds.Rows), int(ds.Columns)
    needed = rows * cols * (bits // 8) * frame_count
    file_size = path.stat().st_size
    if length < needed or tell + needed > file_size:
        raise PixelDataError(
            f"{path}: truncated pixel data: {rows}x{cols}x{frame_count} frames need {needed} "
            f"bytes, the file holds {max(0, min(length, file_size - tell))}"
        )
    signed = _int(ds, "PixelRepresentation") == 1
    dtype = f"<{'i' if signed else 'u'}{bits // 8}"
    return PixelLocation(offset=int(tell), dtype=dtype, bits_stored=_int(ds, "BitsStored") or bits)


def _rescale(path: Path, item: Dataset | None, where: str) -> tuple[float, float] | None:
    if item is None or ("RescaleSlope" not in item and "RescaleIntercept" not in item):
        return None
    slope = _floats(path, item.get("RescaleSlope", 1.0), f"RescaleSlope{where}", 1)[0]
    intercept = _floats(path, item.get("RescaleIntercept", 0.0), f"RescaleIntercept{where}", 1)[0]
    if slope == 0:
        raise InconsistentGeometryError(f"{path}: RescaleSlope{where} is 0")
    return slope, intercept


def _classic_slice(path: Path, ds: Dataset, native: PixelLocation | None) -> SliceRef:
    position = _floats(path, _require(path, ds, "ImagePositionPatient"), "ImagePositionPatient", 3)
    row_dir, col_dir = _orientation(path, _require(path, ds, "ImageOrientationPatient"), "")
    spacing = _spacing(path, _require(path, ds, "PixelSpacing"), "")
    slope, intercept = _rescale(path, ds, "") or (1.0, 0.0)
    stated = stated_spacing(ds, "")
    return SliceRef(
        path=path,
        frame=None,
        sop_instance_uid=str(ds.SOPInstanceUID),
        position=(position[0], position[1], position[2]),
        row_direction=row_dir,
        column_direction=col_dir,
        pixel_spacing=spacing,
        rows=int(ds.Rows),
        columns=int(ds.Columns),
        slope=slope,
        intercept=intercept,
        native=native,
        nominal_thickness=stated.nominal,
        spacing_between_slices=stated.spacing_between_slices,
        header_problems=stated.problems,
        gantry_tilt=gantry_tilt(ds),
        stack_key=classic_stack_key(ds),
    )


def _group_item(ds: Dataset, index: int, sequence: str) -> Dataset | None:
    """The item of a functional-group macro for one frame: per-frame first, then shared."""
    for groups in (
        ds.get("PerFrameFunctionalGroupsSequence"),
        ds.get("SharedFunctionalGroupsSequence"),
    ):
        if not groups:
            continue
        group = groups[index] if groups is ds.get("PerFrameFunctionalGroupsSequence") else groups[0]
        seq = group.get(sequence)
        if seq:
            item: Dataset = seq[0]
            return item
    return None


def _enhanced_slices(
    path: Path, ds: Dataset, frames: int, native: PixelLocation | None
) -> list[SliceRef]:
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    if not per_frame or len(per_frame) != frames:
        raise MissingGeometryError(
            f"{path}: multi-frame object with {frames} frames has "
            f"{len(per_frame) if per_frame else 0} per-frame functional groups; "
            "slice positions are unknown"
        )
    out = []
    sop = str(ds.SOPInstanceUID)
    frame_bytes = int(ds.Rows) * int(ds.Columns) * (int(ds.BitsAllocated) // 8)
    for i in range(frames):
        where = f" (frame {i + 1})"
        pos_item = _group_item(ds, i, "PlanePositionSequence")
        ori_item = _group_item(ds, i, "PlaneOrientationSequence")
        meas_item = _group_item(ds, i, "PixelMeasuresSequence")
        if pos_item is None:
            raise MissingGeometryError(f"{path}: missing PlanePositionSequence{where}")
        if ori_item is None:
            raise MissingGeometryError(f"{path}: missing PlaneOrientationSequence{where}")
        if meas_item is None:
            raise MissingGeometryError(f"{path}: missing PixelMeasuresSequence{where}")
        position = _floats(
            path, _require(path, pos_item, "ImagePositionPatient", where), "ImagePositionPatient", 3
        )
        row_dir, col_dir = _orientation(
            path, _require(path, ori_item, "ImageOrientationPatient", where), where
        )
        spacing = _spacing(path, _require(path, meas_item, "PixelSpacing", where), where)
        rescale = _rescale(path, _group_item(ds, i, "PixelValueTransformationSequence"), where)
        slope, intercept = rescale or _rescale(path, ds, "") or (1.0, 0.0)
        stated = stated_spacing(meas_item, " (PixelMeasuresSequence)")
        frame_native = (
            None
            if native is None
            else PixelLocation(native.offset + i * frame_bytes, native.dtype, native.bits_stored)
        )
        out.append(
            SliceRef(
                path=path,
                frame=i,
                sop_instance_uid=sop,
                position=(position[0], position[1], position[2]),
                row_direction=row_dir,
                column_direction=col_dir,
                pixel_spacing=spacing,
                rows=int(ds.Rows),
                columns=int(ds.Columns),
                slope=slope,
                intercept=intercept,
                native=frame_native,
                nominal_thickness=stated.nominal,
                spacing_between_slices=stated.spacing_between_slices,
                header_problems=stated.problems,
                gantry_tilt=gantry_tilt(_group_item(ds, i, "CTAcquisitionDetailsSequence"))
                if "GantryDetectorTilt" not in ds
                else gantry_tilt(ds),
                stack_key=frame_stack_key(
                    per_frame[i], _group_item(ds, i, "FrameContentSequence"), meas_item
                ),
            )
        )
    return out


def read_dicom_object(path: Path) -> DicomObject:
    """Read one file's header into a :class:`DicomObject`.

    Raises:
        NotDicomError: empty, truncated or not DICOM.
        UnsupportedObjectError: DICOMDIR, non-image objects, secondary captures, modalities
            other than CT/MR, localizers, mosaics, colour images.
        MissingGeometryError / InconsistentGeometryError: geometry absent or contradictory.
        PixelDataError: no pixel data, or fewer bytes than the image needs.
    """
    return dicom_object_from_dataset(path, read_dicom_header(path))


def dicom_object_from_dataset(path: Path, ds: Dataset) -> DicomObject:
    """The :class:`DicomObject` of a header read by :func:`read_dicom_header` from ``path``
    (raises as :func:`read_dicom_object` does).

    A damaged image's error carries what the header still tells: its series (the series is then
    incomplete) and its SOPInstanceUID, from the dataset or else the file meta group (so that a
    damaged copy of an image that is intact elsewhere can be told apart); a value the file ends
    inside is not trusted.
    """
    with quiet_pydicom(str(path)):
        try:
            cut = cut_inside(path, ds)
        except OSError as exc:
            raise UnreadableFileError.from_os_error(path, exc) from exc
        try:
            if cut is not None:
                raise truncation_error(path, ds, cut)
            return _dicom_object(path, ds)
        except UnsupportedObjectError:
            raise
        except IngestionError as exc:
            if exc.sop_instance_uid is None:
                exc.sop_instance_uid = revealed_sop(ds, cut)
            raise


def _dicom_object(path: Path, ds: Dataset) -> DicomObject:
    meta = getattr(ds, "file_meta", None)
    sop_class = UID(
        str(ds.get("SOPClassUID", ""))
        or (str(meta.get("MediaStorageSOPClassUID", "")) if meta is not None else "")
    )
    meta_class = UID(str(meta.get("MediaStorageSOPClassUID", "")) if meta is not None else "")
    # an image class in either place: a file cut inside its SOPClassUID is still an image
    image_class = any(
        "Image Storage" in c.name and not c.startswith(_SECONDARY_CAPTURE_PREFIX)
        for c in (sop_class, meta_class)
    )
    reason = None if image_class else _non_image_reason(sop_class, ds)
    if reason is not None:
        raise UnsupportedObjectError(f"{path}: {reason}")
    _damaged(path, meta_class if image_class and meta_class else sop_class, ds)
    modality_text = _text(ds, "Modality") or "unknown"
    if modality_text not in Modality.__members__:
        name = sop_class.name if sop_class.is_valid else "unknown SOP class"
        raise UnsupportedObjectError(
            f"{path}: modality {modality_text} ({name}) is an image but not CT or MR; "
            "radcaliper measures CT and MR only"
        )
    info = _info(path, ds, Modality(modality_text))
    image_type = [str(v).upper() for v in (ds.get("ImageType") or [])]
    if "LOCALIZER" in image_type or "SCOUT" in image_type:
        raise UnsupportedObjectError(
            f"{path}: localizer/scout image (ImageType {'/'.join(image_type)}); not measured"
        )
    if "MOSAIC" in image_type:
        raise UnsupportedObjectError(
            f"{path}: Siemens mosaic (many slices tiled in one image); convert it to single "
            "slices (e.g. with dcm2niix to NIfTI) first"
        )
    samples = _int(ds, "SamplesPerPixel") or 1
    if samples != 1:
        raise UnsupportedObjectError(
            f"{path}: colour image (SamplesPerPixel={samples}); CT/MR measurement needs grey values"
        )
    try:
        return DicomObject(info=info, slices=tuple(_image_planes(path, ds)))
    except (PixelDataError, MissingGeometryError, InconsistentGeometryError) as exc:
        # A damaged image of a known series: the series itself is incomplete.
        exc.series_instance_uid = info.series_instance_uid
        raise


def _image_planes(path: Path, ds: Dataset) -> list[SliceRef]:
    if "Rows" not in ds or "Columns" not in ds or "BitsAllocated" not in ds:
        raise PixelDataError(f"{path}: Rows, Columns or BitsAllocated missing")
    frames = _int(ds, "NumberOfFrames") or 1
    native = _native_location(path, ds, frames)
    if "PerFrameFunctionalGroupsSequence" in ds:
        return _enhanced_slices(path, ds, frames, native)
    if frames > 1:
        raise MissingGeometryError(
            f"{path}: multi-frame image with {frames} frames but no per-frame functional groups; "
            "the position of each frame is unknown"
        )
    return [_classic_slice(path, ds, native)]
