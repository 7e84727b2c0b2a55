"""Hybrid training data: real CT backgrounds with synthetic lesions inserted (issue 23).

A :class:`HybridSource` is a ``StudySource``: study ``i`` is a pure function of
``(seed, i)``. It draws one of its backgrounds (``model.measurer.data._backgrounds``: the project's
real CT volumes whose licence allows training a shipped model), augments it
(``model.measurer.data._augment``: flips, in-plane rotation, pixel spacing, field of view, slice
thickness, intensity), inserts 1-4 lesions (``model.measurer.data._insert``: by tissue, with
partial volume and the image's own noise and blur) and measures the truth from the final label
map with ``ingestion.dataset.masks.findings_from_labels``, the definition every imported
dataset has: the inserted lesions and the background's own findings (its lesions, its vessels
from masks), never numbers carried over from parameters.

Whole backgrounds are held out for validation (leave-one-background-out):
``HybridSource(..., held_out=("sts_002_sarcoma",))`` never uses that background;
``.validation()`` gives studies from the held-out backgrounds only.

:func:`write_hybrid_dataset` writes studies as a dataset folder (NIfTI images and label maps
beside the manifest) that ``radcaliper evaluate --dataset`` and ``train --dataset`` read.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ingestion.dataset.format import (
    Dataset,
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    ImportProgress,
    ImportResult,
    KindName,
    Provenance,
    Skipped,
    SourceType,
    write_import,
)
from ingestion.errors import ConfigurationError, RadcaliperError
from ingestion.volume import Identifiers, Modality, SourceFormat, Volume
from model.measurer.data._augment import (
    Augmentation,
    draw_augmentation,
    resample_in_plane,
    scale_intensity,
    thicken_slices,
)
from model.measurer.data._backgrounds import (
    Background,
    BackgroundRef,
    BackgroundSurvey,
    licence_allows_training,
    survey_backgrounds,
)
from model.measurer.data._insert import Inserted, insert_lesions, tissue_maps

if TYPE_CHECKING:
    from model.measurer.data.study import TrainingStudy

__all__ = [
    "SHARED_DATA_ENV",
    "Background",
    "BackgroundRef",
    "BackgroundSurvey",
    "HybridSource",
    "HybridStudy",
    "available_backgrounds",
    "choose_backgrounds",
    "licence_allows_training",
    "shared_data_root",
    "survey_backgrounds",
    "write_hybrid_dataset",
]

logger = logging.getLogger(__name__)

SHARED_DATA_ENV = "RADCALIPER_SHARED_DATA"
INSERTED_LABEL = 1000
"""Label value of the first inserted lesion (the backgrounds' labels are below)."""
GENERATOR = "radcaliper hybrid generator (synthetic lesion)"


def shared_data_root(path: Path | None = None) -> Path:
    """The shared data folder: ``path``, else ``$RADCALIPER_SHARED_DATA``, else
    ``../shared/data`` beside the repository.

    Raises:
        ConfigurationError: the folder does not exist.
    """
    if path is None:
        env = os.environ.get(SHARED_DATA_ENV)
        path = Path(env) if env else Path(__file__).resolve().parents[4] / "shared" / "data"
    if not Path(path).is_dir():
        raise ConfigurationError(
            f"{path}: no shared data folder (real CT backgrounds for hybrid data); give it with "
            f"--shared DIR or {SHARED_DATA_ENV}=DIR"
        )
    return Path(path)


def available_backgrounds(shared_root: Path) -> list[BackgroundRef]:
    """The backgrounds under ``shared_root`` that hybrid data may use (``survey_backgrounds``
    gives the others with reasons)."""
    survey = survey_backgrounds(shared_root)
    for case, reason in survey.excluded:
        logger.debug("background %s left out: %s", case, reason)
    return list(survey.usable)


def choose_backgrounds(shared_root: Path, ids: Sequence[str] | None = None) -> list[BackgroundRef]:
    """The usable backgrounds named by ``ids`` (all where None).

    Raises:
        ConfigurationError: an id that is not a usable background (its reason where it was
            left out), or no usable background at all.
    """
    survey = survey_backgrounds(shared_root)
    usable = {ref.id: ref for ref in survey.usable}
    if ids is None:
        if not usable:
            raise ConfigurationError(f"{shared_root}: no usable background")
        return list(survey.usable)
    excluded = dict(survey.excluded)
    chosen = []
    for name in ids:
        if name in usable:
            chosen.append(usable[name])
        elif name in excluded:
            raise ConfigurationError(f"background {name} cannot be used: {excluded[name]}")
        else:
            raise ConfigurationError(
                f"no background {name!r}; usable: {', '.join(sorted(usable)) or 'none'}"
            )
    return chosen


def _uid(*parts: object) -> str:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return "2.25." + str(int.from_bytes(digest[:16], "big"))


@dataclass(frozen=True, eq=False)
class HybridStudy:
    """One hybrid study: its volume, its label map (background labels and inserted lesions
    from ``INSERTED_LABEL`` on) and how it was made."""

    index: int
    volume: Volume
    labels: npt.NDArray[np.int16]
    background: BackgroundRef
    augmentation: Augmentation
    lesions: tuple[Inserted, ...]
    provenance_path: str

    @property
    def roles(self) -> dict[int, tuple[str, KindName]]:
        """Every label that is a finding: value -> (name, kind)."""
        roles: dict[int, tuple[str, KindName]] = {}
        for value, name, role in self.background.label_map:
            if role in ("lesion", "vessel"):
                roles[value] = (name, "lesion" if role == "lesion" else "vessel")
        for lesion in self.lesions:
            roles[lesion.value] = (lesion.describe(), "lesion")
        return roles

    def findings(
        self,
        volume: Volume | None = None,
        image: ImageRef | None = None,
        file: str = "",
    ) -> tuple[list[DatasetFinding], list[Skipped], tuple[KindName, ...]]:
        """The truth, measured from the label map on ``volume``'s grid (default: the study's
        own volume): (rows, what was left out, the kinds annotated exhaustively). A kind whose
        background finding could not be measured (e.g. a vessel cut by the field) is not
        claimed as exhaustive."""
        from ingestion.dataset.masks import findings_from_labels

        volume = volume or self.volume
        image = image or ImageRef(self.provenance_path, "nifti", "CT")
        ids = volume.identifiers
        ref = self.background
        roles = self.roles
        rows: list[DatasetFinding] = []
        skipped: list[Skipped] = []
        for annotator, part in (
            (
                f"{GENERATOR} in background {ref.id}",
                {v: roles[v] for v in roles if v >= INSERTED_LABEL},
            ),
            (
                f"background {ref.id}: {ref.annotation}",
                {v: roles[v] for v in roles if v < INSERTED_LABEL},
            ),
        ):
            found, left_out = findings_from_labels(
                self.labels,
                volume.geometry,
                part,
                study_instance_uid=ids.study_instance_uid,
                series_instance_uid=ids.series_instance_uid,
                image=image,
                provenance=Provenance(
                    SourceType.MASKS, self.provenance_path, "", annotator, ref.licence
                ),
                file=file or self.provenance_path,
            )
            rows += found
            skipped += left_out
        kinds: set[KindName] = set()
        if ref.lesions_exhaustive:
            kinds.add("lesion")
        if ref.vessels_annotated:
            kinds.add("vessel")
        for item in skipped:  # item: "label VALUE (NAME), component K"
            logger.info("study %d: left out of the truth: %s", self.index, item.line())
            words = item.item.split()
            value = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
            if value in roles:
                kinds.discard(roles[value][1])
        return rows, skipped, tuple(sorted(kinds))

    def training_study(self) -> TrainingStudy:
        """The study as training and evaluation read it (``study.TrainingStudy``)."""
        from model.measurer.data.study import TrainingStudy

        rows, _, annotated = self.findings()
        name = (
            f"hybrid {self.index} ({self.background.id}, {len(self.lesions)} synthetic "
            f"lesion{'s' if len(self.lesions) != 1 else ''})"
        )
        return TrainingStudy(self.volume, tuple(rows), name, annotated=annotated)


class HybridSource:
    """Hybrid studies from real backgrounds (module doc).

    Args:
        backgrounds: the backgrounds (references, loaded lazily; or loaded ones, e.g. crops).
        seed: study ``i`` is made with ``numpy.random.default_rng([seed, stream, i])``.
        held_out: ids of backgrounds never used here (:meth:`validation` uses only them).
        lesions_per_study: (fewest, most) lesions inserted, both included.
        augment: draw augmentations (else each background is used as it is).
        weights: background id -> how often it is drawn relative to the others (default 1;
            e.g. more of the one abdominal background with organ labels).
        cache: loaded backgrounds kept in memory.
        stream: which random stream (``validation`` uses the next).

    Raises:
        ConfigurationError: an unknown held-out id, no background left to use, or an
            impossible ``lesions_per_study``.
    """

    def __init__(
        self,
        backgrounds: Sequence[BackgroundRef | Background],
        seed: int,
        held_out: Collection[str] = (),
        lesions_per_study: tuple[int, int] = (1, 4),
        *,
        augment: bool = True,
        weights: Mapping[str, float] | None = None,
        cache: int = 8,
        stream: int = 0,
    ) -> None:
        if isinstance(held_out, str):
            held_out = (held_out,)
        refs = [b.ref if isinstance(b, Background) else b for b in backgrounds]
        ids = [r.id for r in refs]
        if len(set(ids)) != len(ids):
            raise ConfigurationError(f"a background is given twice: {sorted(ids)}")
        unknown = sorted(set(held_out) - set(ids))
        if unknown:
            raise ConfigurationError(
                f"held-out background(s) {', '.join(unknown)} not among {', '.join(sorted(ids))}"
            )
        low, high = lesions_per_study
        if not 0 <= low <= high:
            raise ConfigurationError(f"lesions_per_study must be 0 <= low <= high, got {low, high}")
        self.all = refs
        self.held_out = tuple(sorted(held_out))
        self.training = [r for r in refs if r.id not in self.held_out]
        if not self.training:
            raise ConfigurationError("every background is held out: none is left to use")
        weights = dict(weights or {})
        unknown = sorted(set(weights) - set(ids))
        if unknown:
            raise ConfigurationError(f"weights for unknown background(s) {', '.join(unknown)}")
        drawn = np.array([weights.get(r.id, 1.0) for r in self.training], dtype=np.float64)
        if not np.all(np.isfinite(drawn)) or np.any(drawn < 0) or drawn.sum() <= 0:
            raise ConfigurationError(f"background weights must be >= 0, some > 0: {weights}")
        self.weights = weights
        self._p = drawn / drawn.sum()
        self.seed = seed
        self.lesions_per_study = (low, high)
        self.augment = augment
        self.stream = stream
        self.cache = max(1, cache)
        self._loaded: OrderedDict[str, Background] = OrderedDict()
        self._given = {b.ref.id: b for b in backgrounds if isinstance(b, Background)}

    def background(self, ref: BackgroundRef) -> Background:
        """``ref`` loaded, through this source's cache (loaded once however often asked)."""
        if ref.id in self._given:
            return self._given[ref.id]
        if ref.id in self._loaded:
            self._loaded.move_to_end(ref.id)
            return self._loaded[ref.id]
        background = ref.load()
        self._loaded[ref.id] = background
        while len(self._loaded) > self.cache:
            self._loaded.popitem(last=False)
        return background

    def validation(self) -> HybridSource:
        """Studies from the held-out backgrounds only (their own random stream).

        Raises:
            ConfigurationError: nothing is held out.
        """
        if not self.held_out:
            raise ConfigurationError("no background is held out: give held_out=(ID, ...)")
        chosen = [self._given.get(r.id, r) for r in self.all if r.id in self.held_out]
        return HybridSource(
            chosen,
            self.seed,
            lesions_per_study=self.lesions_per_study,
            augment=self.augment,
            weights={k: v for k, v in self.weights.items() if k in self.held_out},
            cache=self.cache,
            stream=self.stream + 1,
        )

    def make(self, index: int) -> HybridStudy:
        """Study ``index`` with its label map (module doc).

        Raises:
            IngestionError: its background cannot be loaded.
        """
        rng = np.random.default_rng([self.seed, self.stream, index])
        ref = self.training[int(rng.choice(len(self.training), p=self._p))]
        background = self.background(ref)
        image = background.volume.voxels
        labels = background.labels
        geometry = background.volume.geometry
        findings = set(background.roles)
        augmentation = (
            draw_augmentation(rng, geometry, background.volume.shape)
            if self.augment
            else Augmentation()
        )
        a = augmentation
        if a.flip_lr or a.flip_ap or a.rotation_deg or a.pixel_mm or a.fov_mm:
            image, labels, geometry = resample_in_plane(
                image, labels, geometry, a, findings, keep_inside=np.isin(labels, list(findings))
            )
        if a.slice_mm is not None:
            image, labels, geometry = thicken_slices(image, labels, geometry, a.slice_mm, findings)
        if a.intensity_scale != 1.0 or a.intensity_shift_hu != 0.0:
            image = scale_intensity(image, a.intensity_scale, a.intensity_shift_hu)
        maps = tissue_maps(image, labels, geometry, background.names)
        count = int(rng.integers(self.lesions_per_study[0], self.lesions_per_study[1] + 1))
        image, labels, lesions = insert_lesions(
            image, labels, geometry, maps, count, rng, INSERTED_LABEL
        )
        voxels = np.clip(np.rint(image), -32768, 32767).astype(np.float32)
        n = voxels.shape[0]
        identity = (self.seed, self.stream, index, ref.id)
        volume = Volume(
            voxels=voxels,
            geometry=geometry,
            identifiers=Identifiers(
                study_instance_uid=_uid("study", *identity),
                series_instance_uid=_uid("series", *identity),
                sop_instance_uids=(None,) * n,
                frame_numbers=(None,) * n,
                series_description=f"hybrid: {ref.id} + {len(lesions)} synthetic lesions",
                uids_derived=True,
            ),
            modality=Modality.CT,
            source_format=SourceFormat.SYNTHETIC,
            sources=(ref.image,),
        )
        path = (
            f"{ref.image} + synthetic lesions (hybrid seed {self.seed}"
            f"{f', stream {self.stream}' if self.stream else ''}, study {index})"
        )
        return HybridStudy(index, volume, labels, ref, augmentation, tuple(lesions), path)

    def study(self, index: int) -> TrainingStudy:
        return self.make(index).training_study()

    @property
    def licences(self) -> tuple[str, ...]:
        return tuple(sorted({r.licence for r in self.training}))

    def describe(self) -> dict[str, object]:
        return {
            "source": "hybrid",
            "seed": self.seed,
            "stream": self.stream,
            "backgrounds": [
                {**r.describe(), "weight": float(p)}
                for r, p in zip(self.training, self._p, strict=True)
            ],
            "held_out": list(self.held_out),
            "lesions_per_study": list(self.lesions_per_study),
            "lesions": "synthetic, inserted by radcaliper (no third-party data)",
            "augment": self.augment,
            "licences": list(self.licences),
        }


def _write_nifti(path: Path, array: npt.NDArray[np.int16], volume: Volume, text: str) -> None:
    import nibabel as nib

    from ingestion.nifti import volume_to_nifti_affine

    affine = volume_to_nifti_affine(volume.geometry)
    img = nib.Nifti1Image(np.asarray(array, dtype=np.int16).transpose(2, 1, 0), affine)
    img.header.set_data_dtype(np.int16)
    img.header.set_xyzt_units(xyz="mm")
    img.header["descrip"] = text[:79].encode()
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, str(path))


def write_hybrid_dataset(
    out: Path,
    source: HybridSource,
    n: int,
    *,
    on_item: ImportProgress | None = None,
) -> tuple[Dataset, list[Skipped]]:
    """Write studies ``0 .. n-1`` of ``source`` into the dataset folder ``out``:
    ``images/hybrid_<seed>_<stream>_<i>.nii.gz`` (int16 HU, the volume's LPS geometry as a RAS
    affine), ``labels/...`` (its label map) and one row per true finding (``findings`` of the
    written image as it reads back, so the rows' UIDs are the ones loading derives). Each
    study is one input (``ImportResult``): writing the same study again replaces its rows.
    A study that cannot be made is a line of the import report.

    Returns:
        The dataset and the lines of its report from this call.
    """
    from ingestion.nifti import load_nifti

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"{out} is a file; give a folder for the dataset")
    results: list[ImportResult] = []
    report: list[Skipped] = []
    for index in range(n):
        name = f"hybrid_{source.seed}_{source.stream}_{index:05d}.nii.gz"
        if on_item is not None:
            on_item(index, n, name)
        try:
            study = source.make(index)
        except RadcaliperError as error:
            line = Skipped(SourceType.MASKS, f"hybrid study {index}", name, "", str(error))
            report.append(line)
            results.append(ImportResult(SourceType.MASKS, line.path, skipped=(line,)))
            continue
        image_path = out / "images" / name
        labels_path = out / "labels" / name
        text = f"radcaliper hybrid: {study.background.id} + synthetic lesions"
        voxels = np.asarray(study.volume.voxels, dtype=np.int16)
        _write_nifti(image_path, voxels, study.volume, text)
        _write_nifti(labels_path, study.labels, study.volume, text)
        written = load_nifti(image_path, Modality.CT)
        ref = ImageRef(f"images/{name}", "nifti", "CT")
        rows, skipped, annotated = study.findings(written, ref, str(labels_path))
        ids = written.identifiers
        provenance = Provenance(
            SourceType.MASKS,
            study.provenance_path,
            "",
            f"{GENERATOR}; background {study.background.id}: {study.background.annotation}",
            study.background.licence,
        )
        entry = DatasetStudy(
            ids.study_instance_uid, ids.series_instance_uid, ref, annotated, provenance
        )
        report += skipped
        results.append(
            ImportResult(
                SourceType.MASKS, study.provenance_path, (entry,), tuple(rows), tuple(skipped)
            )
        )
    if on_item is not None:
        on_item(n, n, "")
    return write_import(out, results), report
