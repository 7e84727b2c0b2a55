"""Sample what a phantom contains: grid, body, vessel and lesions (no voxels yet).

Every quantity is drawn uniformly from its :class:`PhantomSpec` range with one numpy Generator, so
a seed fixes the layout. Objects are placed by rejection sampling with bounded tries: a vessel
must lie in soft tissue; a lesion must lie in soft tissue (so at least the fat thickness, and at
least ``lesion_edge_margin_mm``, from the body outline), within the slice range, and at least
``lesion_gap_mm`` from every other lesion and from the vessel. When no position fits a size, the
size is drawn again; when a lesion cannot be placed at all, the whole layout is drawn again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ingestion.geometry import Vector3
from ingestion.phantoms.shapes import (
    DISTANCE_EPS_MM,
    BoolArray,
    FloatArray,
    ellipse_depth,
    ellipse_depth_bounds,
    ellipse_points,
    threshold_classes,
)
from ingestion.phantoms.spec import PhantomSpec
from ingestion.phantoms.truth import BodyTruth

__all__ = ["Grid", "Layout", "Lesion", "Vessel", "body_depth_above", "sample_layout"]

_TABLE_OFFSET_MM = 20.0  # the FOV centre lies within +-20 mm of x = y = 0
_Z_ORIGIN_MM = (-300.0, 0.0)  # position of the first slice
_LAYOUT_TRIES = 25
_SIZE_TRIES = 40
_CANDIDATES = 32  # positions tried at once for one size
_OUTLINE_POINTS = 256  # points on a lesion's outline used for containment and distance tests


@dataclass(frozen=True)
class Grid:
    """The voxel grid: a square axial matrix, slices ascending along +z."""

    matrix: int
    pixel_mm: float
    slice_spacing_mm: float
    slices: int
    origin: Vector3  # LPS of the centre of voxel [0, 0, 0]

    def axes(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Voxel-centre coordinates (mm): z (S,), y (R,), x (C,)."""
        ox, oy, oz = self.origin
        k = np.arange(self.slices, dtype=np.float64)
        i = np.arange(self.matrix, dtype=np.float64)
        return oz + k * self.slice_spacing_mm, oy + i * self.pixel_mm, ox + i * self.pixel_mm

    @property
    def z_range(self) -> tuple[float, float]:
        """z of the first and the last slice centre (mm)."""
        z0 = self.origin[2]
        return z0, z0 + (self.slices - 1) * self.slice_spacing_mm


@dataclass(frozen=True)
class Vessel:
    """A cylinder along z through all slices."""

    center_xy: tuple[float, float]
    diameter_mm: float
    hu: float


@dataclass(frozen=True)
class Lesion:
    """An ellipsoid with its third axis along z, rotated in-plane by ``rotation_deg``."""

    center: Vector3  # (x, y, z) LPS mm
    long_axis_mm: float
    short_axis_mm: float
    cc_extent_mm: float
    rotation_deg: float
    contrast_hu: float

    @property
    def semi_axes(self) -> tuple[float, float, float]:
        """(long / 2, short / 2, cc / 2) in mm."""
        return self.long_axis_mm / 2, self.short_axis_mm / 2, self.cc_extent_mm / 2

    @property
    def angle_rad(self) -> float:
        """In-plane rotation in radians."""
        return math.radians(self.rotation_deg)


@dataclass(frozen=True)
class Layout:
    """Everything a phantom holds, before rendering."""

    grid: Grid
    body: BodyTruth
    vessel: Vessel | None
    lesions: tuple[Lesion, ...]


def _uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return float(rng.uniform(bounds[0], bounds[1]))


def body_depth_above(
    body: BodyTruth, x: FloatArray, y: FloatArray, threshold: float, radius: float = 0.0
) -> tuple[BoolArray, BoolArray]:
    """(surely, surely not): depth below the body outline > ``threshold`` within ``radius``."""
    cx, cy = body.center_lps_mm
    a, b = body.semi_axes_mm
    dx, dy = x - cx, y - cy

    def exact(mask: BoolArray) -> FloatArray:
        return ellipse_depth(dx[mask], dy[mask], a, b)

    return threshold_classes(ellipse_depth_bounds(dx, dy, a, b), exact, threshold, radius)


def _sample_grid(rng: np.random.Generator, spec: PhantomSpec) -> Grid:
    matrix = int(rng.integers(spec.matrix_size[0], spec.matrix_size[1] + 1))
    lo, hi = spec.pixel_spacing_mm
    pixel = min(hi, max(lo, round(_uniform(rng, spec.pixel_spacing_mm), 4)))
    spacing = spec.slice_spacings_mm[int(rng.integers(len(spec.slice_spacings_mm)))]
    slices = int(rng.integers(spec.slice_count[0], spec.slice_count[1] + 1))
    centre_x = round(_uniform(rng, (-_TABLE_OFFSET_MM, _TABLE_OFFSET_MM)), 1)
    centre_y = round(_uniform(rng, (-_TABLE_OFFSET_MM, _TABLE_OFFSET_MM)), 1)
    z0 = round(_uniform(rng, _Z_ORIGIN_MM), 1)
    half = (matrix - 1) / 2 * pixel  # FOV centre = centre of the middle pixel
    return Grid(matrix, pixel, spacing, slices, (centre_x - half, centre_y - half, z0))


def _sample_body(rng: np.random.Generator, spec: PhantomSpec, grid: Grid) -> BodyTruth:
    fov = grid.matrix * grid.pixel_mm
    semi_x = _uniform(rng, spec.body_semi_axis_fraction) * fov
    semi_y = _uniform(rng, spec.body_semi_axis_fraction) * fov
    half = (grid.matrix - 1) / 2 * grid.pixel_mm
    return BodyTruth(
        center_lps_mm=(grid.origin[0] + half, grid.origin[1] + half),
        semi_axes_mm=(semi_x, semi_y),
        fat_thickness_mm=_uniform(rng, spec.fat_thickness_mm),
        air_hu=spec.air_hu,
        fat_hu=spec.fat_hu,
        soft_tissue_hu=_uniform(rng, spec.soft_tissue_hu),
        noise_sd_hu=_uniform(rng, spec.noise_sd_hu),
    )


def _place_vessel(rng: np.random.Generator, spec: PhantomSpec, body: BodyTruth) -> Vessel | None:
    hu = _uniform(rng, spec.vessel_hu)
    cx, cy = body.center_lps_mm
    semi_x, semi_y = body.semi_axes_mm
    t = body.fat_thickness_mm
    for _ in range(_SIZE_TRIES):
        diameter = _uniform(rng, spec.vessel_diameter_mm)
        r = diameter / 2
        reach_x, reach_y = semi_x - t - r, semi_y - t - r
        if reach_x < 0 or reach_y < 0:
            continue
        x = cx + rng.uniform(-reach_x, reach_x, _CANDIDATES)
        y = cy + rng.uniform(-reach_y, reach_y, _CANDIDATES)
        ok, _ = body_depth_above(body, x, y, t + r)
        if np.any(ok):
            i = int(np.argmax(ok))
            return Vessel((float(x[i]), float(y[i])), diameter, hu)
    return None


def _outside_by(
    points_x: FloatArray,
    points_y: FloatArray,
    centre_x: FloatArray | float,
    centre_y: FloatArray | float,
    shape: Lesion,
) -> FloatArray:
    """Signed distance (mm) from points to the axial outline of ``shape`` at a centre; > 0 outside.

    Arrays broadcast: e.g. (K, P) points against (K, 1) centres.
    """
    a, b, _ = shape.semi_axes
    cos, sin = math.cos(shape.angle_rad), math.sin(shape.angle_rad)
    dx, dy = points_x - centre_x, points_y - centre_y
    return -ellipse_depth(cos * dx + sin * dy, -sin * dx + cos * dy, a, b)


def _sample_shape(rng: np.random.Generator, spec: PhantomSpec, contrast: float) -> Lesion:
    """A lesion's size and rotation (centre still at the origin)."""
    long_axis = _uniform(rng, spec.lesion_long_axis_mm)
    return Lesion(
        center=(0.0, 0.0, 0.0),
        long_axis_mm=long_axis,
        short_axis_mm=long_axis * _uniform(rng, spec.lesion_short_axis_ratio),
        cc_extent_mm=long_axis * _uniform(rng, spec.lesion_cc_extent_ratio),
        rotation_deg=_uniform(rng, (0.0, 180.0)),
        contrast_hu=contrast,
    )


def _place_lesion(
    rng: np.random.Generator,
    spec: PhantomSpec,
    grid: Grid,
    body: BodyTruth,
    vessel: Vessel | None,
    placed: list[Lesion],
) -> Lesion | None:
    """Draw a lesion that fits, trying up to ``_SIZE_TRIES`` sizes of ``_CANDIDATES`` positions."""
    magnitude = _uniform(rng, spec.lesion_contrast_hu)
    contrast = -magnitude if rng.random() < 0.5 else magnitude
    cx, cy = body.center_lps_mm
    semi_x, semi_y = body.semi_axes_mm
    inner = max(body.fat_thickness_mm, spec.lesion_edge_margin_mm)
    gap = spec.lesion_gap_mm + DISTANCE_EPS_MM
    z_first, z_last = grid.z_range
    for _ in range(_SIZE_TRIES):
        shape = _sample_shape(rng, spec, contrast)
        a, b, c = shape.semi_axes
        angle = shape.angle_rad
        reach_x = semi_x - inner - math.hypot(a * math.cos(angle), b * math.sin(angle))
        reach_y = semi_y - inner - math.hypot(a * math.sin(angle), b * math.cos(angle))
        if reach_x < 0 or reach_y < 0 or z_first + c > z_last - c:
            continue
        x = cx + rng.uniform(-reach_x, reach_x, _CANDIDATES)  # (K,)
        y = cy + rng.uniform(-reach_y, reach_y, _CANDIDATES)
        z = rng.uniform(z_first + c, z_last - c, _CANDIDATES)
        outline, spacing, sagitta = ellipse_points(a, b, angle, _OUTLINE_POINTS)  # (P, 2)
        ox = x[:, None] + outline[None, :, 0]  # (K, P)
        oy = y[:, None] + outline[None, :, 1]
        # In soft tissue: the outline (and so the convex lesion) at depth >= inner.
        inside, _ = body_depth_above(body, ox, oy, inner + sagitta)
        ok = np.all(inside, axis=1)  # (K,)
        if vessel is not None:
            vx, vy = vessel.center_xy
            clearance = _outside_by(np.array(vx), np.array(vy), x, y, shape)  # (K,)
            ok &= clearance >= vessel.diameter_mm / 2 + gap
        for other in placed:
            theirs, their_spacing, _ = ellipse_points(
                other.semi_axes[0], other.semi_axes[1], other.angle_rad, _OUTLINE_POINTS
            )
            tx, ty, tz = other.center
            apart_z = np.abs(z - tz) >= c + other.semi_axes[2] + spec.lesion_gap_mm
            # Outline samples miss the closest point by at most half their spacing.
            mine_out = _outside_by(ox, oy, tx, ty, other).min(axis=1) - spacing / 2  # (K,)
            theirs_out = (
                _outside_by(
                    tx + theirs[None, :, 0], ty + theirs[None, :, 1], x[:, None], y[:, None], shape
                ).min(axis=1)
                - their_spacing / 2
            )  # (K,)
            ok &= apart_z | ((mine_out >= gap) & (theirs_out >= gap))
        if np.any(ok):
            k = int(np.argmax(ok))
            return replace(shape, center=(float(x[k]), float(y[k]), float(z[k])))
    return None


def sample_layout(rng: np.random.Generator, spec: PhantomSpec) -> Layout:
    """Draw a grid, a body, maybe a vessel, and the lesions.

    Raises:
        ValueError: the spec leaves no room for the lesions (or the vessel) after bounded tries.
    """
    grid = _sample_grid(rng, spec)
    body = _sample_body(rng, spec, grid)
    count = int(rng.integers(spec.lesion_count[0], spec.lesion_count[1] + 1))
    has_vessel = bool(rng.random() < spec.vessel_probability)
    for _ in range(_LAYOUT_TRIES):
        vessel = _place_vessel(rng, spec, body) if has_vessel else None
        if has_vessel and vessel is None:
            continue
        lesions: list[Lesion] = []
        while len(lesions) < count:
            lesion = _place_lesion(rng, spec, grid, body, vessel, lesions)
            if lesion is None:
                break
            lesions.append(lesion)
        else:
            return Layout(grid, body, vessel, tuple(lesions))
    raise ValueError(
        f"the phantom spec leaves no room: could not place {count} lesion(s)"
        f"{' and a vessel' if has_vessel else ''} in a body of semi-axes "
        f"{body.semi_axes_mm[0]:.1f} x {body.semi_axes_mm[1]:.1f} mm with a "
        f"{body.fat_thickness_mm:.1f} mm fat rim and {grid.slices} slices of "
        f"{grid.slice_spacing_mm:g} mm after {_LAYOUT_TRIES} layouts; widen the body or the "
        "slice range, or shrink the lesions, the vessel or the fat rim"
    )
