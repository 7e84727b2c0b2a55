"""The classical click-seeded baseline (``model.baseline``): known ellipses in a noisy lung-like
background measured within a pixel, the caliper invariant, vessels and a chest wall cut off,
nothing in plain lung, and three real LIDC crops near the readers' median."""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from ingestion.geometry import Geometry
from ingestion.load import load_path
from ingestion.volume import Volume
from model.baseline import (
    BASELINE_INFO,
    ClickSegmentation,
    ClickSegmentationSettings,
    segment_click,
)
from model.measurer.evaluate.clicks import lesion_clicks
from model.measurer.results import FindingKind, MeasurementName, StudyFinding

REPOSITORY = Path(__file__).resolve().parents[3]
_SHARED = os.environ.get("RADCALIPER_SHARED_DATA")
LIDC = (Path(_SHARED) if _SHARED else REPOSITORY.parent / "shared" / "data") / "lidc-nodules"
LUNG_HU, NODULE_HU, WALL_HU = -850.0, 20.0, 40.0


def scene(
    semi_mm: tuple[float, float],
    angle: float = 0.0,
    spacing: tuple[float, float] = (0.7, 0.7),
    *,
    seed: int = 0,
    vessel: bool = False,
    wall: bool = False,
    lesion: bool = True,
) -> tuple[Volume, tuple[float, float, float]]:
    """Three slices of lung (-850 HU, noise SD 30 HU) with an ellipse of soft tissue (20 HU;
    semi-axes in mm, rotated by ``angle``) in the middle of slice 1, the scanner's blur (a
    0.7 mm Gaussian) and the partial volume of its pixels; optionally a 2 mm vessel running
    from it to the right, or a chest wall (40 HU) touching it on the right. Returns the
    volume and the lesion's centre (LPS mm)."""
    rng = np.random.default_rng(seed)
    n = 96
    geometry = Geometry(
        origin=(-30.0, -30.0, 10.0),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(2.0, *spacing),
    )
    rows, cols = np.mgrid[:n, :n].astype(np.float64)
    covered = np.zeros((n, n))
    sub = (np.arange(4) + 0.5) / 4 - 0.5  # 4 x 4 points per pixel
    for dr in sub:
        for dc in sub:
            y, x = (rows + dr - n / 2) * spacing[0], (cols + dc - n / 2) * spacing[1]
            u = np.cos(angle) * x + np.sin(angle) * y
            v = -np.sin(angle) * x + np.cos(angle) * y
            covered += (u / semi_mm[0]) ** 2 + (v / semi_mm[1]) ** 2 <= 1.0
    image = LUNG_HU + (NODULE_HU - LUNG_HU) * covered / 16 * lesion
    y, x = (rows - n / 2) * spacing[0], (cols - n / 2) * spacing[1]
    if vessel:
        image[(np.abs(y - 1.0) <= 1.0) & (x > 0)] = NODULE_HU
    if wall:
        image[x > semi_mm[0] - 0.5] = WALL_HU
    image = ndimage.gaussian_filter(image, (0.7 / spacing[0], 0.7 / spacing[1]))
    image = image + rng.normal(0.0, 30.0, image.shape)
    volume = Volume.in_memory(np.stack([image] * 3), geometry)
    centre = geometry.index_to_lps(np.array([1.0, n / 2, n / 2]))
    return volume, (float(centre[0]), float(centre[1]), float(centre[2]))


def values(finding: StudyFinding | None) -> tuple[float, float]:
    assert finding is not None
    long_axis, short_axis = finding.measurements
    assert long_axis.value_mm is not None and short_axis.value_mm is not None
    return float(long_axis.value_mm), float(short_axis.value_mm)


@pytest.mark.parametrize(
    ("semi_mm", "angle", "spacing"),
    [
        ((6.0, 4.0), 0.3, (0.7, 0.7)),
        ((3.0, 3.0), 0.0, (0.7, 0.7)),
        ((10.0, 5.0), 1.0, (0.6, 0.9)),
        ((2.5, 2.0), 0.5, (0.5, 0.5)),
    ],
)
def test_a_known_ellipse_is_measured_within_a_pixel(
    semi_mm: tuple[float, float], angle: float, spacing: tuple[float, float]
) -> None:
    volume, centre = scene(semi_mm, angle, spacing, seed=1)
    finding = ClickSegmentation().measure_at(volume, centre)
    assert finding is not None and finding.kind == FindingKind.LESION
    assert finding.slice_index == 1
    long_mm, short_mm = values(finding)
    pixel = max(spacing)
    assert abs(long_mm - 2 * semi_mm[0]) <= pixel
    assert abs(short_mm - 2 * semi_mm[1]) <= pixel
    # the caliper invariant: each value is its end points' distance; ranges absent
    assert finding.axes_lps_mm is not None
    for measurement, (a, b) in zip(finding.measurements, finding.axes_lps_mm, strict=True):
        assert measurement.range_mm is None and measurement.coverage is None
        assert measurement.value_mm == pytest.approx(
            float(np.linalg.norm(np.subtract(b, a))), abs=0.1
        )
    assert [m.name for m in finding.measurements] == [
        MeasurementName.LONG_AXIS,
        MeasurementName.SHORT_AXIS,
    ]
    # the end points lie on the clicked slice (LPS z of slice 1)
    assert all(p[2] == pytest.approx(12.0) for segment in finding.axes_lps_mm for p in segment)


def test_an_attached_vessel_is_cut_off() -> None:
    volume, centre = scene((5.0, 5.0), vessel=True, seed=2)
    long_mm, short_mm = values(ClickSegmentation().measure_at(volume, centre))
    # the vessel runs 30 mm to the crop's edge; it is cut within the margin (2 mm)
    assert 9.3 <= long_mm <= 12.5
    assert abs(short_mm - 10.0) <= 1.0


def test_a_chest_wall_the_nodule_touches_is_left_out() -> None:
    volume, centre = scene((5.0, 5.0), wall=True, seed=3)
    long_mm, short_mm = values(ClickSegmentation().measure_at(volume, centre))
    assert abs(long_mm - 10.0) <= 1.5  # not the wall's 60 mm
    assert 8.0 <= short_mm <= 10.7


def test_a_click_in_plain_lung_gives_none_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    volume, centre = scene((5.0, 5.0), lesion=False, seed=4)
    with caplog.at_level(logging.INFO, logger="model.baseline.click_segmentation"):
        assert ClickSegmentation().measure_at(volume, centre) is None
    assert "nothing to segment" in caplog.text


def test_a_click_outside_the_volume_gives_none(caplog: pytest.LogCaptureFixture) -> None:
    volume, centre = scene((5.0, 5.0), seed=5)
    with caplog.at_level(logging.INFO, logger="model.baseline.click_segmentation"):
        assert ClickSegmentation().measure_at(volume, (centre[0], centre[1], 100.0)) is None
    assert "outside the volume" in caplog.text


def test_the_mask_behind_a_measurement() -> None:
    volume, centre = scene((6.0, 4.0), 0.3, seed=6)
    segmentation = segment_click(volume, centre)
    assert segmentation is not None
    assert segmentation.slice_index == 1 and segmentation.mask.shape == volume.shape[1:]
    assert segmentation.mask[48, 48]  # the click
    assert segmentation.surroundings_hu < segmentation.threshold_hu < segmentation.click_hu
    area = segmentation.mask.sum() * 0.7 * 0.7
    assert area == pytest.approx(np.pi * 6.0 * 4.0, rel=0.15)
    again = ClickSegmentation().segment_at(volume, centre)
    assert again is not None and np.array_equal(again.mask, segmentation.mask)


def test_the_baseline_names_itself_not_for_clinical_use() -> None:
    info = ClickSegmentation().info
    assert info is BASELINE_INFO
    assert info.not_for_clinical_use is True
    assert "baseline" in info.name and info.version


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"window_mm": 0.0}, "window_mm must be a finite number > 0"),
        ({"opening_scale": float("nan")}, "opening_scale"),
        ({"margin_mm": -1.0}, "margin_mm must be a finite number >= 0"),
        ({"surroundings_percentile": 101.0}, "surroundings_percentile"),
        ({"fractions": (0.5, 1.0)}, "fractions must be numbers in"),
        ({"fractions": ()}, "fractions"),
    ],
)
def test_bad_settings_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClickSegmentationSettings(**change)  # type: ignore[arg-type]


def first_rows(n: int) -> list[dict[str, str]]:
    with (LIDC / "reads.csv").open(newline="") as handle:
        return [row for _, row in zip(range(n), csv.DictReader(handle), strict=False)]


def bin_target(long_mm: float) -> float:
    """The issue's long-axis MAE target for the size bin of ``long_mm``."""
    return 1.66 if long_mm < 6 else 2.19 if long_mm < 10 else 2.85 if long_mm < 20 else 5.86


@pytest.mark.skipif(
    not (LIDC / "reads.csv").is_file(), reason=f"the LIDC nodules are not at {LIDC}"
)
def test_the_first_three_lidc_nodules_land_near_the_readers() -> None:
    # the first three rows of reads.csv (a rule, not a choice by result); each within twice
    # the MAE target of its size bin (long axis) and of the short axis (1.65 mm)
    for row in first_rows(3):
        image = load_path(LIDC / "image" / f"{row['case']}.nii.gz").volumes[0]
        mask = load_path(LIDC / "mask" / f"{row['case']}.nii.gz").volumes[0]
        click = lesion_clicks(mask.voxels > 0.5, image.geometry, rng=np.random.default_rng(0))
        long_mm, short_mm = values(ClickSegmentation().measure_at(image, click.primary_lps_mm))
        median_long = float(row["median_read_long_mm"])
        median_short = float(row["median_read_short_mm"])
        assert abs(long_mm - median_long) <= 2 * bin_target(median_long), row["case"]
        assert abs(short_mm - median_short) <= 2 * 1.65, row["case"]
