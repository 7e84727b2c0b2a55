"""The clicked caliper (``model.measurer.infer.click``) with a scripted model: what it asks,
which drawing it keeps, and that its values are its end points' distances."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from ingestion.errors import ModelError
from ingestion.volume import Geometry, Volume
from model.measurer.calibrate.calibration import fit_binned_calibration
from model.measurer.infer.click import ClickCaliper
from model.measurer.inputs.data import AxesExample, PointExample
from model.measurer.inputs.view import LesionView
from model.measurer.results import FindingKind
from model.measurer.tasks.axes import axes_answer, segments_to_pixels

SLICE_MM = 2.0
CENTRE = (1.0, -2.0, 0.0)


def _volume() -> Volume:
    geometry = Geometry(
        origin=(-40.0, -40.0, -10.0),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(SLICE_MM, 1.0, 1.0),
    )
    return Volume.in_memory(np.full((11, 80, 80), -800.0, np.float32), geometry, name="click")


def true_long(z: float) -> float:
    """The scripted lesion's long axis on the slice at ``z``: 20 mm at z = 2, less elsewhere."""
    return max(2.0, 20.0 - 3.0 * abs(z - 2.0))


@dataclass
class Answer:
    text: str


class Scripted:
    """Answers like a perfect click model; ``point`` and ``axes`` override its texts."""

    def __init__(self, point: str = "lesion 20 x 12 mm", axes: str | None = None) -> None:
        self.point = point
        self.axes = axes
        self.batches: list[list[str]] = []

    def generate(self, examples: Sequence[object], max_new_tokens: int) -> list[Answer]:
        self.batches.append([type(e).__name__ for e in examples])
        out = []
        for example in examples:
            if isinstance(example, PointExample):
                out.append(Answer(self.point))
            else:
                assert isinstance(example, AxesExample)
                out.append(Answer(self.axes if self.axes is not None else self._draw(example)))
        return out

    @staticmethod
    def _draw(example: AxesExample) -> str:
        z = example.crop.center_lps_mm[2]
        half, short = true_long(z) / 2, 0.6 * true_long(z) / 2
        x, y = CENTRE[0], CENTRE[1]
        segments = (((x - half, y, z), (x + half, y, z)), ((x, y - short, z), (x, y + short, z)))
        return axes_answer(
            FindingKind.LESION, segments_to_pixels(segments, example.crop.lps_to_pixel)
        )


def test_the_longest_slice_is_measured_and_values_are_end_point_distances() -> None:
    model = Scripted()
    view = LesionView(size=56, slices=3)
    found = ClickCaliper(model, view, None).measure_at(_volume(), (CENTRE[0] + 3, CENTRE[1], 0.0))
    assert found is not None and found.kind == FindingKind.LESION
    long_axis, short_axis = found.measurements
    # the click's slice (z 0) shows 14 mm; the view's slices reach z 2, where it is 20 mm
    assert long_axis.value_mm == pytest.approx(20.0, abs=0.1)
    assert short_axis.value_mm == pytest.approx(12.0, abs=0.1)
    assert found.axes_lps_mm is not None
    for measurement, (a, b) in zip(found.measurements, found.axes_lps_mm, strict=True):
        assert math.dist(a, b) == pytest.approx(measurement.value_mm, abs=1e-9)
    assert found.center_lps_mm[2] == pytest.approx(2.0)
    # one batch for the first look (point + axes), one more look (the 48 mm first look
    # drew 14 mm: a 28 mm field, where it draws 14 mm again: settled), one for the slices
    assert model.batches[0] == ["PointExample", "AxesExample"]
    assert model.batches[1] == ["AxesExample"]
    assert model.batches[2] == ["AxesExample"] * 7
    assert long_axis.range_mm is None  # not calibrated: no range


def test_nothing_here_is_none() -> None:
    caliper = ClickCaliper(Scripted(point="none"), LesionView(size=56), None)
    assert caliper.measure_at(_volume(), CENTRE) is None


def test_a_malformed_point_answer_raises() -> None:
    caliper = ClickCaliper(Scripted(point="blah ]["), LesionView(size=56), None)
    with pytest.raises(ModelError, match="malformed"):
        caliper.measure_at(_volume(), CENTRE)


def test_no_drawing_is_not_measurable_never_a_number() -> None:
    caliper = ClickCaliper(Scripted(axes="long axis [1, 2"), LesionView(size=56), None)
    found = caliper.measure_at(_volume(), CENTRE)
    assert found is not None
    assert all(m.value_mm is None and m.reason for m in found.measurements)
    assert found.axes_lps_mm is None


@pytest.mark.parametrize("point", [(0.0, 0.0), (0.0, math.nan, 1.0), (math.inf, 0.0, 0.0)])
def test_bad_points_are_refused(point: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="three finite numbers"):
        ClickCaliper(Scripted(), LesionView(size=56), None).measure_at(_volume(), point)


def test_ranges_come_from_the_value_s_size_bin() -> None:
    rng = np.random.default_rng(5)
    pairs = []
    for true in rng.uniform(3.0, 40.0, 300):
        error = rng.normal(0.0, 0.05 if true < 10 else 0.2) * true
        pairs.append(("long_axis", true + error, true))
        pairs.append(("short_axis", 0.6 * (true + error), 0.6 * true))
    calibration = fit_binned_calibration(pairs, (6.0, 10.0, 20.0))
    caliper = ClickCaliper(Scripted(), LesionView(size=56), calibration)
    found = caliper.measure_at(_volume(), CENTRE)
    assert found is not None
    long_axis = found.measurements[0]
    assert long_axis.range_mm is not None and long_axis.coverage == 0.9
    low, high = long_axis.range_mm
    assert low <= long_axis.value_mm <= high
    expected = calibration.interval("long_axis", long_axis.value_mm or 0.0)
    assert (low, high) == expected


def test_looks_zoom_by_at_most_the_step_and_stop_when_settled() -> None:
    view = LesionView(first_look_mm=48.0, zoom_step=2.0, fill=0.5, min_field_mm=8.0)
    assert view.next_field(48.0, 2.0) == 24.0  # wants 8 mm: half the field at most
    assert view.next_field(48.0, 60.0) == 96.0  # wants 120 mm: twice at most
    assert view.next_field(48.0, 20.0) == pytest.approx(40.0)
    with pytest.raises(ValueError, match="zoom_step"):
        LesionView(zoom_step=1.0)
    with pytest.raises(ValueError, match="looks"):
        LesionView(looks=-1)


def test_no_more_looks_without_looks() -> None:
    model = Scripted()
    found = ClickCaliper(model, LesionView(size=56, looks=0), None).measure_at(_volume(), CENTRE)
    assert found is not None
    assert len(model.batches) == 2  # the first look, then the slices at its field
