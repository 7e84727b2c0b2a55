"""Sources of training studies.

A :class:`StudySource` gives numbered training studies (a volume and its true findings):
:class:`PhantomSource` generates phantoms on the fly (study ``i`` from ``study_seed(seed, i)``,
the seeds ``radcaliper phantoms`` uses), :class:`FolderSource` reads the studies that
``radcaliper phantoms`` wrote (DICOM series plus ``truth.json``), :class:`DatasetSource` the
studies of a dataset folder (``ingestion.dataset``: masks, SEG, SR, reviews, phantoms), and
:class:`MixedSource` draws each study from one of several sources by weight
(``radcaliper train --dataset DIR:3,phantoms:1``); :func:`parse_sources` reads such a spec.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ingestion.dataset.format import Dataset, Label, read_dataset
from ingestion.errors import ConfigurationError, IngestionError
from ingestion.phantoms import PhantomSpec, TruthFinding, generate_phantom, study_seed
from ingestion.volume import Volume
from model.measurer.data.study import StudySource, TrainingStudy
from model.measurer.inputs.data import (
    phantom_volume,
)

__all__ = [
    "DatasetSource",
    "FolderSource",
    "MixedSource",
    "PhantomSource",
    "load_dataset_volume",
    "parse_sources",
    "read_truth",
]

logger = logging.getLogger(__name__)


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
    """Hybrid studies (``model.measurer.data.hybrid``) on every usable background of the shared
    data folder (``$RADCALIPER_SHARED_DATA``, else ``../shared/data`` beside the repository)."""
    from model.measurer.data.hybrid import HybridSource, choose_backgrounds, shared_data_root

    return HybridSource(choose_backgrounds(shared_data_root()), seed, held_out=held_out)


def parse_sources(spec: str, seed: int, *, held_out: Sequence[str] = ()) -> StudySource:
    """``DIR[:weight],...`` (``radcaliper train --dataset``) as a study source: each DIR a
    dataset folder, ``phantoms`` for phantoms generated on the fly from ``seed``, or
    ``hybrid`` for real CT backgrounds with synthetic lesions made on the fly from ``seed``
    (``model.measurer.data.hybrid``; ``held_out``: background ids it never uses); weights default
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
