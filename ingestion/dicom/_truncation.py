"""A DICOM file that ends inside an element: found, named, and what it still reveals.

A cut at an element boundary cannot be told from a shorter header (it is found later by what is
missing: Rows, PixelData); a cut inside an element can, and must be: pydicom keeps the part of
the value it could read, e.g. a SOPClassUID ``1.2.840.10008.`` that would otherwise pass for an
odd SOP class, or raise a validation warning when it is read.

What a damaged file still reveals (README "Ingestion rules"): its series when its
SeriesInstanceUID was read whole (the series is then incomplete), and its image, from the
dataset's SOPInstanceUID or else the file meta group's MediaStorageSOPInstanceUID (a damaged
copy of an image that another file holds intact is then told apart). A file cut inside its file
meta group reveals neither.
"""

from __future__ import annotations

from pathlib import Path

from pydicom.datadict import keyword_for_tag
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset

from ingestion.dicom._header_values import raw_text
from ingestion.errors import IngestionError, NotDicomError, PixelDataError

__all__ = ["META", "Cut", "cut_inside", "revealed_sop", "truncation_error"]

META = "the file meta information"
_PLAUSIBLE_BYTES = 1 << 28  # a header element longer than 256 MiB is a misread length
Cut = tuple[str, int, int]  # (element the file ends inside, bytes it needs, bytes it holds)


def cut_inside(path: Path, ds: Dataset) -> Cut | None:
    """``(element, bytes it needs, bytes the file holds)`` when the file ends inside an element
    (its file meta group, or the last element read, which holds the rest of the file); None
    for a file that ends where its last element does (module doc)."""
    size = path.stat().st_size
    meta = getattr(ds, "file_meta", None)
    group_length = meta.get("FileMetaInformationGroupLength") if meta is not None else None
    if isinstance(group_length, int) and ds.preamble is not None:
        end = 132 + 12 + group_length  # preamble, 'DICM', the group length element, the group
        if end > size:
            return (META, end - 132, size - 132)
    tags = list(ds.keys())
    if not tags:
        return None
    elem = ds.get_item(max(tags), keep_deferred=True)
    if not isinstance(elem, RawDataElement) or elem.length == 0xFFFFFFFF:
        return None  # read as a whole (a sequence of undefined length) or already parsed
    name = keyword_for_tag(elem.tag) or str(elem.tag)
    # a deferred value's bytes were not read yet: the file size says how many there are
    have = max(0, size - elem.value_tell) if elem.value is None else len(elem.value)
    return (name, elem.length, have) if have < elem.length else None


def revealed_sop(ds: Dataset, cut: Cut | None) -> str | None:
    """The SOPInstanceUID a damaged file still reveals (module doc), or None."""
    element = None if cut is None else cut[0]
    if element == META:
        return None
    if element != "SOPInstanceUID" and (sop := raw_text(ds, "SOPInstanceUID")):
        return sop
    meta = getattr(ds, "file_meta", None)
    return raw_text(meta, "MediaStorageSOPInstanceUID") or None


def truncation_error(path: Path, ds: Dataset, cut: Cut) -> IngestionError:
    """The error for a file cut inside an element, with the series it still reveals."""
    element, need, have = cut
    series = raw_text(ds, "SeriesInstanceUID") if element != "SeriesInstanceUID" else ""
    if element == "PixelData":
        return PixelDataError(
            f"{path}: truncated pixel data: the file holds {have} of its {need} bytes; "
            "re-export it from the source",
            series_instance_uid=series or None,
        )
    # an element that is no known attribute, or a length beyond any header: garbage, not a cut
    what = "truncated" if element[0] != "(" and need < _PLAUSIBLE_BYTES else "truncated or corrupt"
    return NotDicomError(
        f"{path}: {what} DICOM header: the file ends inside {element} ({have} of "
        f"{need} bytes); re-export it from the source",
        series_instance_uid=series or None,
    )
