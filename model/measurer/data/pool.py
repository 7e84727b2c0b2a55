"""Training material: studies with their truth, turned into a rolling pool of examples.

A :class:`StudySource` (``model.measurer.data.sources``: phantoms, folders, datasets, mixes)
gives numbered training studies (a volume and its true findings).

:class:`StudyPool` keeps, for the most recent studies, what training draws from: per finding a
small float16 patch (measure crops are cut fresh, with a new jitter, every time they are drawn)
and a few prepared planes (find prompts). The pool's content is a pure function of the step::

    studies made by step s:  n(s) = initial + floor(s * studies_per_step)
    pool at step s:          studies max(0, n(s) - size) .. n(s) - 1

so a run resumed at step ``s`` rebuilds exactly the pool it had, and a batch drawn with the
step's own generator (``numpy.random.default_rng([seed, step])``) is the same batch.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from model.measurer.data.study import StudySource
from model.measurer.inputs.data import (
    AxesExample,
    FindingPatch,
    MeasureExample,
    MeasureInputs,
    PointExample,
    background_patches,
    finding_patches,
    negative_patches,
)
from model.measurer.inputs.find import FindExample, FindInputs, FindPlane, find_planes
from model.measurer.inputs.images import SIDE_MULTIPLE
from model.measurer.results import FindingKind

__all__ = [
    "PoolEntry",
    "StudyPool",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class PoolEntry:
    """What one study contributes: finding patches (measure and point examples), background
    patches (point examples answered "none") and find planes."""

    patches: tuple[FindingPatch, ...]
    background: tuple[FindingPatch, ...]
    planes: tuple[FindPlane, ...]


class StudyPool:
    """The rolling pool of training material (module doc).

    Args:
        source: where studies come from.
        measure_inputs, find_inputs: how crops and find images are made.
        size: most studies kept.
        initial: studies made before step 0.
        studies_per_step: new studies per training step (0: a fixed pool of ``initial``).
        planes_per_study: find planes kept per study.
        background_per_study: background patches kept per study (point examples).
        click_fraction: > 0: point examples click anywhere within this fraction of a finding's
            outline (else within 40 % of its short half-axis of the centre).
        near_background_fraction: share of the background patches drawn beside a finding
            (``data.background_patches``).
        find_shift_px: find planes are shifted by up to this many pixels (0: not shifted).
        scoped_find_fraction: share of the find examples of planes labelled for both kinds
            that ask for one kind only (lesion or vessel, a fair coin), so the one-kind prompts
            that studies annotated for one kind teach are not tied to those studies.
        seed: seeds the choice of planes.
        on_study: called with each study index as it is added (progress).
    """

    def __init__(
        self,
        source: StudySource,
        measure_inputs: MeasureInputs,
        find_inputs: FindInputs,
        *,
        size: int,
        initial: int,
        studies_per_step: float,
        planes_per_study: int,
        background_per_study: int = 2,
        click_fraction: float = 0.0,
        near_background_fraction: float = 0.0,
        find_shift_px: int = 0,
        scoped_find_fraction: float = 0.0,
        seed: int,
        on_study: Callable[[int], None] | None = None,
    ) -> None:
        if size < 1 or initial < 1 or initial > size:
            raise ValueError(f"need 1 <= initial ({initial}) <= size ({size})")
        if not (math.isfinite(studies_per_step) and studies_per_step >= 0):
            raise ValueError(f"studies_per_step must be >= 0, got {studies_per_step}")
        self.source = source
        self.measure_inputs = measure_inputs
        self.find_inputs = find_inputs
        self.size = size
        self.initial = initial
        self.studies_per_step = studies_per_step
        self.planes_per_study = planes_per_study
        self.background_per_study = background_per_study
        self.click_fraction = click_fraction
        if not 0 <= find_shift_px < SIDE_MULTIPLE:
            raise ValueError(
                f"find_shift_px must be in [0, {SIDE_MULTIPLE}) pixels, got {find_shift_px}"
            )
        self.near_background_fraction = near_background_fraction
        self.find_shift_px = find_shift_px
        if not 0 <= scoped_find_fraction <= 1:
            raise ValueError(f"scoped_find_fraction must be in [0, 1], got {scoped_find_fraction}")
        self.scoped_find_fraction = scoped_find_fraction
        self.seed = seed
        self.on_study = on_study
        self._entries: OrderedDict[int, PoolEntry] = OrderedDict()

    def made_by(self, step: int) -> int:
        """n(s): how many studies exist at ``step``."""
        return self.initial + math.floor(step * self.studies_per_step)

    def advance(self, step: int) -> None:
        """Bring the pool to its content at ``step`` (adding and dropping studies)."""
        end = self.made_by(step)
        start = max(0, end - self.size)
        for index in [i for i in self._entries if i < start]:
            del self._entries[index]
        for index in range(max(start, max(self._entries, default=-1) + 1), end):
            self._entries[index] = self._entry(index)
            if self.on_study is not None:
                self.on_study(index)

    def _entry(self, index: int) -> PoolEntry:
        """One study's material. A find plane says "nothing here" about every kind it asks
        for, so it asks only for the kinds the study annotates exhaustively (none: no planes).
        Background patches say it about both kinds, so they come only from studies annotated
        exhaustively for both (phantoms, label maps of lesions and vessels); a reviewer's
        negative example is a background patch of its own wherever it comes from."""
        study = self.source.study(index)
        rng = np.random.default_rng([self.seed, index])
        patches = finding_patches(
            study.volume, study.findings, self.measure_inputs, click_fraction=self.click_fraction
        )
        kinds = {FindingKind(k) for k in study.annotated if k in {"lesion", "vessel"}}
        complete = kinds == set(FindingKind)
        planes = (
            find_planes(
                study.volume,
                study.findings,
                self.find_inputs,
                rng,
                planes=self.planes_per_study,
                kinds=kinds,
            )
            if kinds
            else []
        )
        background = (
            background_patches(
                study.volume,
                study.findings,
                self.measure_inputs,
                rng,
                count=self.background_per_study,
                near_fraction=self.near_background_fraction,
            )
            if complete
            else []
        )
        background += negative_patches(study.volume, study.negatives, self.measure_inputs)
        return PoolEntry(tuple(patches), tuple(background), tuple(planes))

    @property
    def patches(self) -> list[FindingPatch]:
        return [p for entry in self._entries.values() for p in entry.patches]

    @property
    def background(self) -> list[FindingPatch]:
        return [p for entry in self._entries.values() for p in entry.background]

    @property
    def planes(self) -> list[FindPlane]:
        return [p for entry in self._entries.values() for p in entry.planes]

    def measure_examples(self, n: int, rng: np.random.Generator) -> list[MeasureExample]:
        """``n`` fresh crops of findings drawn uniformly from the pool."""
        patches = self.patches
        return [patches[i].example(self.measure_inputs, rng) for i in _draw(rng, len(patches), n)]

    def point_examples(self, n: int, rng: np.random.Generator) -> list[PointExample]:
        """``n`` clicks: on findings and on background, half each (by a fair coin per click)."""
        patches, background = self.patches, self.background
        out = []
        for _ in range(n):
            pool = background if background and rng.uniform() < 0.5 else patches
            out.append(pool[_draw(rng, len(pool), 1)[0]].point_example(self.measure_inputs, rng))
        return out

    def axes_examples(self, n: int, rng: np.random.Generator) -> list[AxesExample]:
        """Up to ``n`` axes examples of findings drawn uniformly (a draw whose axes leave the
        jittered crop is drawn again, at most ``4 n`` draws in all)."""
        patches = self.patches
        out: list[AxesExample] = []
        for _ in range(4 * n):
            if len(out) == n:
                break
            example = patches[_draw(rng, len(patches), 1)[0]].axes_example(self.measure_inputs, rng)
            if example is not None:
                out.append(example)
        return out

    def find_examples(self, n: int, rng: np.random.Generator) -> list[FindExample]:
        """``n`` find planes drawn uniformly from the pool, each with its content shifted by
        up to ``find_shift_px`` pixels along rows and columns (uniform, whole pixels), asking
        for the kinds its study annotates (one of both for ``scoped_find_fraction`` of the
        planes labelled for both); none while no study of the pool annotates a kind
        exhaustively (``_entry``)."""
        planes = self.planes
        if not planes:
            return []
        out = []
        for i in _draw(rng, len(planes), n):
            shift = (0, 0)
            if self.find_shift_px:
                r, c = rng.integers(-self.find_shift_px, self.find_shift_px + 1, 2)
                shift = (int(r), int(c))
            kinds = None
            if (
                self.scoped_find_fraction
                and len(planes[i].kinds) > 1
                and rng.uniform() < self.scoped_find_fraction
            ):
                kinds = [sorted(planes[i].kinds)[int(rng.integers(0, len(planes[i].kinds)))]]
            out.append(planes[i].example(self.find_inputs, shift, kinds))
        return out


def _draw(rng: np.random.Generator, available: int, n: int) -> Sequence[int]:
    if available == 0:
        raise ValueError("the training pool is empty: no study had a finding")
    return [int(i) for i in rng.integers(0, available, n)]
