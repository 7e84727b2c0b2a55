"""What tells the stacks of one series apart, read from a header without converting values.

A series sometimes holds more than one stack of planes: two reconstructions of one scan (two
slice thicknesses or kernels), magnitude and phase or a field map, echoes, time points. Their
planes then repeat positions or interleave, and the series does not stack as a whole. The
*stack key* of a plane names what such stacks differ in (README "Ingestion rules"):

- classic images: SliceThickness, ConvolutionKernel, EchoNumbers, ImageType;
- frames of an enhanced object: the frame type (``*FrameTypeSequence`` FrameType), the
  FrameContentSequence StackID and TemporalPositionIndex, and the frame's SliceThickness.

The key is only used when a series fails to stack as a whole (``ingestion.stack``).
"""

from __future__ import annotations

import math

from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.tag import Tag

__all__ = ["StackKey", "classic_stack_key", "frame_stack_key", "gantry_tilt", "raw_text"]

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
