"""Where synthetic lesions may go in a real CT volume (``model.measurer.data._insert``): the body,
the lung, the soft tissue and the labelled organs, each found in the image itself or in the
background's own labels, never from phantom constants.

- body: the largest 3-D component of ``HU > -500`` after an in-plane opening (which cuts the
  table off), each slice's holes filled;
- lung: the aerated air (``HU < -400`` after a 1-pixel in-plane smoothing): its 3-D
  components of at least ``LUNG_MIN_ML`` whose median lies within -960..-500 HU (lung
  parenchyma reads about -850; air and gas -1000, but foam pads and air with a blanket's folds
  can read -950 too) and which enclose vessels (``LUNG_MIN_HOLES``), and at least a tenth of
  the largest such one; small holes (vessels under 2 mm) closed. Not required to lie in the
  body's filled outline, which a field of view that cuts the body leaves open;
- organs: the background's organ labels whose names ``ORGAN_RULES`` know (liver, kidney,
  spleen, pancreas), each with the contrast its lesions have;
- soft tissue: body voxels of -200..200 HU (1-pixel smoothing) outside the lung, bone, gas and
  every labelled structure;
- blocked: the background's known findings and vessels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingestion.geometry import Geometry

__all__ = [
    "LUNG_MIN_HOLES",
    "LUNG_MIN_ML",
    "LUNG_RULE",
    "ORGAN_RULES",
    "SOFT_RULE",
    "ContrastRule",
    "TissueMaps",
    "tissue_maps",
]

ContrastRule = tuple[tuple[float, float, float], ...]
"""Per lesion type (probability, low HU, high HU) of its contrast to the local median."""

ORGAN_RULES: dict[str, tuple[str, ContrastRule]] = {
    "liver": ("liver", ((0.85, -90.0, -20.0), (0.15, 20.0, 60.0))),
    "kidney": ("kidney", ((0.5, -150.0, -30.0), (0.5, 20.0, 80.0))),
    "spleen": ("spleen", ((1.0, -80.0, -20.0),)),
    "pancreas": ("pancreas", ((1.0, -60.0, -20.0),)),
}
"""Organ label names containing a key -> (tissue name, contrast rule): hypodense liver lesions
(some hyperdense), hypo- or hyperdense renal lesions, hypodense splenic and pancreatic ones."""
LUNG_RULE: ContrastRule = ((1.0, 850.0, 950.0),)
"""Solid nodules: 850-950 HU above aerated lung's median (about 0..+100 HU), the soft-tissue
density of solid nodules (unenhanced solid nodules read about 20-60 HU at their centre)."""
SOFT_RULE: ContrastRule = ((0.4, -40.0, -15.0), (0.6, 15.0, 60.0))
"""Soft-tissue masses: against the median of the non-fat soft tissue (-30..150 HU) around."""
LUNG_MIN_ML = 20.0
"""Air components smaller than this are not taken for lung."""
LUNG_MIN_HOLES = 0.005
"""Lung encloses vessels: on its slices, at least this share of its filled outline (1-2 % in
the LIDC chest; 0 in foam pads, the air around the body and bowel gas of the backgrounds)."""

Image = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class TissueMaps:
    """Where lesions may go (module doc). ``organs``: tissue name -> (mask, contrast rule)."""

    body: Mask
    lung: Mask
    soft: Mask
    organs: dict[str, tuple[Mask, ContrastRule]]
    blocked: Mask  # known findings and vessels


def _disk(radius_px: float) -> Mask:
    r = max(1, math.ceil(radius_px))
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    disk: Mask = (yy * yy + xx * xx) <= radius_px * radius_px + 1e-9
    return disk


def _is_lung(values: Image, component: Mask) -> bool:
    """Whether an air component (``component`` in ``values``, a box of the image) is aerated
    lung: its median within -960..-500 HU, and vessels inside: the structures it encloses on
    each slice (its holes) at least ``LUNG_MIN_HOLES`` of its filled outline (foam pads and
    the air around the body, which can read -950, enclose none)."""
    from scipy import ndimage

    if not -960.0 < float(np.median(values[component])) < -500.0:
        return False
    filled = np.stack([ndimage.binary_fill_holes(s) for s in component])
    holes = int((filled & ~component).sum())
    return holes >= LUNG_MIN_HOLES * int(filled.sum())


def tissue_maps(
    image: Image,
    labels: npt.NDArray[np.int16],
    geometry: Geometry,
    label_names: dict[int, tuple[str, str]],
) -> TissueMaps:
    """The tissue masks of the module doc. ``label_names``: value -> (name, role) where role is
    "lesion", "vessel" or "organ"."""
    from scipy import ndimage

    pixel = min(geometry.row_spacing, geometry.column_spacing)
    voxel_ml = geometry.slice_spacing * geometry.row_spacing * geometry.column_spacing / 1000.0
    smooth = ndimage.gaussian_filter(image, (0.0, 1.0, 1.0))
    dense = smooth > -500.0
    opened = ndimage.binary_opening(dense, structure=_disk(3.0 / pixel)[None])
    parts, count = ndimage.label(opened)
    body: Mask = np.zeros(image.shape, dtype=bool)
    if count:
        sizes = np.bincount(parts.ravel())[1:]
        body = parts == int(np.argmax(sizes)) + 1
        for k in range(body.shape[0]):
            body[k] = ndimage.binary_fill_holes(body[k])
    labelled = labels != 0
    air = (smooth < -400.0) & ~labelled
    lung: Mask = np.zeros(image.shape, dtype=bool)
    parts, count = ndimage.label(air)
    if count:
        volumes = np.bincount(parts.ravel(), minlength=count + 1)[1:] * voxel_ml
        boxes = ndimage.find_objects(parts)
        aerated = {
            k + 1: float(volumes[k])
            for k in np.nonzero(volumes >= LUNG_MIN_ML)[0]
            if _is_lung(image[boxes[k]], parts[boxes[k]] == k + 1)
        }
        if aerated:
            largest = max(aerated.values())
            keep = [k for k, v in aerated.items() if v >= 0.1 * largest]
            lung = np.isin(parts, keep)
            closing = _disk(1.0 / pixel)[None]
            lung = ndimage.binary_closing(lung, structure=closing) & ~labelled
            body = body | lung  # where a cut field leaves the lung open, it is still inside
    soft = body & ~lung & (smooth > -200.0) & (smooth < 200.0) & ~labelled
    organs: dict[str, tuple[Mask, ContrastRule]] = {}
    blocked: Mask = np.zeros(image.shape, dtype=bool)
    for value, (name, role) in sorted(label_names.items()):
        if role in ("lesion", "vessel"):
            blocked |= labels == value
            continue
        lowered = name.lower()
        for key, (tissue, rule) in ORGAN_RULES.items():
            if key in lowered:
                mask = labels == value
                if mask.any():
                    old = organs.get(tissue)
                    organs[tissue] = ((old[0] | mask) if old else mask, rule)
    return TissueMaps(body, lung, soft, organs, blocked)
