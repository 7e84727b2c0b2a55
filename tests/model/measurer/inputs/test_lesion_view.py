"""The view that fits the lesion (``model.measurer.inputs.view``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ingestion.volume import Geometry, Volume
from model.measurer.inputs.view import LesionView, view_crop, view_images


def _volume() -> Volume:
    rng = np.random.default_rng(3)
    hu = rng.normal(-800.0, 20.0, (9, 64, 64)).astype(np.float32)
    hu[3:6, 28:36, 24:40] = 200.0  # a block: 16 columns x 8 rows of 0.7 mm
    geometry = Geometry(
        origin=(-20.0, -30.0, 10.0),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(2.0, 0.7, 0.7),
    )
    return Volume.in_memory(hu, geometry, name="view")


def test_field_follows_the_long_axis_and_is_clamped() -> None:
    view = LesionView(fill=0.5, min_field_mm=8.0, max_field_mm=320.0)
    assert view.field_for(20.0) == pytest.approx(40.0)
    assert view.field_for(1.0) == 8.0
    assert view.field_for(400.0) == 320.0
    assert view.field_for(float("nan")) == view.first_look_mm
    assert view.field_for(0.0) == view.first_look_mm


@pytest.mark.parametrize(
    "changes",
    [
        {"size": 100},
        {"size": 0},
        {"fill": 0.0},
        {"fill": 1.0},
        {"first_look_mm": -1.0},
        {"min_field_mm": float("inf")},
        {"min_field_mm": 50.0, "max_field_mm": 10.0},
        {"frames": 0},
        {"slices": -1},
        {"window": (40.0, -1.0)},
    ],
)
def test_bad_views_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LesionView(**changes)  # type: ignore[arg-type]


def test_json_round_trip_and_unknown_keys() -> None:
    view = LesionView(size=112, fill=0.4, slices=2)
    assert LesionView.from_json(view.to_json()) == view
    with pytest.raises(ValueError, match="unknown lesion view keys"):
        LesionView.from_json({**view.to_json(), "zoom": 2})
    with pytest.raises(ValueError, match="JSON object"):
        LesionView.from_json([1, 2])


def test_view_crop_spans_the_field_on_its_pixels() -> None:
    volume = _volume()
    view = LesionView(size=56, frames=3)
    centre = volume.geometry.index_to_lps(np.array([4.0, 31.5, 31.5]))
    crop = view_crop(volume, centre, 28.0, view)
    assert crop.image.shape == (3, 2, 56, 56)
    assert crop.pixel_mm == pytest.approx(0.5)
    assert crop.slice_mm == pytest.approx(2.0)
    # the block (11.2 mm wide, 5.6 mm tall) spans its width in pixels of the view
    soft = crop.image[1, 0]  # the centre frame, soft-tissue window
    inside = soft > 0.45  # half way between the lung (0) and the block (0.9)
    rows, cols = np.nonzero(inside.numpy())
    assert (cols.max() - cols.min() + 1) * 0.5 == pytest.approx(11.2, abs=1.0)
    assert (rows.max() - rows.min() + 1) * 0.5 == pytest.approx(5.6, abs=1.0)
    images = view_images(crop)
    assert images.shape == (3, 3, 56, 56)
    assert torch.allclose(images[:, 1], 1.0 - images[:, 0])
    # the lung window shows the lung the soft-tissue window leaves black
    lung = images[1, 2][~inside]
    assert float(lung.mean()) > 0.05 and float(soft[~inside].max()) == 0.0


def test_view_crop_refuses_a_bad_field() -> None:
    volume = _volume()
    with pytest.raises(ValueError, match="field_mm"):
        view_crop(volume, (0.0, 0.0, 14.0), 0.0, LesionView())
