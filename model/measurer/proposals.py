"""Contrast proposals: places in the find planes that differ from the tissue around them, for
the model's point task to decide on.

The find step boxes what it sees plane by plane, and a small model misses some lesions or puts
their box one merged token off (``model.measurer.voting``) on every plane, so that nothing is
left of them after grouping. Classic CAD splits detection into candidate generation and a
classifier that decides; here the candidates come from the image and the decision stays with
the model: the pipeline asks the point task at each proposal that no find candidate covers, and
a proposal becomes a finding only where the point task names a kind (``model.measurer.pipeline``).

A proposal is a connected region of the examined planes (3-D, face-connected) whose smoothed HU
differs from the background by more than a threshold, with the background being

- the *soft tissue*: the most common smoothed value inside the fat rim (the phantom spec's
  tissue is uniform, 30-60 HU, and lesions and the vessel cover a small part of it), and
- the *fat rim* (spec: -100 HU, 5-20 mm thick), found as the fat-like region (below -35 HU,
  halfway between fat and the darkest tissue) connected to the body's edge; the tissue next to
  it and to the body's edge (``rim_margin_mm``) proposes nothing, as smoothing mixes the two
  there. Inside the rim, only what is brighter than the tissue proposes.

The threshold follows the noise: ``max(min_contrast_hu, noise_factor * sd)`` with ``sd`` the
robust spread of the smoothed tissue. The spec's lesions differ from tissue by 40-120 HU and its
noise is 8-25 HU before smoothing. Brighter and darker regions are labelled apart, so a
hyperdense lesion next to a hypodense one stays two proposals. A region smaller than
``min_area_mm2`` on its largest plane is noise; one larger than ``max_size_mm`` across is no
finding of the spec. Each proposal sits at the centroid of its largest plane.

Pure NumPy/SciPy on HU planes in the find step's prepared grid (square pixels).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import ndimage

from model.measurer.grouping import GroupedFinding
from model.measurer.results import FindingKind

__all__ = [
    "BODY_MIN_HU",
    "Proposal",
    "ProposalRule",
    "contrast_proposals",
    "uncovered",
    "window_to_hu",
]

BODY_MIN_HU = -190.0  # air is -1000 HU (-200 in the find step's wide window), fat -100 HU
FAT_HU = -100.0  # the phantom spec's fat rim
TISSUE_MIN_HU = 30.0  # the spec's soft tissue: 30-60 HU


@dataclass(frozen=True)
class ProposalRule:
    """How contrast proposals are made (module doc)."""

    smooth_mm: float = 1.0  # Gaussian sigma in the axial plane
    min_contrast_hu: float = 20.0
    noise_factor: float = 4.0
    min_area_mm2: float = 15.0
    max_size_mm: float = 75.0
    rim_margin_mm: float = 2.0
    max_proposals: int = 8  # per study, the largest first

    def __post_init__(self) -> None:
        for name in (
            "smooth_mm",
            "min_contrast_hu",
            "noise_factor",
            "min_area_mm2",
            "max_size_mm",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"ProposalRule.{name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.rim_margin_mm) and self.rim_margin_mm >= 0):
            raise ValueError(
                f"ProposalRule.rim_margin_mm must be a finite number >= 0, got "
                f"{self.rim_margin_mm!r}"
            )
        if isinstance(self.max_proposals, bool) or int(self.max_proposals) < 0:
            raise ValueError(
                f"ProposalRule.max_proposals must be an integer >= 0, got {self.max_proposals!r}"
            )


@dataclass(frozen=True)
class Proposal:
    """A region that differs from its background, in the examined planes' grid.

    ``plane`` is the ordinal of the examined plane where the region is largest, ``row`` and
    ``column`` its centroid there (fractional pixel indices), ``size_mm`` the largest extent
    of the region across (on any plane), ``planes`` the ordinals it covers and ``contrast_hu``
    its mean difference from the background on its largest plane (signed).
    """

    plane: int
    row: float
    column: float
    size_mm: float
    planes: tuple[int, ...]
    contrast_hu: float
    area_mm2: float


def window_to_hu(values: npt.ArrayLike, window: tuple[float, float]) -> npt.NDArray[np.float32]:
    """Invert a (level, width) window that mapped HU to [0, 1] (values at 0 or 1 were clipped:
    they stand for HU at or beyond the window's ends)."""
    level, width = window
    return (np.asarray(values, dtype=np.float32) * width + (level - width / 2)).astype(np.float32)


def contrast_proposals(
    hu: npt.ArrayLike, pixel_mm: float, rule: ProposalRule | None = None
) -> list[Proposal]:
    """Proposals in ``hu`` (P, H, W): examined axial planes in HU, square pixels of
    ``pixel_mm``. Largest first, at most ``rule.max_proposals``."""
    rule = rule or ProposalRule()
    planes = np.asarray(hu, dtype=np.float32)
    if planes.ndim != 3:
        raise ValueError(f"hu must be (planes, rows, columns), got shape {planes.shape}")
    if not (math.isfinite(pixel_mm) and pixel_mm > 0):
        raise ValueError(f"pixel_mm must be a finite number > 0, got {pixel_mm!r}")
    if planes.size == 0 or rule.max_proposals == 0:
        return []
    body = planes > BODY_MIN_HU
    if not body.any():
        return []
    # the body's bounding box, with a margin for smoothing (the rest is air)
    _, rows, columns = np.nonzero(body)
    pad = math.ceil(3 * rule.smooth_mm / pixel_mm) + 1
    r0, c0 = max(0, int(rows.min()) - pad), max(0, int(columns.min()) - pad)
    box = (
        slice(None),
        slice(r0, int(rows.max()) + pad + 1),
        slice(c0, int(columns.max()) + pad + 1),
    )
    planes, body = planes[box], body[box]
    smooth = _smooth_inside(planes, body, rule.smooth_mm / pixel_mm)
    edge = body & ~_in_plane(ndimage.binary_erosion, body, 2)
    rim = _fat_rim(smooth, body, edge)
    margin = round(rule.rim_margin_mm / pixel_mm)
    near_rim = _in_plane(ndimage.binary_dilation, rim, margin) if margin else rim
    inner = _in_plane(ndimage.binary_erosion, body, margin) if margin else body
    tissue_zone = inner & ~near_rim
    if not tissue_zone.any():
        return []
    tissue, spread = _tissue_level(smooth[tissue_zone])
    threshold = max(rule.min_contrast_hu, rule.noise_factor * spread)
    # inside the fat rim, what is brighter than the tissue (and so than fat) is proposed too
    bright = (tissue_zone | rim) & (smooth > max(tissue, FAT_HU) + threshold)
    dark = tissue_zone & (smooth < tissue - threshold)
    found: list[Proposal] = []
    for mask in (bright, dark):
        found += _regions(mask, smooth, tissue, pixel_mm, rule)
    found = [dataclasses.replace(p, row=p.row + r0, column=p.column + c0) for p in found]
    found.sort(key=lambda p: -p.area_mm2)
    return found[: rule.max_proposals]


def _smooth_inside(
    planes: npt.NDArray[np.float32], body: npt.NDArray[np.bool_], sigma: float
) -> npt.NDArray[np.float32]:
    """Gaussian smoothing in each plane, normalised over the body (air does not bleed in)."""
    weight = body.astype(np.float32)
    sigmas = (0.0, sigma, sigma)
    num = ndimage.gaussian_filter(planes * weight, sigmas, mode="constant")
    den = ndimage.gaussian_filter(weight, sigmas, mode="constant")
    out = np.where(den > 1e-3, num / np.maximum(den, 1e-3), planes)
    return out.astype(np.float32)


def _in_plane(operation: Any, mask: npt.NDArray[np.bool_], steps: int) -> npt.NDArray[np.bool_]:
    """A binary erosion or dilation by ``steps`` pixels in each plane (3 x 3 square), none
    along the planes' axis."""
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[1] = True
    return np.asarray(operation(mask, structure=structure, iterations=steps), dtype=bool)


def _fat_rim(
    smooth: npt.NDArray[np.float32],
    body: npt.NDArray[np.bool_],
    edge: npt.NDArray[np.bool_],
) -> npt.NDArray[np.bool_]:
    """The fat-like region (below halfway between fat and the darkest tissue) connected to
    the body's edge, plane by plane."""
    fat_like = body & (smooth < (FAT_HU + TISSUE_MIN_HU) / 2)
    rim = np.zeros_like(body)
    for k in range(fat_like.shape[0]):
        labels, count = ndimage.label(fat_like[k])
        if not count:
            continue
        touching = np.unique(labels[edge[k] & fat_like[k]])
        rim[k] = np.isin(labels, touching[touching > 0])
    return rim


def _tissue_level(values: npt.NDArray[np.float32]) -> tuple[float, float]:
    """The tissue's HU (the most common smoothed value, 1 HU bins) and the robust spread of
    the values within 40 HU of it (lesions and the vessel lie further off)."""
    clipped = np.clip(values, -100.0, 300.0)
    counts, edges = np.histogram(clipped, bins=400, range=(-100.0, 300.0))
    k = int(np.argmax(counts))
    mode = float((edges[k] + edges[k + 1]) / 2)
    close = values[np.abs(values - mode) < 40.0]
    tissue = float(np.median(close))
    spread = 1.4826 * float(np.median(np.abs(close - tissue)))
    return tissue, spread


def _regions(
    mask: npt.NDArray[np.bool_],
    smooth: npt.NDArray[np.float32],
    tissue: float,
    pixel_mm: float,
    rule: ProposalRule,
) -> list[Proposal]:
    labels, count = ndimage.label(mask)  # face-connected in 3-D
    if not count:
        return []
    out = []
    pixel_area = pixel_mm * pixel_mm
    for index, where in enumerate(ndimage.find_objects(labels), start=1):
        if where is None:
            continue
        region = labels[where] == index
        areas = region.sum(axis=(1, 2))
        best = int(np.argmax(areas))
        area = float(areas[best]) * pixel_area
        rows_extent = (where[1].stop - where[1].start) * pixel_mm
        columns_extent = (where[2].stop - where[2].start) * pixel_mm
        size = float(max(rows_extent, columns_extent))
        if area < rule.min_area_mm2 or size > rule.max_size_mm:
            continue
        rows, columns = np.nonzero(region[best])
        values = smooth[where][best][region[best]]
        covered = np.nonzero(areas)[0]
        start = where[0].start
        out.append(
            Proposal(
                plane=start + best,
                row=float(rows.mean()) + where[1].start,
                column=float(columns.mean()) + where[2].start,
                size_mm=size,
                planes=tuple(int(start + p) for p in covered),
                contrast_hu=float(values.mean() - tissue),
                area_mm2=area,
            )
        )
    return out


def uncovered(
    proposals: Sequence[GroupedFinding],
    candidates: Sequence[GroupedFinding],
    plane_spacing_mm: float,
) -> list[GroupedFinding]:
    """The proposals that no candidate covers: a candidate covers a proposal when their axial
    centres are within ``max(10 mm, half the larger size)`` (the spec's match radius) and, for a
    lesion candidate, their z within half the larger size plus two plane spacings (a vessel
    runs through the study)."""
    out = []
    for proposal in proposals:
        px, py, pz = proposal.center_lps_mm
        for candidate in candidates:
            cx, cy, cz = candidate.center_lps_mm
            size = max(proposal.size_mm, candidate.size_mm)
            if math.hypot(px - cx, py - cy) > max(10.0, size / 2):
                continue
            if candidate.kind is FindingKind.VESSEL or abs(pz - cz) <= (
                size / 2 + 2 * plane_spacing_mm
            ):
                break
        else:
            out.append(proposal)
    return out
