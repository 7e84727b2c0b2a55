"""Calibration: calibrated ranges, decode checks and the detection operating point.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.calibrate.calibration import (
        Calibration,
        DecodeCheck,
        DetectionThreshold,
        fit_calibration,
        fit_decode_check,
    )
    from model.measurer.calibrate.clicks import (
        click_pairs,
        fit_click_calibration,
    )
    from model.measurer.calibrate.operating import (
        OperatingPoint,
        detection_curve,
        fit_detection_threshold,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.calibrate.clicks": ("click_pairs", "fit_click_calibration"),
    "model.measurer.calibrate.calibration": (
        "Calibration",
        "DecodeCheck",
        "DetectionThreshold",
        "fit_calibration",
        "fit_decode_check",
    ),
    "model.measurer.calibrate.operating": (
        "OperatingPoint",
        "detection_curve",
        "fit_detection_threshold",
    ),
}

__all__ = [
    "Calibration",
    "DecodeCheck",
    "DetectionThreshold",
    "OperatingPoint",
    "click_pairs",
    "detection_curve",
    "fit_calibration",
    "fit_click_calibration",
    "fit_decode_check",
    "fit_detection_threshold",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
