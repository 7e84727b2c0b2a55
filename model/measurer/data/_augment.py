"""Augmentations of a hybrid background: the image and its label map change together, the
geometry is kept exact, and truth is measured again from the transformed label map
(``model.measurer.data.hybrid``), never carried over from parameters.

What an augmentation does to the patient (the image content in LPS), in this order:

1. in plane, one resampling (:func:`resample_in_plane`): the anatomy mirrored left-right
   and/or anterior-posterior, rotated about the field of view's centre, sampled on a new
   square pixel spacing and cut to a new field of view. The output grid keeps the input's
   directions; its origin is where its pixels lie. Mirroring and rotating move the anatomy in
   patient space (a flip of the array with a flipped geometry would be the same patient, which
   preparation undoes). Image: cubic spline (outside the input's field of view: the image's
   own lowest value, its padding); the labels of findings (lesions, vessels): each label's
   occupancy interpolated linearly and kept where >= 0.5 (so its edge lies where the image's
   edge lies); other labels (organs): nearest neighbour.
2. thicker slices (:func:`thicken_slices`): each output slice the mean of the input slices
   over its thickness (each input slice standing for its own spacing, weighted by the overlap),
   as a scanner reconstructing thicker slices does; findings' labels by the same weights,
   kept where >= 0.5; organ labels from the input slice nearest the output slice's centre.
3. intensity (:func:`scale_intensity`): ``a * HU + b`` (calibration drift between scanners).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry

__all__ = [
    "SPEC_SLICE_MM",
    "Augmentation",
    "draw_augmentation",
    "in_plane_axes",
    "resample_in_plane",
    "scale_intensity",
    "thicken_slices",
]

SPEC_SLICE_MM = (1.0, 1.25, 2.0, 2.5, 3.0, 5.0)
"""The slice spacings of ``shared/design/phantom-spec.md``."""
PIXEL_RANGE_MM = (0.5, 1.2)
FOV_RANGE_MM = (300.0, 500.0)
MATRIX_MAX = 512
"""Output rows and columns at most (a scanner's matrix): a finer pixel draws a smaller field."""
MIN_SLICES = 6
"""Thicker slices only where at least this many remain."""
_TOLERANCE_MM = 1e-3

Labels = npt.NDArray[np.int16]
Image = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Augmentation:
    """One draw of the augmentations (module doc); ``None`` keeps the input's value.

    Args:
        flip_lr, flip_ap: mirror the anatomy left-right (patient x), anterior-posterior (y).
        rotation_deg: in-plane rotation of the anatomy about the field's centre, from the
            row direction towards the column direction (axial: from +x towards +y, as a
            finding's ``rotation_deg``).
        pixel_mm: the new (square) pixel spacing.
        fov_mm: the new field of view (its longer side); never more than the input's.
        center_shift: where the cut field's centre lies, as a fraction in [-1, 1] of the room
            there is on each in-plane axis (rows, columns).
        slice_mm: the new slice spacing and thickness (thicker only).
        intensity_scale, intensity_shift_hu: ``a`` and ``b`` of ``a * HU + b``.
    """

    flip_lr: bool = False
    flip_ap: bool = False
    rotation_deg: float = 0.0
    pixel_mm: float | None = None
    fov_mm: float | None = None
    center_shift: tuple[float, float] = (0.0, 0.0)
    slice_mm: float | None = None
    intensity_scale: float = 1.0
    intensity_shift_hu: float = 0.0

    def describe(self) -> str:
        parts = [name for name, on in (("flip LR", self.flip_lr), ("flip AP", self.flip_ap)) if on]
        if self.rotation_deg:
            parts.append(f"rotated {self.rotation_deg:.1f} deg")
        if self.pixel_mm is not None:
            parts.append(f"pixels {self.pixel_mm:.3f} mm")
        if self.fov_mm is not None:
            parts.append(f"field {self.fov_mm:.0f} mm")
        if self.slice_mm is not None:
            parts.append(f"slices {self.slice_mm:g} mm")
        if self.intensity_scale != 1.0 or self.intensity_shift_hu != 0.0:
            parts.append(f"HU x{self.intensity_scale:.3f} {self.intensity_shift_hu:+.1f}")
        return ", ".join(parts) or "none"


def draw_augmentation(
    rng: np.random.Generator, geometry: Geometry, shape: tuple[int, int, int]
) -> Augmentation:
    """A random augmentation for a volume of this geometry and shape: flips (LR 1/2, AP 1/4),
    a rotation in [-20, 20] degrees (half the time), a pixel spacing in 0.5-1.2 mm (half the
    time; coarser where the matrix would pass 512), a field of view in 300-500 mm (where the
    image is larger), a spec slice spacing at least the input's (half the time, where at least
    ``MIN_SLICES`` remain), HU scaled by 0.97-1.03 and shifted by -15..15."""
    slices, rows, columns = shape
    extent = max(rows * geometry.row_spacing, columns * geometry.column_spacing)
    flip_lr = bool(rng.uniform() < 0.5)
    flip_ap = bool(rng.uniform() < 0.25)
    rotation = float(rng.uniform(-20.0, 20.0)) if rng.uniform() < 0.5 else 0.0
    fov = float(rng.uniform(*FOV_RANGE_MM))
    fov_mm = fov if fov < extent - _TOLERANCE_MM else None
    field = fov_mm if fov_mm is not None else extent
    pixel: float | None = None
    if rng.uniform() < 0.5:
        pixel = max(float(rng.uniform(*PIXEL_RANGE_MM)), field / MATRIX_MAX)
    shift = (float(rng.uniform(-1.0, 1.0)), float(rng.uniform(-1.0, 1.0)))
    thicker = [
        t
        for t in SPEC_SLICE_MM
        if t > geometry.slice_spacing + _TOLERANCE_MM
        and math.floor(slices * geometry.slice_spacing / t + 1e-9) >= MIN_SLICES
    ]
    slice_mm = float(rng.choice(thicker)) if thicker and rng.uniform() < 0.5 else None
    scale = float(rng.uniform(0.97, 1.03))
    shift_hu = float(rng.uniform(-15.0, 15.0))
    return Augmentation(flip_lr, flip_ap, rotation, pixel, fov_mm, shift, slice_mm, scale, shift_hu)


def in_plane_axes(geometry: Geometry) -> tuple[int, int]:
    """(array axis nearest patient x, array axis nearest patient y) among rows (1) and
    columns (2): the axes a left-right and an anterior-posterior mirror act on."""
    along_x = abs(geometry.row_direction[0]) >= abs(geometry.column_direction[0])
    return (2, 1) if along_x else (1, 2)


def _keep_inside(
    labels: Labels, finding_values: Collection[int]
) -> tuple[list[int], npt.NDArray[np.bool_]]:
    values = [int(v) for v in np.unique(labels) if v != 0 and int(v) in finding_values]
    organ = (labels != 0) & ~np.isin(labels, values)
    return values, organ


def resample_in_plane(
    image: Image,
    labels: Labels,
    geometry: Geometry,
    augmentation: Augmentation,
    finding_values: Collection[int],
    keep_inside: npt.NDArray[np.bool_] | None = None,
) -> tuple[Image, Labels, Geometry]:
    """Step 1 of the module doc.

    ``keep_inside`` (a mask on the input grid, e.g. the findings): the cut field's centre is
    moved, where it can be, so that the mask's bounding box (plus 5 mm) stays inside.
    """
    _, rows, columns = image.shape
    p_row, p_col = geometry.row_spacing, geometry.column_spacing
    extent = (rows * p_row, columns * p_col)
    field = min(augmentation.fov_mm or max(extent), max(extent))
    pixel = augmentation.pixel_mm
    if pixel is None:
        pixel = min(p_row, p_col)
    out_shape = tuple(max(1, round(min(field, e) / pixel)) for e in extent)
    n_rows, n_cols = int(out_shape[0]), int(out_shape[1])
    # the field's centre, in input (row, column) index units
    centre = np.array([(rows - 1) / 2.0, (columns - 1) / 2.0])
    half_out = np.array([(n_rows - 1) / 2.0 * pixel / p_row, (n_cols - 1) / 2.0 * pixel / p_col])
    low, high = half_out - 0.5, np.array([rows - 0.5, columns - 0.5]) - half_out
    if keep_inside is not None and keep_inside.any():
        margin = np.array([5.0 / p_row, 5.0 / p_col])
        where = np.nonzero(keep_inside.any(axis=0))
        box_low = np.array([where[0].min(), where[1].min()]) - margin
        box_high = np.array([where[0].max(), where[1].max()]) + margin
        low = np.maximum(low, box_high - half_out)
        high = np.minimum(high, box_low + half_out)
    for axis in range(2):
        if low[axis] <= high[axis]:
            mid, room = (low[axis] + high[axis]) / 2.0, (high[axis] - low[axis]) / 2.0
            centre[axis] = mid + augmentation.center_shift[axis] * room
        # else: the field cannot hold the box: keep it centred on the image
    # output offset (mm, along rows / columns from the output centre) -> input index offset:
    # the anatomy is mirrored and rotated, so the output shows the input at the inverse motion
    mirror = np.ones(2)
    x_axis, y_axis = in_plane_axes(geometry)
    if augmentation.flip_lr:
        mirror[x_axis - 1] = -1.0
    if augmentation.flip_ap:
        mirror[y_axis - 1] = -1.0
    angle = math.radians(augmentation.rotation_deg)
    # on (row, column) offsets: from the row direction (columns grow) towards the column
    # direction (rows grow), i.e. +x towards +y in an axial series
    rotate = np.array([[math.cos(angle), math.sin(angle)], [-math.sin(angle), math.cos(angle)]])
    motion = rotate @ np.diag(mirror)  # input mm offset -> output mm offset
    to_input = np.diag([1.0 / p_row, 1.0 / p_col]) @ np.linalg.inv(motion) * pixel
    out_centre = np.array([(n_rows - 1) / 2.0, (n_cols - 1) / 2.0])
    offset = centre - to_input @ out_centre
    identity = (
        np.allclose(to_input, np.round(to_input), atol=1e-9)
        and np.allclose(np.abs(to_input).sum(axis=1), 1.0)
        and np.allclose(offset, np.round(offset), atol=1e-6)
    )
    if identity:  # flips and an integral cut: exact, no interpolation
        new_image, new_labels = _take(image, labels, to_input, offset, (n_rows, n_cols))
    else:
        new_image, new_labels = _interpolate(
            image, labels, to_input, offset, (n_rows, n_cols), finding_values
        )
    # the output grid: the input's directions, pixel spacing ``pixel``, its [0, 0] pixel where
    # the output centre's offset from the field centre puts it
    origin = geometry.index_to_lps([0.0, centre[0], centre[1]]) - (
        np.asarray(geometry.column_direction) * out_centre[0] * pixel
        + np.asarray(geometry.row_direction) * out_centre[1] * pixel
    )
    new_geometry = Geometry(
        origin=(float(origin[0]), float(origin[1]), float(origin[2])),
        row_direction=geometry.row_direction,
        column_direction=geometry.column_direction,
        slice_direction=geometry.slice_direction,
        spacing=(geometry.slice_spacing, pixel, pixel),
    )
    return new_image, new_labels, new_geometry


def _take(
    image: Image,
    labels: Labels,
    to_input: npt.NDArray[np.float64],
    offset: npt.NDArray[np.float64],
    shape: tuple[int, int],
) -> tuple[Image, Labels]:
    """The integral case of :func:`resample_in_plane` (flips, whole-pixel cuts, quarter turns)
    by indexing."""
    grid = np.indices(shape).reshape(2, -1).astype(np.float64)
    source = np.rint(to_input @ grid + offset[:, None]).astype(np.int64)
    inside = (
        (source[0] >= 0)
        & (source[0] < image.shape[1])
        & (source[1] >= 0)
        & (source[1] < image.shape[2])
    )
    fill = float(image.min())
    out_image = np.full((image.shape[0], shape[0] * shape[1]), fill, dtype=np.float32)
    out_labels = np.zeros((labels.shape[0], shape[0] * shape[1]), dtype=labels.dtype)
    out_image[:, inside] = image[:, source[0, inside], source[1, inside]]
    out_labels[:, inside] = labels[:, source[0, inside], source[1, inside]]
    return (
        out_image.reshape(image.shape[0], *shape),
        out_labels.reshape(labels.shape[0], *shape),
    )


def _interpolate(
    image: Image,
    labels: Labels,
    to_input: npt.NDArray[np.float64],
    offset: npt.NDArray[np.float64],
    shape: tuple[int, int],
    finding_values: Collection[int],
) -> tuple[Image, Labels]:
    from scipy import ndimage

    fill = float(image.min())
    slices = image.shape[0]
    out_image = np.empty((slices, *shape), dtype=np.float32)
    for k in range(slices):
        out_image[k] = ndimage.affine_transform(
            image[k],
            to_input,
            offset=offset,
            output_shape=shape,
            order=3,
            mode="constant",
            cval=fill,
        )
    values, organ = _keep_inside(labels, finding_values)
    out_labels = np.zeros((slices, *shape), dtype=labels.dtype)
    if organ.any():
        organ_labels = np.where(organ, labels, 0)
        for k in range(slices):
            if organ_labels[k].any():
                out_labels[k] = ndimage.affine_transform(
                    organ_labels[k],
                    to_input,
                    offset=offset,
                    output_shape=shape,
                    order=0,
                    mode="constant",
                    cval=0,
                )
    for value in values:
        present = np.nonzero((labels == value).any(axis=(1, 2)))[0]
        for index in present:
            k = int(index)
            occupancy = ndimage.affine_transform(
                (labels[k] == value).astype(np.float32),
                to_input,
                offset=offset,
                output_shape=shape,
                order=1,
                mode="constant",
                cval=0.0,
            )
            out_labels[k][occupancy >= 0.5] = value
    return out_image, out_labels


def thicken_slices(
    image: Image,
    labels: Labels,
    geometry: Geometry,
    slice_mm: float,
    finding_values: Collection[int],
) -> tuple[Image, Labels, Geometry]:
    """Step 2 of the module doc: slices of ``slice_mm`` (>= the input's spacing) from the
    first input slice's lower edge on; the rest of the input shorter than one output slice is
    left out.

    Raises:
        ValueError: ``slice_mm`` is thinner than the input's spacing, or leaves no slice.
    """
    step = geometry.slice_spacing
    if slice_mm < step - _TOLERANCE_MM:
        raise ValueError(f"slice_mm {slice_mm} is thinner than the input's {step} mm slices")
    n_in = image.shape[0]
    n_out = math.floor(n_in * step / slice_mm + 1e-9)
    if n_out < 1:
        raise ValueError(f"{n_in} slices of {step} mm hold no {slice_mm} mm slice")
    # input slice i covers [(i - 1/2) step, (i + 1/2) step]; output j covers
    # [-step/2 + j T, -step/2 + (j + 1) T]
    lower_in = (np.arange(n_in) - 0.5) * step
    upper_in = lower_in + step
    lower_out = -0.5 * step + np.arange(n_out) * slice_mm
    upper_out = lower_out + slice_mm
    overlap = np.clip(
        np.minimum(upper_out[:, None], upper_in[None, :])
        - np.maximum(lower_out[:, None], lower_in[None, :]),
        0.0,
        None,
    )
    weights = overlap / slice_mm  # (n_out, n_in), rows sum to 1
    out_image = np.tensordot(weights, image, axes=(1, 0)).astype(np.float32)
    centres = (lower_out + upper_out) / 2.0 / step  # fractional input index
    nearest = np.clip(np.rint(centres).astype(np.int64), 0, n_in - 1)
    values, organ = _keep_inside(labels, finding_values)
    out_labels = np.where(organ[nearest], labels[nearest], 0).astype(labels.dtype)
    for value in values:
        occupancy = np.tensordot(weights, (labels == value).astype(np.float32), axes=(1, 0))
        out_labels[occupancy >= 0.5] = value
    origin = geometry.index_to_lps([float(centres[0]), 0.0, 0.0])
    new_geometry = Geometry(
        origin=(float(origin[0]), float(origin[1]), float(origin[2])),
        row_direction=geometry.row_direction,
        column_direction=geometry.column_direction,
        slice_direction=geometry.slice_direction,
        spacing=(slice_mm, geometry.row_spacing, geometry.column_spacing),
    )
    return out_image, out_labels, new_geometry


def scale_intensity(image: Image, scale: float, shift_hu: float) -> Image:
    """Step 3 of the module doc."""
    return (image * np.float32(scale) + np.float32(shift_hu)).astype(np.float32)
