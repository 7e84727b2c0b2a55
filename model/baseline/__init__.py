"""The classical click-seeded baseline: threshold, clean and measure a clicked lesion with no
model and no training (:mod:`model.baseline.click_segmentation`). A yardstick that
``evaluate`` scores beside the measurer, and a possible reviewer's flag; never the product's
number.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.baseline.click_segmentation import (
        BASELINE_INFO,
        ClickSegmentation,
        ClickSegmentationSettings,
        SliceSegmentation,
        segment_click,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.baseline.click_segmentation": (
        "BASELINE_INFO",
        "ClickSegmentation",
        "ClickSegmentationSettings",
        "SliceSegmentation",
        "segment_click",
    ),
}

__all__ = [
    "BASELINE_INFO",
    "ClickSegmentation",
    "ClickSegmentationSettings",
    "SliceSegmentation",
    "segment_click",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
