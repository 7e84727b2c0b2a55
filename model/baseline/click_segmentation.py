"""The classical click-seeded lesion measurement: the yardstick the measurer is scored beside.

A radiologist clicks on a lesion; on the clicked slice this module thresholds, cleans and
measures the lesion with no model and no training, the way a classical workstation tool would.
It is a yardstick (``radcaliper evaluate`` scores it on every run, so the measurer's figures
always stand next to what a plain algorithm reaches on the same clicks) and a possible
reviewer's flag (a measurement far from the baseline's deserves a second look). It is never
the product's number: its findings carry no calibrated range and its ``ModelInfo`` names it.

The steps, on the clicked slice, in a window of ``window_mm`` around the click
(:func:`segment_click`; every size in mm, through the pixel spacing):

1. levels: the click's value (median HU within ``click_radius_mm``) and the surrounding
   tissue's (the ``surroundings_percentile`` of the HU within ``surroundings_radius_mm``: the
   aerated lung around a nodule). A click less than ``min_contrast_hu`` above its
   surroundings has nothing to segment (a click on plain lung).
2. per candidate threshold (``fractions`` of the way from the surroundings' level to the
   click's; no fixed HU level), the region around the click (:func:`_region`): the pixels at
   or above the threshold, holes filled; then opened twice, at scales set by the click's
   depth ``d`` (its distance to the region's edge):

   - what a disc of ``wall_scale * d`` fits into is removed (a white top-hat): the chest
     wall, the mediastinum or a larger structure the lesion touches, which a lesion of that
     depth cannot be;
   - opened by a disc of ``opening_scale * d``, which cuts vessels and strands narrower than
     the lesion, keeping the component under the click; what the opening trimmed within
     ``margin_mm`` of that component is given back (lobulated and spiculated margins), so
     an attachment is cut ``margin_mm`` from the lesion.
3. the threshold whose region has the strongest mean boundary gradient (Gaussian derivatives
   of ``gradient_sigma_mm``, in HU/mm, over the region's edge pixels) is kept: the level where
   the lesion's edge is sharpest (ties: the lower threshold).
4. the region is measured with the project's RECIST-from-mask code
   (:func:`ingestion.dataset.recist.lesion_axes` on the one-slice mask): the long axis and
   its longest perpendicular chord, as LPS end points; the values are the end points'
   distances (the caliper invariant).

Made for bright lesions on darker surroundings (lung nodules on CT), clicked near their middle:
the scales come from the click's depth, so a click near the lesion's edge cuts less well. On
the 707 LIDC nodules at their primary clicks (``benchmarks/bench_click_baseline.py``; the
figures in ``benchmarks/RESULTS.md``): 697 segmented, long axis MAE 2.30 mm (bias -1.43 mm)
against the readers' median, short axis 1.50 mm; the readers' own level is 1.15 and 1.04 mm.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry, Vector3
from ingestion.volume import Volume
from model.measurer.results import (
    FindingKind,
    Measurement,
    MeasurementName,
    ModelInfo,
    StudyFinding,
)

__all__ = [
    "BASELINE_INFO",
    "ClickSegmentation",
    "ClickSegmentationSettings",
    "SliceSegmentation",
    "segment_click",
]

logger = logging.getLogger(__name__)

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

BASELINE_INFO = ModelInfo(
    name="click-threshold-baseline",
    version="1",
    numeric_mode="classical",
    not_for_clinical_use=True,
)
"""What every baseline finding names as its model."""


def _default_fractions() -> tuple[float, ...]:
    return tuple(round(0.10 + 0.05 * k, 2) for k in range(17))  # 0.10, 0.15, ..., 0.90


@dataclass(frozen=True)
class ClickSegmentationSettings:
    """The baseline's few parameters, all physical (module doc, in order of the steps).

    Args:
        window_mm: half-width of the square window around the click that is processed.
        click_radius_mm: the click's neighbourhood, whose median is the click's level.
        surroundings_radius_mm: the surroundings, whose ``surroundings_percentile`` is the
            surrounding tissue's level.
        surroundings_percentile: that percentile (0-100).
        min_contrast_hu: the least difference between the two levels worth segmenting.
        fractions: the candidate thresholds, as fractions (0-1) of the way from the
            surroundings' level to the click's.
        wall_scale: structures a disc of this many times the click's depth fits into are
            not the lesion.
        opening_scale: the opening's disc, in multiples of the click's depth.
        margin_mm: how far from the opened lesion its trimmed margin is given back.
        gradient_sigma_mm: the Gaussian of the derivatives that give the boundary gradient.
    """

    window_mm: float = 50.0
    click_radius_mm: float = 1.0
    surroundings_radius_mm: float = 20.0
    surroundings_percentile: float = 10.0
    min_contrast_hu: float = 100.0
    fractions: tuple[float, ...] = field(default_factory=_default_fractions)
    wall_scale: float = 2.0
    opening_scale: float = 0.5
    margin_mm: float = 2.0
    gradient_sigma_mm: float = 1.0

    def __post_init__(self) -> None:
        positive = (
            "window_mm",
            "click_radius_mm",
            "surroundings_radius_mm",
            "min_contrast_hu",
            "wall_scale",
            "opening_scale",
            "gradient_sigma_mm",
        )
        for name in positive:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.margin_mm) and self.margin_mm >= 0):
            raise ValueError(f"margin_mm must be a finite number >= 0, got {self.margin_mm!r}")
        if not 0 <= self.surroundings_percentile <= 100:
            raise ValueError(
                f"surroundings_percentile must be in [0, 100], got {self.surroundings_percentile}"
            )
        if not self.fractions or not all(0 < f < 1 for f in self.fractions):
            raise ValueError(f"fractions must be numbers in (0, 1), got {self.fractions!r}")


@dataclass(frozen=True, eq=False)  # holds an array: compared by identity
class SliceSegmentation:
    """The baseline's segmentation of a clicked lesion on one slice.

    Args:
        slice_index: the clicked slice (0-based, array order).
        mask: (rows, columns) boolean section on that slice, the volume's full size.
        threshold_hu: the chosen threshold.
        click_hu, surroundings_hu: the two levels the thresholds lie between.
        boundary_gradient: the region's mean boundary gradient (HU/mm).
    """

    slice_index: int
    mask: BoolArray
    threshold_hu: float
    click_hu: float
    surroundings_hu: float
    boundary_gradient: float


# -- the steps ------------------------------------------------------------------------------------
def _disc_mask(
    shape: tuple[int, int], centre: tuple[int, int], radius_mm: float, spacing: tuple[float, float]
) -> BoolArray:
    """Pixels whose centres lie within ``radius_mm`` of ``centre`` (row, column)."""
    rows, cols = np.ogrid[: shape[0], : shape[1]]
    dr, dc = (rows - centre[0]) * spacing[0], (cols - centre[1]) * spacing[1]
    return np.asarray(dr * dr + dc * dc <= radius_mm * radius_mm)


def _opening(region: BoolArray, radius_mm: float, spacing: tuple[float, float]) -> BoolArray:
    """Morphological opening by a disc of ``radius_mm`` (Euclidean distances in mm: erosion
    keeps the pixels farther than the radius from the outside, dilation gives back the pixels
    within the radius of what is left)."""
    from scipy import ndimage

    eroded = np.asarray(ndimage.distance_transform_edt(region, sampling=spacing) > radius_mm)
    if not eroded.any():
        return eroded
    return np.asarray(ndimage.distance_transform_edt(~eroded, sampling=spacing) <= radius_mm)


def _region(
    image: FloatArray,
    threshold: float,
    click: tuple[int, int],
    spacing: tuple[float, float],
    settings: ClickSegmentationSettings,
) -> BoolArray | None:
    """The lesion region under the click at one threshold (module doc, step 2), or None where
    the click falls outside it."""
    from scipy import ndimage

    region = ndimage.binary_fill_holes(image >= threshold)
    if not region[click]:
        return None
    depth = float(ndimage.distance_transform_edt(region, sampling=spacing)[click])  # mm
    # larger structures: what a disc of wall_scale * depth fits into (the window's edge
    # continued outwards, so a wall cut by the window is still a wall)
    wall_mm = settings.wall_scale * depth
    pad = math.ceil(wall_mm / min(spacing)) + 1
    wall = _opening(np.pad(region, pad, mode="edge"), wall_mm, spacing)[pad:-pad, pad:-pad]
    lesion = region & ~wall
    opened = _opening(lesion, settings.opening_scale * depth, spacing)
    labels, _ = ndimage.label(opened)
    if labels[click] == 0:
        return None
    core = labels == labels[click]
    if settings.margin_mm > 0:
        near_core = ndimage.distance_transform_edt(~core, sampling=spacing) <= settings.margin_mm
        labels, _ = ndimage.label(lesion & near_core)
        core = labels == labels[click]
    return np.asarray(core)


def _gradient_magnitude(
    image: FloatArray, sigma_mm: float, spacing: tuple[float, float]
) -> FloatArray:
    """|grad image| in HU/mm, from Gaussian derivatives of ``sigma_mm``."""
    from scipy import ndimage

    sigma = (sigma_mm / spacing[0], sigma_mm / spacing[1])
    d_row = ndimage.gaussian_filter(image, sigma, order=(1, 0)) / spacing[0]
    d_col = ndimage.gaussian_filter(image, sigma, order=(0, 1)) / spacing[1]
    return np.asarray(np.hypot(d_row, d_col))


def _edge(region: BoolArray) -> BoolArray:
    """The region's edge pixels: those with a neighbour (of 4) outside; the window's border
    is not an edge."""
    from scipy import ndimage

    inner = ndimage.binary_erosion(region, border_value=1)
    return np.asarray(region & ~inner)


def _click_index(volume: Volume, point_lps_mm: Vector3) -> tuple[int, int, int] | None:
    index = np.rint(volume.geometry.lps_to_index(np.asarray(point_lps_mm, dtype=np.float64)))
    s, r, c = (int(v) for v in index)
    if not all(0 <= v < n for v, n in zip((s, r, c), volume.shape, strict=True)):
        return None
    return s, r, c


def segment_click(
    volume: Volume,
    point_lps_mm: Vector3,
    settings: ClickSegmentationSettings | None = None,
) -> SliceSegmentation | None:
    """The baseline's segmentation of the lesion under a click (module doc, steps 1-3), or
    None (with the reason logged) where the click is outside the volume, not above its
    surroundings, or no threshold gives a region under it."""
    settings = settings or ClickSegmentationSettings()
    found = _click_index(volume, point_lps_mm)
    if found is None:
        logger.info("baseline: click %s lies outside the volume", point_lps_mm)
        return None
    s, r, c = found
    geometry = volume.geometry
    spacing = (geometry.row_spacing, geometry.column_spacing)
    half = (math.ceil(settings.window_mm / spacing[0]), math.ceil(settings.window_mm / spacing[1]))
    r0, c0 = max(r - half[0], 0), max(c - half[1], 0)
    image = np.asarray(volume.voxels[s, r0 : r + half[0] + 1, c0 : c + half[1] + 1], np.float64)
    click = (r - r0, c - c0)

    click_hu = float(
        np.median(image[_disc_mask(image.shape, click, settings.click_radius_mm, spacing)])
    )
    around = image[_disc_mask(image.shape, click, settings.surroundings_radius_mm, spacing)]
    surroundings_hu = float(np.percentile(around, settings.surroundings_percentile))
    if click_hu - surroundings_hu < settings.min_contrast_hu:
        logger.info(
            "baseline: nothing to segment at %s: the click's %.0f HU is within %.0f HU of the "
            "surroundings' %.0f HU",
            point_lps_mm,
            click_hu,
            settings.min_contrast_hu,
            surroundings_hu,
        )
        return None

    gradient = _gradient_magnitude(image, settings.gradient_sigma_mm, spacing)
    best: tuple[float, float, BoolArray] | None = None
    for fraction in settings.fractions:
        threshold = surroundings_hu + fraction * (click_hu - surroundings_hu)
        region = _region(image, threshold, click, spacing, settings)
        if region is None:
            continue
        score = float(gradient[_edge(region)].mean())
        if best is None or score > best[0]:
            best = (score, threshold, region)
    if best is None:
        logger.info("baseline: no threshold gives a region under the click at %s", point_lps_mm)
        return None
    score, threshold, region = best
    mask = np.zeros(volume.shape[1:], dtype=bool)
    mask[r0 : r0 + image.shape[0], c0 : c0 + image.shape[1]] = region
    return SliceSegmentation(
        slice_index=s,
        mask=mask,
        threshold_hu=threshold,
        click_hu=click_hu,
        surroundings_hu=surroundings_hu,
        boundary_gradient=score,
    )


# -- the measurement ------------------------------------------------------------------------------
def _one_slice_geometry(geometry: Geometry, slice_index: int) -> Geometry:
    """The grid of one slice of ``geometry`` (its slice index 0)."""
    origin = geometry.index_to_lps(np.array([float(slice_index), 0.0, 0.0]))
    return Geometry(
        origin=(float(origin[0]), float(origin[1]), float(origin[2])),
        row_direction=geometry.row_direction,
        column_direction=geometry.column_direction,
        slice_direction=geometry.slice_direction,
        spacing=geometry.spacing,
    )


def _distance(segment: tuple[Vector3, Vector3]) -> float:
    return float(np.linalg.norm(np.subtract(segment[1], segment[0])))


class ClickSegmentation:
    """The baseline as a click measurer: ``measure_at`` like the ``Measurer`` protocol's.

    Args:
        settings: the parameters (the defaults are the ones benchmarked).
    """

    def __init__(self, settings: ClickSegmentationSettings | None = None) -> None:
        self.settings = settings or ClickSegmentationSettings()

    @property
    def info(self) -> ModelInfo:
        """The baseline's name and version; not for clinical use."""
        return BASELINE_INFO

    def segment_at(self, volume: Volume, point_lps_mm: Vector3) -> SliceSegmentation | None:
        """The mask behind ``measure_at`` (for plots and debugging): :func:`segment_click`."""
        return segment_click(volume, point_lps_mm, self.settings)

    def measure_at(self, volume: Volume, point_lps_mm: Vector3) -> StudyFinding | None:
        """The lesion at a clicked point (LPS mm): its RECIST long and short axes on the
        clicked slice, without ranges (the baseline has no calibration), or None (reason
        logged) where nothing segments there."""
        from ingestion.dataset.recist import lesion_axes

        segmentation = self.segment_at(volume, point_lps_mm)
        if segmentation is None:
            return None
        geometry = _one_slice_geometry(volume.geometry, segmentation.slice_index)
        axes = lesion_axes(segmentation.mask[None], geometry)
        long_axis, short_axis = axes.long_axis_lps_mm, axes.short_axis_lps_mm
        return StudyFinding(
            id=1,
            kind=FindingKind.LESION,
            center_lps_mm=axes.center_lps_mm,
            slice_index=segmentation.slice_index,
            measurements=(
                Measurement(MeasurementName.LONG_AXIS, _distance(long_axis)),
                Measurement(MeasurementName.SHORT_AXIS, _distance(short_axis)),
            ),
            axes_lps_mm=(long_axis, short_axis),
        )
