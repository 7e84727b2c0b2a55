"""Training material: studies with their truth, turned into a rolling pool of examples.

A :class:`StudySource` gives numbered training studies (a volume and its true findings):
:class:`PhantomSource` generates phantoms on the fly (study ``i`` from ``study_seed(seed, i)``,
the seeds ``radcaliper phantoms`` uses), :class:`FolderSource` reads the studies that
``radcaliper phantoms`` wrote (DICOM series plus ``truth.json``), :class:`DatasetSource` the
studies of a dataset folder (``ingestion.dataset``: masks, SEG, SR, reviews, phantoms), and
:class:`MixedSource` draws each study from one of several sources by weight
(``radcaliper train --dataset DIR:3,phantoms:1``).

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

from ingestion.dataset.format import Dataset, Label, TrueFinding, read_dataset
from ingestion.errors import ConfigurationError, IngestionError
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
    negative_patches,
    phantom_volume,
)
from model.measurer.find import FindExample, FindInputs, FindPlane, find_planes
from model.measurer.images import SIDE_MULTIPLE
from model.measurer.results import FindingKind

__all__ = [
    "DatasetSource",
    "FolderSource",
    "MixedSource",
    "PhantomSource",
    "PoolEntry",
    "StudyPool",
    "StudySource",
    "TrainingStudy",
    "load_dataset_volume",
    "parse_sources",
    "read_truth",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class TrainingStudy:
    """A volume and its true findings.

    Args:
        volume: the image.
        findings: the true findings (``negatives`` excluded).
        name: for reports (a path or "phantom 12").
        negatives: places a reviewer said hold no finding (evaluation counts a report there as
            false; training does not use them yet).
        annotated: the kinds annotated exhaustively (a report of another kind is unjudged).
    """

    volume: Volume
    findings: tuple[TrueFinding, ...]
    name: str
    negatives: tuple[TrueFinding, ...] = ()
    annotated: tuple[str, ...] = ("lesion", "vessel")


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


def load_dataset_volume(dataset: Dataset, series_instance_uid: str) -> Volume:
    """Load the image of one series of ``dataset``.

    Raises:
        IngestionError: the image is missing, unreadable or no longer holds that series (a file
            changed since the import), named with its path.
    """
    from dataclasses import replace

    from ingestion.load import iter_volumes
    from ingestion.scan import scan_path
    from ingestion.volume import Modality

    study = dataset.study(series_instance_uid)
    path = study.image.resolve(dataset.root)
    if not path.exists():
        raise IngestionError(
            f"{path}: the image of series {series_instance_uid} is missing; the dataset "
            f"{dataset.root} refers to it (import it again where the images are)"
        )
    modality = Modality(study.image.modality) if study.image.modality in ("CT", "MR") else None
    scanned = scan_path(path)  # headers only: of a folder of several series, load the one
    # a row from the store names a stack of a split series by its key (Identifiers.series_key)
    chosen = [s for s in scanned.series if s.series_key == series_instance_uid]
    stacks = [s for s in scanned.series if s.info.series_instance_uid == series_instance_uid]
    if not chosen and len(stacks) > 1:
        raise IngestionError(
            f"{path}: series {series_instance_uid} holds {len(stacks)} stacks and the dataset "
            "row does not say which it is on (a row imported from a store of before stacks "
            "were told apart); import it again from a store that measured it since"
        )
    scanned = replace(scanned, series=chosen)
    rejected = []
    for item in iter_volumes(scanned, modality):
        if isinstance(item, Volume):
            if item.identifiers.series_key == series_instance_uid:
                return item
        else:
            rejected.append(item)
    reasons = "; ".join(f"{r.path}: {r.reason}" for r in [*scanned.rejected, *rejected][:3])
    raise IngestionError(
        f"{path}: holds no series {series_instance_uid} any more"
        + (f" ({reasons})" if reasons else "")
        + "; the file changed since the import: import it again"
    )


class DatasetSource:
    """The series of a dataset folder (``ingestion.dataset``), in sorted order, repeated
    cyclically; the last few volumes loaded are kept in memory.

    Args:
        root: the dataset folder.
        series: only these series UIDs (a split), in this order; default: all.
        cache: volumes kept in memory.
    """

    def __init__(
        self,
        root: Path,
        *,
        series: Sequence[str] | None = None,
        cache: int = 4,
    ) -> None:
        self.root = Path(root)
        self.dataset = read_dataset(self.root)
        self.series = list(series) if series is not None else self.dataset.series()
        if not self.series:
            raise ConfigurationError(
                f"{self.root} holds no study; add some with 'radcaliper dataset import'"
            )
        self.cache = cache
        self._volumes: OrderedDict[str, Volume] = OrderedDict()

    def __len__(self) -> int:
        return len(self.series)

    def _volume(self, uid: str) -> Volume:
        if uid in self._volumes:
            self._volumes.move_to_end(uid)
            return self._volumes[uid]
        volume = load_dataset_volume(self.dataset, uid)
        self._volumes[uid] = volume
        while len(self._volumes) > self.cache:
            self._volumes.popitem(last=False)
        return volume

    def study(self, index: int) -> TrainingStudy:
        uid = self.series[index % len(self.series)]
        entry = self.dataset.study(uid)
        rows = self.dataset.findings_of(uid)
        return TrainingStudy(
            self._volume(uid),
            tuple(r for r in rows if r.label is Label.FINDING),
            entry.image.path,
            negatives=tuple(r for r in rows if r.label is Label.NEGATIVE),
            annotated=entry.annotated,
        )

    def describe(self) -> dict[str, object]:
        sources = sorted(
            {f"{s.provenance.source.value} {s.provenance.path}" for s in self.dataset.studies}
        )
        return {
            "source": "dataset",
            "path": str(self.root.resolve()),
            "studies": len(self.series),
            "findings": sum(len(self.dataset.findings_of(uid)) for uid in self.series),
            "inputs": sources,
            "licences": list(self.licences),
        }

    @property
    def licences(self) -> tuple[str, ...]:
        """The licences of the series used (``train`` warns of non-commercial ones)."""
        chosen = set(self.series)
        return tuple(
            sorted(
                {
                    s.provenance.licence
                    for s in self.dataset.studies
                    if s.series_instance_uid in chosen
                }
            )
        )


class MixedSource:
    """Each study drawn from one of several sources with probability proportional to its
    weight: study ``i`` picks its source with ``numpy.random.default_rng([seed, i])`` and is that
    source's next study (so ``study(i)`` is a pure function of ``i``)."""

    def __init__(self, parts: Sequence[tuple[StudySource, float]], seed: int) -> None:
        if not parts:
            raise ConfigurationError("no training source given")
        weights = np.array([w for _, w in parts], dtype=np.float64)
        if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ConfigurationError(f"source weights must be > 0, got {weights.tolist()}")
        self.parts = [source for source, _ in parts]
        self.weights = weights / weights.sum()
        self.seed = seed
        self._choices: list[tuple[int, int]] = []  # per study: (source, its index there)
        self._counts = [0] * len(self.parts)

    def _choice(self, index: int) -> tuple[int, int]:
        while len(self._choices) <= index:
            rng = np.random.default_rng([self.seed, len(self._choices)])
            part = int(rng.choice(len(self.parts), p=self.weights))
            self._choices.append((part, self._counts[part]))
            self._counts[part] += 1
        return self._choices[index]

    def study(self, index: int) -> TrainingStudy:
        part, within = self._choice(index)
        return self.parts[part].study(within)

    def describe(self) -> dict[str, object]:
        return {
            "source": "mixed",
            "parts": [
                {"weight": float(w), **source.describe()}
                for source, w in zip(self.parts, self.weights, strict=True)
            ],
        }


def _hybrid_source(seed: int, held_out: Sequence[str] = ()) -> StudySource:
    """Hybrid studies (``model.measurer.hybrid``) on every usable background of the shared
    data folder (``$RADCALIPER_SHARED_DATA``, else ``../shared/data`` beside the repository)."""
    from model.measurer.hybrid import HybridSource, choose_backgrounds, shared_data_root

    return HybridSource(choose_backgrounds(shared_data_root()), seed, held_out=held_out)


def parse_sources(spec: str, seed: int, *, held_out: Sequence[str] = ()) -> StudySource:
    """``DIR[:weight],...`` (``radcaliper train --dataset``) as a study source: each DIR a
    dataset folder, ``phantoms`` for phantoms generated on the fly from ``seed``, or
    ``hybrid`` for real CT backgrounds with synthetic lesions made on the fly from ``seed``
    (``model.measurer.hybrid``; ``held_out``: background ids it never uses); weights default
    to 1. One part without a weight is that source itself.

    Raises:
        ConfigurationError: an empty part, a weight that is not a positive number, a folder
            that is not a dataset, or (hybrid) no shared data folder or no usable background.
    """
    parts: list[tuple[StudySource, float]] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise ConfigurationError(f"--dataset {spec!r}: an empty entry; give DIR[:weight],...")
        name, weight = item, 1.0
        head, sep, tail = item.rpartition(":")
        if sep and head:
            try:
                weight = float(tail)
            except ValueError:
                pass
            else:
                name = head
                if not (math.isfinite(weight) and weight > 0):
                    raise ConfigurationError(f"--dataset {item!r}: the weight must be > 0")
        source: StudySource
        if name == "phantoms":
            source = PhantomSource(seed)
        elif name == "hybrid":
            source = _hybrid_source(seed, held_out)
        else:
            source = DatasetSource(Path(name))
        parts.append((source, weight))
    if len(parts) == 1:
        return parts[0][0]
    return MixedSource(parts, seed)


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
