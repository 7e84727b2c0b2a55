"""Header values read as written, without pydicom converting them (a DS such as 'thick' raises
when converted, a cut UID warns): what tells the stacks of a series apart, the gantry tilt tag,
the stated slice spacing, and text in an undeclared character set.

Stack keys. A series sometimes holds more than one stack of planes: two reconstructions of one
scan (two slice thicknesses or kernels), magnitude and phase or a field map, echoes, time points.
Their planes then repeat positions or interleave, and the series does not stack as a whole. The
*stack key* of a plane names what such stacks differ in (README "Ingestion rules"):

- classic images: SliceThickness, ConvolutionKernel, EchoNumbers, ImageType;
- frames of an enhanced object: the frame type (``*FrameTypeSequence`` FrameType), the
  FrameContentSequence StackID and TemporalPositionIndex, and the frame's SliceThickness.

The key is only used when a series fails to stack as a whole (``ingestion.dicom.stack``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.tag import Tag

__all__ = [
    "StackKey",
    "StatedSpacing",
    "classic_stack_key",
    "frame_stack_key",
    "gantry_tilt",
    "raw_text",
    "stated_spacing",
    "undeclared_text",
]

StackKey = tuple[tuple[str, str], ...]  # (attribute, value as written), in a fixed order

_CLASSIC = ("SliceThickness", "ConvolutionKernel", "EchoNumbers", "ImageType")


def raw_text(item: Dataset | None, keyword: str) -> str:
    """A value as written ("" when absent), without pydicom converting it (a DS such as
    'thick' raises when converted); multiple values joined with a backslash."""
    elem = item.get_item(Tag(keyword)) if item is not None and keyword in item else None
    if elem is None:
        return ""
    value = elem.value
    if isinstance(value, bytes):
        return value.decode("ascii", errors="replace").strip(" \0")
    if value is None:
        return ""
    if isinstance(value, list | tuple | MultiValue):
        return "\\".join(str(v) for v in value)
    return str(value).strip()


def classic_stack_key(ds: Dataset) -> StackKey:
    """The stack key of a single-frame image (module doc)."""
    return tuple((keyword, raw_text(ds, keyword)) for keyword in _CLASSIC)


def _frame_type(group: Dataset | None) -> str:
    if group is None:
        return ""
    for elem in group:
        keyword = elem.keyword or ""
        if keyword.endswith("FrameTypeSequence") and elem.value:
            return raw_text(elem.value[0], "FrameType")
    return ""


def frame_stack_key(
    per_frame: Dataset | None, content: Dataset | None, measures: Dataset | None
) -> StackKey:
    """The stack key of one frame of an enhanced object, from its per-frame functional group,
    its FrameContentSequence item and its PixelMeasuresSequence item (module doc)."""
    return (
        ("FrameType", _frame_type(per_frame)),
        ("StackID", raw_text(content, "StackID")),
        ("TemporalPositionIndex", raw_text(content, "TemporalPositionIndex")),
        ("SliceThickness", raw_text(measures, "SliceThickness")),
    )


def gantry_tilt(item: Dataset | None) -> float | None:
    """GantryDetectorTilt in degrees, or None when absent or not a finite number."""
    text = raw_text(item, "GantryDetectorTilt").split("\\")[0]
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class StatedSpacing:
    """What a header states about slice spacing: the usable values, and the unusable ones."""

    spacing_between_slices: float | None
    thickness: float | None
    problems: tuple[str, ...]

    @property
    def nominal(self) -> float | None:
        return self.spacing_between_slices or self.thickness


def stated_spacing(item: Dataset | None, where: str) -> StatedSpacing:
    """SpacingBetweenSlices and SliceThickness; a value that is not a number > 0 mm is left
    out and named (tag and value) in ``problems``."""
    values: dict[str, float | None] = {}
    problems = []
    for keyword in ("SpacingBetweenSlices", "SliceThickness"):
        raw = raw_text(item, keyword)
        values[keyword] = None
        if raw == "":
            continue
        try:
            value = float(raw)
        except ValueError:
            problems.append(f"{keyword}{where} is {str(raw)!r}, not a number")
            continue
        if not math.isfinite(value) or value <= 0:
            problems.append(f"{keyword}{where} is {value:g} mm; a slice spacing must be > 0")
            continue
        values[keyword] = value
    return StatedSpacing(values["SpacingBetweenSlices"], values["SliceThickness"], tuple(problems))


def undeclared_text(ds: Dataset, keyword: str, warnings: list[str]) -> str | None:
    """A text value, decoded as the file declares (SpecificCharacterSet, through pydicom).

    A file that declares no character set is in the default repertoire (ASCII, DICOM PS3.5
    6.1.2.2). When such a value holds other bytes anyway, it is read as UTF-8 if the bytes are
    valid UTF-8 (what most systems that leave the tag out write), else as ISO 8859-1 (Latin-1,
    which every byte string is), and a warning naming the tag (never the value) is added to
    ``warnings``: the text is a guess, never silent mojibake.
    """
    elem = ds.get_item(Tag(keyword)) if keyword in ds else None
    raw = elem.value if elem is not None else None
    if "SpecificCharacterSet" in ds or not isinstance(raw, bytes) or raw.isascii():
        value = ds.get(keyword)
        return None if value is None or value == "" else (str(value).strip() or None)
    try:
        text, read_as = raw.decode("utf-8"), "UTF-8"
    except UnicodeDecodeError:
        text, read_as = raw.decode("latin-1"), "ISO 8859-1 (Latin-1)"
    warnings.append(
        f"{keyword} holds non-ASCII bytes but the file declares no SpecificCharacterSet (the "
        f"default repertoire is ASCII); read as {read_as}: check it against the source"
    )
    return text.strip(" \0") or None
