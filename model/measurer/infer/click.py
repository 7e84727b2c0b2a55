"""The clicked caliper: a click model draws the caliper in a view that fits the lesion.

``ClickCaliper.measure_at(volume, point)``:

1. **first look** (one batch): at the click, a crop of the view's ``first_look_mm`` asked the
   point task (a lesion here, or "none") and the axes task (where its long axis lies);
2. **looks** (one answer each, up to ``LesionView.looks``): centred on the last drawing, at the
   field it asks for (``LesionView.next_field``: the lesion spanning ``fill`` of it, zooming by
   at most ``zoom_step``), until the field settles;
3. **the view** (one batch): crops at the settled field on the click's slice and up to
   ``slices`` neighbours each side within half the settled long axis, each asked the axes task;
   the caliper of the slice with the longest long axis is the answer, as a reader measures a
   lesion where it is longest.

The values are the distances between the drawn end points (the caliper is the measurement),
with the click model's calibrated ranges. A malformed drawing on every slice gives "not
measurable" with the reason, never a number without its caliper. No image rule places or moves
an end point: they are the model's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ingestion.errors import ModelError
from ingestion.volume import Volume
from model.measurer.calibrate.calibration import Calibration
from model.measurer.infer.stages import drawn_segments, source_slice
from model.measurer.inputs.data import AxesExample, PointExample, Prompted
from model.measurer.inputs.images import Crop, native_slice_mm
from model.measurer.inputs.view import LesionView, view_crop, view_images
from model.measurer.results import (
    MEASUREMENTS_OF,
    FindingKind,
    Measurement,
    Segment3,
    StudyFinding,
)
from model.measurer.tasks.axes import axes_prompt
from model.measurer.tasks.text import parse_point, point_prompt

__all__ = ["Answered", "ClickCaliper", "ClickDrawing", "Generator"]

logger = logging.getLogger(__name__)

MAX_TOKENS = 48

Vector3 = tuple[float, float, float]


class Answered(Protocol):
    """One generated answer."""

    @property
    def text(self) -> str: ...


class Generator(Protocol):
    """What the click caliper asks: ``CheckpointMeasurer.generate``'s first two arguments."""

    def generate(self, examples: Sequence[Prompted], max_new_tokens: int) -> Sequence[Answered]: ...


@dataclass(frozen=True)
class ClickDrawing:
    """One drawn caliper: LPS end points of the long and short axis."""

    long_axis: Segment3
    short_axis: Segment3

    @property
    def long_mm(self) -> float:
        a, b = (np.asarray(p) for p in self.long_axis)
        return float(np.linalg.norm(b - a))

    @property
    def short_mm(self) -> float:
        c, d = (np.asarray(p) for p in self.short_axis)
        return float(np.linalg.norm(d - c))

    @property
    def midpoint(self) -> Vector3:
        a, b = (np.asarray(p) for p in self.long_axis)
        m = 0.5 * (a + b)
        return (float(m[0]), float(m[1]), float(m[2]))


def _drawing(crop: Crop, text: str) -> ClickDrawing | None:
    drawn = drawn_segments(crop, text, FindingKind.LESION)
    if drawn is None:
        logger.info("a caliper drawing was malformed")
        return None
    long_axis, short_axis = drawn
    return ClickDrawing(long_axis, short_axis)


class ClickCaliper:
    """Answers clicks with a click model (module doc)."""

    def __init__(self, model: Generator, view: LesionView, calibration: Calibration | None) -> None:
        self.model = model
        self.view = view
        self.calibration = calibration

    def _axes(self, crop: Crop) -> AxesExample:
        return AxesExample(FindingKind.LESION, view_images(crop), axes_prompt("lesion"), None, crop)

    def first_look(self, volume: Volume, point: Vector3) -> tuple[str, ClickDrawing | None]:
        """The point answer's text and the first look's drawing (None where malformed)."""
        crop = view_crop(volume, point, self.view.first_look_mm, self.view)
        images = view_images(crop)
        examples: list[Prompted] = [PointExample(images, point_prompt(), None), self._axes(crop)]
        answers = self.model.generate(examples, MAX_TOKENS)
        texts = [str(a.text) for a in answers]
        return texts[0], _drawing(crop, texts[1])

    def settle(
        self, volume: Volume, point: Vector3, first: ClickDrawing
    ) -> tuple[float, ClickDrawing]:
        """More looks after the first (``LesionView.looks``), each centred on the last drawing
        at the field it asks for, zooming by at most ``zoom_step``, until the field settles:
        (the field, the last drawing). A malformed look ends the search at the last good one."""
        field = self.view.first_look_mm
        drawing = first
        for _ in range(self.view.looks):
            wanted = self.view.next_field(field, drawing.long_mm)
            if abs(wanted - field) <= 0.1 * field:
                break
            centre = (drawing.midpoint[0], drawing.midpoint[1], point[2])
            crop = view_crop(volume, centre, wanted, self.view)
            answer = self.model.generate([self._axes(crop)], MAX_TOKENS)[0]
            looked = _drawing(crop, str(answer.text))
            if looked is None:
                break
            field, drawing = wanted, looked
        return self.view.field_for(drawing.long_mm), drawing

    def drawings(
        self, volume: Volume, point: Vector3, first: ClickDrawing
    ) -> list[tuple[float, ClickDrawing | None]]:
        """The view's drawings on the click's slice and its neighbours: (z offset mm, drawing,
        None where malformed), at the field the looks settled on (:meth:`settle`)."""
        field, settled = self.settle(volume, point, first)
        centre = settled.midpoint
        dz = native_slice_mm(volume.geometry)
        reach = min(self.view.slices, int(0.5 * settled.long_mm / dz))
        offsets = [j * dz for j in range(-reach, reach + 1)]
        crops = [
            view_crop(volume, (centre[0], centre[1], point[2] + dz_j), field, self.view)
            for dz_j in offsets
        ]
        answers = self.model.generate([self._axes(c) for c in crops], MAX_TOKENS)
        return [
            (dz_j, _drawing(crop, str(a.text)))
            for dz_j, crop, a in zip(offsets, crops, answers, strict=True)
        ]

    def measure_at(self, volume: Volume, point_lps_mm: Sequence[float]) -> StudyFinding | None:
        """The lesion under the click with its caliper, or None where the model sees none."""
        point = tuple(float(v) for v in point_lps_mm)
        if len(point) != 3 or not all(math.isfinite(v) for v in point):
            raise ValueError(f"point_lps_mm must be three finite numbers, got {point_lps_mm!r}")
        click = (point[0], point[1], point[2])
        text, first = self.first_look(volume, click)
        parsed = parse_point(text)
        if parsed.success and parsed.kind is None:
            return None
        if not parsed.success and parsed.kind is None:
            raise ModelError(
                f"the click model's answer at this point was malformed ({parsed.reason}); "
                "nothing was measured there"
            )
        if first is None:
            return self._not_measurable(click, volume, "the first look drew no caliper")
        drawn = [d for _, d in self.drawings(volume, click, first) if d is not None]
        if not drawn:
            return self._not_measurable(click, volume, "no slice of the view drew a caliper")
        best = max(drawn, key=lambda d: d.long_mm)
        values = (best.long_mm, best.short_mm)
        if values[1] > values[0]:  # the short axis is never the longer one
            best = ClickDrawing(best.short_axis, best.long_axis)
            values = (best.long_mm, best.short_mm)
        calibration = self.calibration
        measurements = []
        for name, value in zip(MEASUREMENTS_OF[FindingKind.LESION], values, strict=True):
            interval = None if calibration is None else calibration.interval(name, value)
            coverage = (
                None if calibration is None or interval is None else calibration.coverage(name)
            )
            measurements.append(Measurement(name, value, interval, coverage))
        centre = best.midpoint
        return StudyFinding(
            1,
            FindingKind.LESION,
            centre,
            source_slice(volume, centre),
            tuple(measurements),
            (best.long_axis, best.short_axis),
        )

    def _not_measurable(self, click: Vector3, volume: Volume, reason: str) -> StudyFinding:
        measurements = tuple(
            Measurement.not_measurable(name, reason) for name in MEASUREMENTS_OF[FindingKind.LESION]
        )
        return StudyFinding(1, FindingKind.LESION, click, source_slice(volume, click), measurements)
