"""Clicked-caliper training examples from real reads (``dataset import --from reads``).

Each lesion with its mask and readers' reads gives, on every slice its mask crosses, a caliper:
the mask section's RECIST axes (``ingestion.dataset.recist``) scaled about their midpoints so
that the longest slice's axes have the readers' median lengths (the truth the evaluation
scores against; a mask's outline is not a reader's). The long axis of the lesion is the longest
over its slices, as a reader's is.

Examples (:class:`ReadsClicks`), drawn from a generator so a run is reproducible:

- ``axes`` at the first look (a click anywhere inside the lesion, the first look's field) and
  in the view that fits the lesion (centred near the slice's long-axis midpoint, the field the
  lesion's long axis over a fill drawn about the view's own, as a first look's error would
  leave it, or, for ``wide_fill_fraction`` of them, log-uniform in 0.12-0.9 as the looks on
  the way to the view see it), on the measured slice or any other the lesion crosses;
- ``point`` at the first look: "lesion" at a click anywhere inside the lesion, "none" at a
  point at least ``negative_margin_mm`` from it (lung, vessels, chest wall, mediastinum: what
  lies around real nodules), at least that far from the crop's in-plane edge.

Lesions are drawn with weights that give every size bin (``SIZE_BINS_MM``) the same share, so
no size is pulled toward the middle. Which patients may train is the caller's choice
(``ingestion.dataset.split.select_side``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ingestion.dataset.format import Dataset, DatasetFinding
from ingestion.dataset.masks import finding_mask
from ingestion.dataset.recist import lesion_axes
from ingestion.volume import Volume
from model.measurer.data.sources import load_dataset_volume
from model.measurer.evaluate.click_scores import SIZE_BINS_MM, size_bin_of
from model.measurer.inputs.data import AxesExample, PointExample
from model.measurer.inputs.images import Crop
from model.measurer.inputs.view import LesionView, view_crop, view_images
from model.measurer.results import FindingKind
from model.measurer.tasks.axes import axes_answer, axes_prompt, segments_to_pixels
from model.measurer.tasks.text import point_answer, point_prompt

if TYPE_CHECKING:
    from model.measurer.data.hybrid import HybridSource

__all__ = ["ReadLesion", "ReadsClicks", "SliceCaliper", "lesion_from_reads"]

logger = logging.getLogger(__name__)

Vector = tuple[float, float, float]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SliceCaliper:
    """A lesion's caliper on one slice (LPS end points, scaled to the readers' lengths)."""

    slice_index: int
    long_axis: tuple[FloatArray, FloatArray]
    short_axis: tuple[FloatArray, FloatArray]

    @property
    def long_mm(self) -> float:
        return float(np.linalg.norm(self.long_axis[1] - self.long_axis[0]))

    @property
    def short_mm(self) -> float:
        return float(np.linalg.norm(self.short_axis[1] - self.short_axis[0]))

    def scaled(self, long_factor: float, short_factor: float) -> SliceCaliper:
        """Each axis scaled about its own midpoint."""
        return SliceCaliper(
            self.slice_index,
            _scaled(*self.long_axis, long_factor),
            _scaled(*self.short_axis, short_factor),
        )

    @property
    def midpoint(self) -> FloatArray:
        return 0.5 * (self.long_axis[0] + self.long_axis[1])


@dataclass(frozen=True)
class ReadLesion:
    """One read lesion ready to draw examples from."""

    name: str
    volume: Volume
    mask: npt.NDArray[np.bool_]
    calipers: tuple[SliceCaliper, ...]  # by slice, longest first
    long_mm: float  # readers' median
    short_mm: float
    negatives: npt.NDArray[np.int64]  # (N, 3) voxel indices clear of the lesion

    @property
    def size_bin(self) -> str:
        return size_bin_of(self.long_mm)


def _scaled(a: FloatArray, b: FloatArray, factor: float) -> tuple[FloatArray, FloatArray]:
    middle = 0.5 * (a + b)
    return middle + (a - middle) * factor, middle + (b - middle) * factor


def _box(mask: npt.NDArray[np.bool_], pad: int = 1) -> tuple[slice, ...]:
    """The mask's bounding box, ``pad`` voxels wider in-plane (clipped to the array)."""
    index = np.argwhere(mask)
    low, high = index.min(axis=0), index.max(axis=0) + 1
    return tuple(
        slice(
            int(lo) - (0 if axis == 0 else min(pad, int(lo))), int(hi) + (0 if axis == 0 else pad)
        )
        for axis, (lo, hi) in enumerate(zip(low, high, strict=True))
    )


def _slice_calipers(volume: Volume, mask: npt.NDArray[np.bool_]) -> list[SliceCaliper]:
    """The RECIST axes of the mask's section on each slice it crosses (measured on the mask's
    bounding box), unscaled."""
    from ingestion.geometry import Geometry

    box = _box(mask)
    sub = mask[box]
    affine = volume.geometry.affine.copy()
    affine[:3, 3] = volume.geometry.index_to_lps(
        np.array([float(b.start) for b in box], dtype=np.float64)
    )
    geometry = Geometry.from_affine(affine)
    rows = []
    for k in np.flatnonzero(sub.any(axis=(1, 2))):
        only = np.zeros_like(sub)
        only[k] = sub[k]
        axes = lesion_axes(only, geometry)
        a, b = (np.asarray(p, dtype=np.float64) for p in axes.long_axis_lps_mm)
        c, d = (np.asarray(p, dtype=np.float64) for p in axes.short_axis_lps_mm)
        rows.append(SliceCaliper(int(k) + box[0].start, (a, b), (c, d)))
    return rows


def lesion_from_mask(
    name: str,
    volume: Volume,
    mask: npt.NDArray[np.bool_],
    *,
    long_mm: float | None = None,
    short_mm: float | None = None,
    negative_margin_mm: float | None = 5.0,
) -> ReadLesion | None:
    """A lesion from its mask: a caliper on each slice it crosses, scaled so the longest
    slice's axes are ``long_mm`` and ``short_mm`` (the readers' medians; default the mask's
    own), and, with ``negative_margin_mm``, the voxels at least that far from it (and from the
    in-plane edge) as "nothing here". None when the mask gives no axes."""
    from scipy import ndimage

    if not mask.any():
        return None
    per_slice = _slice_calipers(volume, mask)
    longest = max(per_slice, key=lambda c: c.long_mm)
    if longest.long_mm <= 0 or longest.short_mm <= 0:
        return None
    long_mm = longest.long_mm if long_mm is None else float(long_mm)
    short_mm = longest.short_mm if short_mm is None else float(short_mm)
    factors = (long_mm / longest.long_mm, short_mm / longest.short_mm)
    calipers = sorted((c.scaled(*factors) for c in per_slice), key=lambda c: -c.long_mm)
    negatives = np.zeros((0, 3), dtype=np.int64)
    if negative_margin_mm is not None:
        geometry = volume.geometry
        spacing = (geometry.slice_spacing, geometry.row_spacing, geometry.column_spacing)
        distance = ndimage.distance_transform_edt(~mask, sampling=spacing)
        clear = distance >= negative_margin_mm
        edge_r = math.ceil(negative_margin_mm / geometry.row_spacing)
        edge_c = math.ceil(negative_margin_mm / geometry.column_spacing)
        inner = np.zeros_like(clear)
        inner[:, edge_r : mask.shape[1] - edge_r, edge_c : mask.shape[2] - edge_c] = True
        negatives = np.argwhere(clear & inner).astype(np.int64)
    return ReadLesion(
        name=name,
        volume=volume,
        mask=mask,
        calipers=tuple(calipers),
        long_mm=long_mm,
        short_mm=short_mm,
        negatives=negatives,
    )


def lesion_from_reads(
    dataset: Dataset, finding: DatasetFinding, *, negative_margin_mm: float = 5.0
) -> ReadLesion | None:
    """The lesion of one dataset row, its calipers scaled to the readers' medians, or None
    when it has no mask or no reads to learn from."""
    if finding.kind != "lesion" or finding.mask is None or finding.long_axis_mm is None:
        return None
    if finding.short_axis_mm is None:
        return None
    volume = load_dataset_volume(dataset, finding.series_instance_uid)
    mask = finding_mask(dataset.root, finding, volume)
    return lesion_from_mask(
        finding.name or finding.id,
        volume,
        mask,
        long_mm=float(finding.long_axis_mm),
        short_mm=float(finding.short_axis_mm),
        negative_margin_mm=negative_margin_mm,
    )


def hybrid_lesions(source: HybridSource, studies: Sequence[int]) -> list[ReadLesion]:
    """The inserted lesions of hybrid studies (``model.measurer.data.hybrid``) as click
    lesions: other tissues and sizes up to what the generator draws (real nodules are few
    above 20 mm), each slice's caliper its mask's own (no reader to scale to); no "nothing
    here" points (a hybrid study's other lesions are not all annotated)."""
    from model.measurer.data.hybrid import INSERTED_LABEL

    lesions = []
    for index in studies:
        study = source.make(index)
        for inserted in study.lesions:
            if inserted.value < INSERTED_LABEL:
                continue
            mask = study.labels == inserted.value
            lesion = lesion_from_mask(
                f"hybrid {index} {study.background.id} {inserted.describe()}",
                study.volume,
                mask,
                negative_margin_mm=None,
            )
            if lesion is not None:
                lesions.append(lesion)
    return lesions


def _lps(volume: Volume, index: Sequence[float]) -> Vector:
    point = volume.geometry.index_to_lps(np.asarray(index, dtype=np.float64))
    return (float(point[0]), float(point[1]), float(point[2]))


class ReadsClicks:
    """Clicked-caliper examples from read lesions (module doc)."""

    def __init__(
        self,
        lesions: Sequence[ReadLesion],
        view: LesionView,
        *,
        first_look_fraction: float = 0.3,
        measured_slice_fraction: float = 0.5,
        fill_spread: float = 0.15,
        centre_jitter: float = 0.08,
        wide_fill_fraction: float = 0.4,
    ) -> None:
        if not lesions:
            raise ValueError("no read lesion to draw examples from")
        self.lesions = tuple(lesions)
        self.view = view
        self.first_look_fraction = first_look_fraction
        self.measured_slice_fraction = measured_slice_fraction
        self.fill_spread = fill_spread
        self.centre_jitter = centre_jitter
        self.wide_fill_fraction = wide_fill_fraction
        counts = {name: 0 for name, _, _ in SIZE_BINS_MM}
        for lesion in self.lesions:
            counts[lesion.size_bin] += 1
        weights = np.array([1.0 / counts[lesion.size_bin] for lesion in self.lesions])
        self._weights = weights / weights.sum()
        self._with_negatives = [i for i, x in enumerate(self.lesions) if len(x.negatives)]

    @classmethod
    def from_dataset(
        cls, dataset: Dataset | str | Path, view: LesionView, **options: float
    ) -> ReadsClicks:
        """Every read lesion of ``dataset`` (choose its side first)."""
        from ingestion.dataset.format import read_dataset

        data = dataset if isinstance(dataset, Dataset) else read_dataset(dataset)
        lesions = []
        for finding in data.findings:
            lesion = lesion_from_reads(data, finding)
            if lesion is not None:
                lesions.append(lesion)
        logger.info("%d read lesions of %d rows", len(lesions), len(data.findings))
        return cls(lesions, view, **options)

    def _lesion(self, rng: np.random.Generator) -> ReadLesion:
        return self.lesions[int(rng.choice(len(self.lesions), p=self._weights))]

    def _click(self, lesion: ReadLesion, slice_index: int, rng: np.random.Generator) -> Vector:
        rows, cols = np.nonzero(lesion.mask[slice_index])
        k = int(rng.integers(len(rows)))
        jitter = rng.uniform(-0.5, 0.5, 2)
        return _lps(lesion.volume, (slice_index, rows[k] + jitter[0], cols[k] + jitter[1]))

    def _axes(self, crop: Crop, caliper: SliceCaliper) -> str | None:
        pixels = segments_to_pixels((caliper.long_axis, caliper.short_axis), crop.lps_to_pixel)
        limit = float(self.view.size)
        if any(not (0 <= v <= limit) for segment in pixels for point in segment for v in point):
            return None
        return axes_answer(FindingKind.LESION, pixels)

    def axes_examples(self, n: int, rng: np.random.Generator) -> list[AxesExample]:
        """``n`` caliper drawings (module doc); a draw whose caliper leaves its crop is drawn
        again."""
        out: list[AxesExample] = []
        while len(out) < n:
            lesion = self._lesion(rng)
            if rng.random() < self.measured_slice_fraction:
                caliper = lesion.calipers[0]
            else:
                caliper = lesion.calipers[int(rng.integers(len(lesion.calipers)))]
            if rng.random() < self.first_look_fraction:
                centre = self._click(lesion, caliper.slice_index, rng)
                field = self.view.first_look_mm
            else:
                mid = caliper.midpoint
                shift = rng.normal(0.0, self.centre_jitter * lesion.long_mm, 2)
                centre = (float(mid[0] + shift[0]), float(mid[1] + shift[1]), float(mid[2]))
                if rng.random() < self.wide_fill_fraction:  # a look on the way to the view
                    fill = float(np.exp(rng.uniform(np.log(0.12), np.log(0.9))))
                else:
                    fill = float(np.clip(rng.normal(self.view.fill, self.fill_spread), 0.2, 0.85))
                field = self.view.field_for(lesion.long_mm / fill * self.view.fill)
            crop = view_crop(lesion.volume, centre, field, self.view)
            answer = self._axes(crop, caliper)
            if answer is None:
                continue
            out.append(
                AxesExample(
                    FindingKind.LESION, view_images(crop), axes_prompt("lesion"), answer, crop
                )
            )
        return out

    def point_examples(
        self, n: int, rng: np.random.Generator, *, negative_fraction: float = 0.5
    ) -> list[PointExample]:
        """``n`` first looks with the point task: a lesion or "none" (module doc)."""
        out: list[PointExample] = []
        for _ in range(n):
            if self._with_negatives and rng.random() < negative_fraction:
                lesion = self.lesions[int(rng.choice(self._with_negatives))]
                voxel = lesion.negatives[int(rng.integers(len(lesion.negatives)))]
                centre = _lps(lesion.volume, voxel.astype(np.float64))
                answer = point_answer(None)
            else:
                lesion = self._lesion(rng)
                slices = np.flatnonzero(lesion.mask.any(axis=(1, 2)))
                centre = self._click(lesion, int(rng.choice(slices)), rng)
                answer = point_answer(
                    FindingKind.LESION, (round(lesion.long_mm, 1), round(lesion.short_mm, 1))
                )
            crop = view_crop(lesion.volume, centre, self.view.first_look_mm, self.view)
            out.append(PointExample(view_images(crop), point_prompt(), answer))
        return out
