"""Training material: studies with their truth, turned into a rolling pool of examples.

A :class:`StudySource` gives numbered training studies (a volume and its true findings):
:class:`PhantomSource` generates phantoms on the fly (study ``i`` from ``study_seed(seed, i)``,
the seeds ``radcaliper phantoms`` uses), :class:`FolderSource` reads the studies that
``radcaliper phantoms`` wrote (DICOM series plus ``truth.json``).

:class:`StudyPool` keeps, for the most recent studies, what training draws from: per finding a
small float16 patch (measure crops are cut fresh, with a new jitter, every time they are drawn)
and a few prepared planes (find prompts). The pool's content is a pure function of the step::

    studies made by step s:  n(s) = initial + floor(s * studies_per_step)
    pool at step s:          studies max(0, n(s) - size) .. n(s) - 1

so a run resumed at step ``s`` rebuilds exactly the pool it had, and a batch drawn with the
step's own generator (``numpy.random.default_rng([seed, step])``) is the same batch.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ingestion.errors import ConfigurationError
from ingestion.phantoms import PhantomSpec, TruthFinding, generate_phantom, study_seed
from ingestion.volume import Volume
from model.measurer.data import (
    AxesExample,
    FindingPatch,
    MeasureExample,
    MeasureInputs,
    PointExample,
    background_patches,
    finding_patches,
    phantom_volume,
)
from model.measurer.find import FindExample, FindInputs, FindPlane, find_planes
from model.measurer.images import SIDE_MULTIPLE

__all__ = [
    "FolderSource",
    "PhantomSource",
    "PoolEntry",
    "StudyPool",
    "StudySource",
    "TrainingStudy",
    "read_truth",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class TrainingStudy:
    """A volume and its true findings."""

    volume: Volume
    findings: tuple[TruthFinding, ...]
    name: str


class StudySource(Protocol):
    """Numbered training studies (index >= 0; a finite source repeats itself)."""

    def study(self, index: int) -> TrainingStudy: ...

    def describe(self) -> dict[str, object]:
        """Provenance for the checkpoint's model card."""
        ...


@dataclass(frozen=True)
class PhantomSource:
    """Phantoms generated on the fly: study ``i`` is ``generate_phantom(study_seed(seed, i))``."""

    seed: int
    spec: PhantomSpec | None = None

    def study(self, index: int) -> TrainingStudy:
        phantom = generate_phantom(study_seed(self.seed, index), self.spec)
        return TrainingStudy(phantom_volume(phantom), phantom.findings, f"phantom {index}")

    def describe(self) -> dict[str, object]:
        return {"source": "phantoms", "seed": self.seed, "spec": "phantom-spec.md defaults"}


def read_truth(path: Path) -> tuple[TruthFinding, ...]:
    """The findings of a ``truth.json`` written by ``radcaliper phantoms``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return tuple(TruthFinding(**finding) for finding in data["findings"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigurationError(f"{path}: not a readable phantom truth.json ({error})") from error


class FolderSource:
    """Studies under ``root``: each folder holding a ``truth.json`` and its DICOM series or NIfTI
    file (as ``radcaliper phantoms`` writes them), in sorted order, repeated cyclically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folders = sorted(p.parent for p in root.rglob("truth.json"))
        if not self.folders:
            raise ConfigurationError(
                f"{root} holds no study with a truth.json; write some with "
                "'radcaliper phantoms OUT --n N --seed S'"
            )

    def study(self, index: int) -> TrainingStudy:
        from ingestion.load import load_path

        folder = self.folders[index % len(self.folders)]
        findings = read_truth(folder / "truth.json")
        dicom = folder / "dicom"
        result = load_path(dicom if dicom.is_dir() else folder)
        if not result.volumes:
            reasons = "; ".join(f"{r.path}: {r.reason}" for r in result.rejected[:3])
            raise ConfigurationError(f"{folder}: no loadable series ({reasons})")
        return TrainingStudy(result.volumes[0], findings, str(folder))

    def describe(self) -> dict[str, object]:
        return {"source": "folder", "path": str(self.root), "studies": len(self.folders)}


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
        study = self.source.study(index)
        rng = np.random.default_rng([self.seed, index])
        patches = finding_patches(
            study.volume, study.findings, self.measure_inputs, click_fraction=self.click_fraction
        )
        planes = find_planes(
            study.volume, study.findings, self.find_inputs, rng, planes=self.planes_per_study
        )
        background = background_patches(
            study.volume,
            study.findings,
            self.measure_inputs,
            rng,
            count=self.background_per_study,
            near_fraction=self.near_background_fraction,
        )
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
        up to ``find_shift_px`` pixels along rows and columns (uniform, whole pixels)."""
        planes = self.planes
        out = []
        for i in _draw(rng, len(planes), n):
            shift = (0, 0)
            if self.find_shift_px:
                r, c = rng.integers(-self.find_shift_px, self.find_shift_px + 1, 2)
                shift = (int(r), int(c))
            out.append(planes[i].example(self.find_inputs, shift))
        return out


def _draw(rng: np.random.Generator, available: int, n: int) -> Sequence[int]:
    if available == 0:
        raise ValueError("the training pool is empty: no study had a finding")
    return [int(i) for i in rng.integers(0, available, n)]
