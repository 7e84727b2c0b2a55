"""The view that fits the lesion: the clicked caliper's crop, resampled to the lesion's size.

A fixed crop (the measure task's: a field sized for the largest finding) shows a 5 mm nodule on
a few pixels and cuts a 100 mm mass; a model that reads millimetres off such a crop has to learn
every size separately. The clicked caliper instead looks twice:

1. **first look**: a crop of :attr:`LesionView.first_look_mm` at the click, which says whether
   a lesion is there (the point task) and where its long axis lies (the axes task);
2. **the view**: a crop centred on that axis' midpoint whose field is the axis' length divided
   by :attr:`LesionView.fill`, so the lesion spans about that fraction of it whatever its size;
   it is resampled to :attr:`LesionView.size` pixels. The caliper is drawn there (the axes
   task's answer: end points in the view's own pixels) on the click's slice and on its
   neighbours, and the values are the end points' distances in mm.

Every crop has :attr:`LesionView.frames` axial frames (the neighbouring slices as 3-D context,
the multi-frame Circle-RoPE positions) and two windows in its channels: a soft-tissue window
and a lung window that shows a nodule's partial-volume rim (``images.two_window_channels``).
Nothing here knows a lesion size: the field follows what the model drew.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from model.measurer.inputs.settings import SIDE_MULTIPLE, hu_window

if TYPE_CHECKING:  # the settings (radcaliper.json) import this module: no torch at import
    import torch

    from ingestion.volume import Volume
    from model.measurer.inputs.images import Crop

__all__ = ["LesionView", "view_crop", "view_images"]


@dataclass(frozen=True)
class LesionView:
    """How the clicked caliper's crops are made (stored with the click model).

    Args:
        size: crop side in pixels (a multiple of 28): 168 px is 6 x 6 merged image tokens a
            frame, so a lesion at ``fill`` 0.5 spans 84 px.
        fill: the fraction of the field the lesion's long axis spans in the view.
        first_look_mm: the first look's field (mm).
        min_field_mm, max_field_mm: the view's field is clamped to these (mm).
        frames: axial frames per crop, the volume's own slice spacing apart.
        window: (level, width) of the soft-tissue window (first and second channel).
        second_window: (level, width) of the lung window (third channel).
        slices: the view is drawn on the click's slice and up to this many slices above and
            below it within the first look's extent; the longest long axis is kept.
        looks: after the first look, up to this many more looks, each at the field the last
            drawing asks for, until the field settles (within 10 %).
        zoom_step: a look zooms in or out by at most this factor: a lesion the last look
            under-measured is never cut by the next one's field.
    """

    size: int = 168
    fill: float = 0.5
    first_look_mm: float = 48.0
    min_field_mm: float = 8.0
    max_field_mm: float = 320.0
    frames: int = 3
    window: tuple[float, float] = field(default=(40.0, 400.0))
    second_window: tuple[float, float] = field(default=(-600.0, 1500.0))
    slices: int = 3
    looks: int = 3
    zoom_step: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or self.size < SIDE_MULTIPLE or self.size % SIDE_MULTIPLE:
            raise ValueError(
                f"size must be a positive multiple of {SIDE_MULTIPLE}, got {self.size}"
            )
        if not (0.05 <= self.fill <= 0.95):
            raise ValueError(f"fill must be in [0.05, 0.95], got {self.fill}")
        for name in ("first_look_mm", "min_field_mm", "max_field_mm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0 mm, got {value}")
        if self.min_field_mm > self.max_field_mm:
            raise ValueError(
                f"min_field_mm {self.min_field_mm} is above max_field_mm {self.max_field_mm}"
            )
        if self.frames < 1 or self.slices < 0:
            raise ValueError(
                f"frames must be >= 1 and slices >= 0, got {self.frames}, {self.slices}"
            )
        if self.looks < 0 or not (math.isfinite(self.zoom_step) and self.zoom_step > 1.0):
            raise ValueError(
                f"looks must be >= 0 and zoom_step > 1, got {self.looks}, {self.zoom_step}"
            )
        object.__setattr__(self, "window", hu_window("window", self.window))
        object.__setattr__(self, "second_window", hu_window("second_window", self.second_window))

    def next_field(self, field_mm: float, long_axis_mm: float) -> float:
        """The next look's field after a drawing of ``long_axis_mm`` in a field of
        ``field_mm``: :meth:`field_for`, by at most ``zoom_step`` from ``field_mm``."""
        wanted = self.field_for(long_axis_mm)
        return min(field_mm * self.zoom_step, max(field_mm / self.zoom_step, wanted))

    def field_for(self, long_axis_mm: float) -> float:
        """The view's field (mm) for a lesion whose long axis is ``long_axis_mm``."""
        if not (math.isfinite(long_axis_mm) and long_axis_mm > 0):
            return self.first_look_mm
        return min(self.max_field_mm, max(self.min_field_mm, long_axis_mm / self.fill))

    def to_json(self) -> dict[str, object]:
        return {
            "size": self.size,
            "fill": self.fill,
            "first_look_mm": self.first_look_mm,
            "min_field_mm": self.min_field_mm,
            "max_field_mm": self.max_field_mm,
            "frames": self.frames,
            "window": list(self.window),
            "second_window": list(self.second_window),
            "slices": self.slices,
            "looks": self.looks,
            "zoom_step": self.zoom_step,
        }

    @classmethod
    def from_json(cls, data: object) -> LesionView:
        if not isinstance(data, dict):
            raise ValueError(f"a lesion view must be a JSON object, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown lesion view keys {unknown}; known: {sorted(known)}")
        values = dict(data)
        for key in ("window", "second_window"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


def view_crop(
    volume: Volume, centre_lps_mm: Sequence[float], field_mm: float, view: LesionView
) -> Crop:
    """The crop of ``field_mm`` (mm, side) centred on ``centre_lps_mm``: ``view.size`` pixels,
    ``view.frames`` frames at the volume's slice spacing, the two windows as channels."""
    from model.measurer.inputs.images import crop_around

    if not (math.isfinite(field_mm) and field_mm > 0):
        raise ValueError(f"field_mm must be > 0, got {field_mm}")
    return crop_around(
        volume,
        centre_lps_mm,
        pixel_mm=field_mm / view.size,
        size=view.size,
        window=(view.window, view.second_window),
        slices=view.frames,
    )


def view_images(crop: Crop) -> torch.Tensor:
    """(F, 3, H, W) a view crop in the model's channels: ``(soft, 1 - soft, lung)``."""
    from model.measurer.inputs.images import two_window_channels

    return two_window_channels(crop.image).contiguous()
