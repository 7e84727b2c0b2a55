"""Synthetic lesions inserted into a real CT volume (``model.measurer.data.hybrid``).

**Where** (``model.measurer.data._tissue``): organs from the background's labels, lung and soft
tissue from the image. A lesion must lie wholly inside its tissue, at least ``GAP_MM`` from
the tissue's edge, from every known finding or vessel of the background and from the other
inserted lesions, and one voxel inside the image on every side: candidate centres come from
a coarse grid of room (:func:`_candidates`), then the lesion's bounding ellipsoid widened by
the gap is tested (:func:`_fits`), then the rasterised lesion itself.

**What** (``model.measurer.data._lesion_shape``): a smooth, lobulated or spiculated shape in a
random 3-D orientation, long axis 5-60 mm (log-uniform; shrunk where no place holds it), the
other axes 0.5-1.0 of it.

**How it looks**: its HU is the local tissue's own median plus a contrast by tissue
(``ORGAN_RULES``, ``LUNG_RULE``, ``SOFT_RULE``), the median taken over the tissue's voxels
within 10 mm of the lesion's box (for soft tissue: its non-fat voxels, -30..150 HU). The
contrast is at least ``MIN_CNR`` times the tissue's own measured noise (its sign kept): a
lesion no reader could see is not one any annotation holds, and as a training or evaluation
target it is noise (rendered crops of +15..+30 HU lesions in muscle showed nothing). Partial
volume: each voxel's occupancy. Noise: Gaussian noise with the standard deviation and in-plane
correlation of the tissue around (``model.measurer.data._image_stats.estimate_noise``). Blur: the
occupancy is blurred in plane so that the lesion's edge is as sharp as the image's own air
edges (``estimate_blur``, less the box blur of the occupancy itself). The voxel becomes
``(1 - o) * background + o * (HU + noise)``.

**Truth**: the voxels of occupancy >= 0.5 (before blurring), their largest 26-connected part,
as a label of its own; its RECIST long axis must be at least 5 mm (else a larger lesion is
drawn). The rows come from ``findings_from_labels`` with the volume's real geometry (the same
definition as an imported label map).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry
from model.measurer.data._image_stats import estimate_blur, estimate_noise
from model.measurer.data._lesion_shape import LesionShape, draw_shape, occupancy
from model.measurer.data._tissue import (
    LUNG_RULE,
    ORGAN_RULES,
    SOFT_RULE,
    ContrastRule,
    TissueMaps,
    tissue_maps,
)

__all__ = [
    "GAP_MM",
    "MIN_CNR",
    "ORGAN_RULES",
    "SIZE_RANGE_MM",
    "Inserted",
    "LesionShape",
    "TissueMaps",
    "insert_lesions",
    "occupancy",
    "tissue_maps",
]

logger = logging.getLogger(__name__)

MIN_CNR = 3.0
"""Least |contrast| of an inserted lesion in units of its tissue's measured noise SD (per
voxel, ``estimate_noise``): a contrast-to-noise ratio a reader sees at a lesion's edge."""
GAP_MM = 3.0
"""Least distance from an inserted lesion to its tissue's edge, a known finding or vessel,
another inserted lesion."""
SIZE_RANGE_MM = (5.0, 60.0)
TISSUE_WEIGHTS = {"organ": 0.4, "lung": 0.3, "soft": 0.3}
SHAPE_WEIGHTS = {
    "organ": (0.55, 0.35, 0.10),
    "lung": (0.35, 0.30, 0.35),
    "soft": (0.40, 0.45, 0.15),
}
"""Per tissue: probabilities of a smooth, lobulated, spiculated lesion."""
_BLOCK_MM = 3.0
_TRIES = 40
_SHRINK = 0.8
_GROW = 1.25
_SIZES = 8

Image = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Inserted:
    """One inserted lesion: its label value in the label map, where and how."""

    value: int
    tissue: str
    style: str
    contrast_hu: float
    local_median_hu: float
    long_axis_mm: float  # as drawn (the truth is measured on the mask)
    centre_lps_mm: tuple[float, float, float]
    noise_hu: float | None = None  # the tissue's measured noise SD (None: too few voxels)

    def describe(self) -> str:
        kind = "hypodense" if self.contrast_hu < 0 else "hyperdense"
        if self.tissue == "lung":
            kind = "solid nodule"
        return f"synthetic lesion ({self.tissue}, {kind} {self.contrast_hu:+.0f} HU, {self.style})"


@dataclass(frozen=True)
class _Room:
    """Per tissue: its mask less blocked places, and a coarse grid of how much room there is."""

    region: Mask
    block: tuple[int, int, int]
    room_mm: npt.NDArray[np.float64]


def _room(region: Mask, geometry: Geometry) -> _Room:
    """The coarse grid of :func:`_candidates`: blocks of about ``_BLOCK_MM`` (a block counts as
    inside where all its voxels are), the distance (mm) from each block's centre to the nearest
    outside block's centre less that block's half diagonal: a lower bound of the room around
    the inside block's centre."""
    from scipy import ndimage

    spacing = np.asarray(geometry.spacing)
    block = tuple(max(1, round(_BLOCK_MM / s)) for s in spacing)
    shape = tuple(-(-n // b) * b for n, b in zip(region.shape, block, strict=True))
    padded = np.zeros(shape, dtype=bool)
    padded[: region.shape[0], : region.shape[1], : region.shape[2]] = region
    full = padded.reshape(
        shape[0] // block[0],
        block[0],
        shape[1] // block[1],
        block[1],
        shape[2] // block[2],
        block[2],
    ).all(axis=(1, 3, 5))
    size = spacing * np.asarray(block)
    distance = ndimage.distance_transform_edt(np.pad(full, 1), sampling=size)[1:-1, 1:-1, 1:-1]
    room = np.asarray(distance, dtype=np.float64) - 0.5 * float(np.linalg.norm(size))
    room[~full] = -1.0
    return _Room(region, (block[0], block[1], block[2]), room)


def _candidates(
    room: _Room, radius_mm: float, rng: np.random.Generator, count: int
) -> list[npt.NDArray[np.float64]]:
    """Up to ``count`` candidate centres (fractional voxel indices): centres of blocks with
    ``radius_mm`` of room; where none has, random voxels of the region."""
    blocks = np.argwhere(room.room_mm >= radius_mm)
    size = np.asarray(room.block, dtype=np.float64)
    if len(blocks):
        chosen = blocks[rng.integers(0, len(blocks), count)]
        return list(chosen * size + (size - 1) / 2.0)
    voxels = np.argwhere(room.region)
    if not len(voxels):
        return []
    return list(voxels[rng.integers(0, len(voxels), count)].astype(np.float64))


def _fits(
    region: Mask,
    taken: Mask,
    centre_index: npt.NDArray[np.float64],
    shape: LesionShape,
    geometry: Geometry,
) -> bool:
    """Whether the shape's bounding ellipsoid lies one voxel inside the image, and that
    ellipsoid widened by ``GAP_MM`` (which holds every point within ``GAP_MM`` of the shape)
    lies, as far as it is in the image, in ``region`` and not in ``taken``."""
    directions, semi = shape.ellipsoid()
    step = np.asarray(geometry.direction) * np.asarray(geometry.spacing)
    to_index = np.abs(np.linalg.inv(step))

    def reach(semi_axes: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        extent = np.sqrt((directions * directions) @ (semi_axes * semi_axes))  # per LPS axis
        return np.asarray(to_index @ extent, dtype=np.float64)

    size = np.asarray(region.shape)
    own = reach(semi)
    if np.any(centre_index - own < 1.0) or np.any(centre_index + own > size - 2.0):
        return False
    wide = semi + GAP_MM
    c = np.rint(centre_index).astype(int)
    r = np.ceil(reach(wide)).astype(int) + 1
    low, high = np.maximum(c - r, 0), np.minimum(c + r + 1, size)
    axes = [np.arange(lo, hi, dtype=np.float64) for lo, hi in zip(low, high, strict=True)]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    local = ((grid - centre_index) @ step.T) @ directions / wide
    within = (local * local).sum(axis=-1) <= 1.0
    box = (slice(low[0], high[0]), slice(low[1], high[1]), slice(low[2], high[2]))
    return bool((region[box] & ~taken[box])[within].all())


def _contrast(rule: ContrastRule, rng: np.random.Generator) -> float:
    weights = np.array([p for p, _, _ in rule])
    k = int(rng.choice(len(rule), p=weights / weights.sum()))
    _, low, high = rule[k]
    return float(rng.uniform(low, high))


@dataclass(frozen=True)
class _Tissue:
    name: str
    group: str  # "organ", "lung", "soft"
    mask: Mask
    rule: ContrastRule


def _tissues(maps: TissueMaps) -> list[_Tissue]:
    free = ~maps.blocked
    tissues = [
        _Tissue(name, "organ", mask & free, rule) for name, (mask, rule) in maps.organs.items()
    ]
    tissues.append(_Tissue("lung", "lung", maps.lung & free, LUNG_RULE))
    tissues.append(_Tissue("soft tissue", "soft", maps.soft & free, SOFT_RULE))
    return [t for t in tissues if t.mask.any()]


def _draw_order(tissues: list[_Tissue], rng: np.random.Generator) -> list[_Tissue]:
    """The tissues in a random order, drawn by ``TISSUE_WEIGHTS`` (an organ's weight shared
    among the organs)."""
    groups = [t.group for t in tissues]
    weights = np.array([TISSUE_WEIGHTS[g] / groups.count(g) for g in groups])
    order = rng.choice(len(tissues), size=len(tissues), replace=False, p=weights / weights.sum())
    return [tissues[int(k)] for k in order]


def insert_lesions(
    image: Image,
    labels: npt.NDArray[np.int16],
    geometry: Geometry,
    maps: TissueMaps,
    count: int,
    rng: np.random.Generator,
    first_value: int,
) -> tuple[Image, npt.NDArray[np.int16], list[Inserted]]:
    """Insert up to ``count`` lesions (module doc) into copies of ``image`` and ``labels``;
    their label values are ``first_value``, ``first_value + 1``, ... Per lesion: a tissue by
    ``TISSUE_WEIGHTS``, a long axis log-uniform in ``SIZE_RANGE_MM``, a style by
    ``SHAPE_WEIGHTS``; where no place of that tissue holds it, the size shrinks by
    ``_SHRINK`` down to the smallest, then the next tissue is tried. Fewer lesions where no
    room is left (logged)."""
    image = image.copy()
    labels = labels.copy()
    blur_px = estimate_blur(image, maps.body, geometry)
    extra_blur = math.sqrt(max(blur_px * blur_px - 1.0 / 12.0, 0.0))  # occupancy: box-blurred
    tissues = _tissues(maps)
    rooms: dict[str, _Room] = {}
    taken: Mask = np.zeros(image.shape, dtype=bool)
    # room along z from the middle slice to one slice inside the first and the last
    half_z = ((image.shape[0] - 1) / 2.0 - 1.0) * geometry.slice_plane_distance
    inserted: list[Inserted] = []
    low, high = SIZE_RANGE_MM
    for _ in range(count):
        lesion = None
        for tissue in _draw_order(tissues, rng):
            if tissue.name not in rooms:
                rooms[tissue.name] = _room(tissue.mask, geometry)
            room = rooms[tissue.name]
            long_axis = float(math.exp(rng.uniform(math.log(low), math.log(high))))
            style = str(
                rng.choice(["smooth", "lobulated", "spiculated"], p=SHAPE_WEIGHTS[tissue.group])
            )
            for _ in range(_SIZES):
                if lesion is not None or long_axis < low * 0.999:
                    break
                shape = draw_shape(rng, long_axis, style, max(half_z, 1.0))
                _, semi = shape.ellipsoid()
                outcome: Inserted | str = "no room"
                for centre in _candidates(room, float(semi.min()) + GAP_MM, rng, _TRIES):
                    if not _fits(tissue.mask, taken, centre, shape, geometry):
                        continue
                    outcome = _render(
                        image,
                        labels,
                        geometry,
                        shape,
                        centre,
                        tissue,
                        rng,
                        first_value + len(inserted),
                        extra_blur,
                        long_axis,
                    )
                    if outcome != "no room":
                        break
                if isinstance(outcome, Inserted):
                    lesion = outcome
                elif outcome == "too small":  # its largest axial section is under 5 mm
                    long_axis = min(high, long_axis * _GROW)
                else:
                    long_axis *= _SHRINK
            if lesion is not None:
                break
        if lesion is None:
            logger.info("no room for another lesion (%d of %d inserted)", len(inserted), count)
            break
        inserted.append(lesion)
        _claim(taken, labels == lesion.value, geometry)
    return image, labels, inserted


def _claim(taken: Mask, truth: Mask, geometry: Geometry) -> None:
    """Mark every voxel within ``GAP_MM`` of ``truth`` as taken (in place)."""
    from scipy import ndimage

    where = np.argwhere(truth)
    spacing = np.asarray(geometry.spacing)
    margin = np.ceil(GAP_MM / spacing).astype(int) + 2
    low = np.maximum(where.min(axis=0) - margin, 0)
    high = np.minimum(where.max(axis=0) + margin + 1, np.asarray(truth.shape))
    box = tuple(slice(a, b) for a, b in zip(low, high, strict=True))
    distance = ndimage.distance_transform_edt(~truth[box], sampling=spacing)
    taken[box] |= distance <= GAP_MM + float(spacing.max())


def _render(
    image: Image,
    labels: npt.NDArray[np.int16],
    geometry: Geometry,
    shape: LesionShape,
    centre_index: npt.NDArray[np.float64],
    tissue: _Tissue,
    rng: np.random.Generator,
    value: int,
    blur_px: float,
    long_axis_mm: float,
) -> Inserted | str:
    """Draw one lesion into ``image`` and its truth into ``labels`` (in place); or draw
    nothing and say why: "no room" where part of it would leave its tissue, "too small" where
    its truth's RECIST long axis is under ``SIZE_RANGE_MM[0]``."""
    from scipy import ndimage

    pad = math.ceil(3.0 * blur_px)
    box, occ = occupancy(shape, centre_index, geometry, image.shape, pad_px=pad)
    support = occ > 0
    if not tissue.mask[box][support].all():
        return "no room"
    truth = occ >= 0.5
    parts, count = ndimage.label(truth, structure=np.ones((3, 3, 3), dtype=bool))
    if count == 0:
        return "too small"
    sizes = np.bincount(parts.ravel())[1:]
    truth = parts == int(np.argmax(sizes)) + 1
    from ingestion.dataset.recist import lesion_axes

    if lesion_axes(truth, geometry).long_axis_mm < SIZE_RANGE_MM[0]:  # RECIST: box-invariant
        return "too small"
    # the tissue's own voxels around the lesion: its box widened by 10 mm
    margin = np.ceil(10.0 / np.asarray(geometry.spacing)).astype(int)
    around = tuple(
        slice(max(0, s.start - m), min(n, s.stop + m))
        for s, m, n in zip(box, margin, image.shape, strict=True)
    )
    local = tissue.mask[around]
    values = image[around][local].astype(np.float64)
    if tissue.group == "soft":
        dense = values[(values > -30.0) & (values < 150.0)]
        values = dense if dense.size >= 50 else values
    median = float(np.median(values))
    # the noise of the tissue like the reference (within 50 HU of the median after a
    # 1.5-pixel smoothing: not the fat beside a muscle), else of all the tissue around
    window = image[around]
    like = local & (np.abs(ndimage.gaussian_filter(window, (0.0, 1.5, 1.5)) - median) < 50.0)
    noise = estimate_noise(window, like) or estimate_noise(window, local)
    contrast = _contrast(tissue.rule, rng)
    if noise is not None:  # visible: at least MIN_CNR noise deviations, the sign kept
        contrast = math.copysign(max(abs(contrast), MIN_CNR * noise.sigma_hu), contrast)
    blurred = ndimage.gaussian_filter(occ, (0.0, blur_px, blur_px)) if blur_px > 0 else occ
    texture = noise.sample(rng, occ.shape) if noise is not None else np.zeros_like(occ)
    under = image[box]
    image[box] = under + blurred * (np.float32(median + contrast) + texture - under)
    label_window = labels[box]
    label_window[truth] = value
    centre = geometry.index_to_lps(centre_index)
    return Inserted(
        value,
        tissue.name,
        shape.style,
        contrast,
        median,
        long_axis_mm,
        (float(centre[0]), float(centre[1]), float(centre[2])),
        None if noise is None else float(noise.sigma_hu),
    )
