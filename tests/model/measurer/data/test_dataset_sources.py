"""Training and evaluation read datasets (model.measurer.data.pool): DatasetSource on an imported
dataset, MixedSource's weighted and deterministic draws, ``--dataset`` specs, and what a study
that is not annotated exhaustively gives the training pool."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from ingestion.dataset.format import Label, read_dataset, write_import
from ingestion.dataset.phantoms import import_phantoms
from ingestion.errors import ConfigurationError, IngestionError
from ingestion.phantoms import write_phantoms
from model.measurer.data.pool import StudyPool
from model.measurer.data.sources import DatasetSource, MixedSource, PhantomSource, parse_sources
from model.measurer.data.study import TrainingStudy
from model.measurer.results import FindingKind

from tests.support.measurer import TINY


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sources")
    write_phantoms(root / "phantoms", n=3, seed=8101)
    write_import(root / "dataset", [import_phantoms(root / "phantoms")])
    return root / "dataset"


def test_dataset_source_loads_each_series_with_its_truth(dataset: Path) -> None:
    source = DatasetSource(dataset)
    rows = read_dataset(dataset)
    assert len(source) == 3 and source.series == rows.series()
    for index, uid in enumerate(source.series):
        study = source.study(index)
        assert study.volume.identifiers.series_instance_uid == uid
        assert {f.id for f in study.findings} == {f.id for f in rows.findings_of(uid)}  # type: ignore[attr-defined]
        assert study.annotated == ("lesion", "vessel") and study.negatives == ()
    assert source.study(3).volume is source.study(0).volume  # cyclic, and cached
    described = source.describe()
    assert described["studies"] == 3 and described["path"] == str(dataset.resolve())
    assert source.licences == ("synthetic (radcaliper phantoms): no restriction",)
    only = DatasetSource(dataset, series=source.series[1:2])
    assert (
        len(only) == 1
        and only.study(0).volume.identifiers.series_instance_uid == (source.series[1])
    )


def test_a_missing_image_is_named(dataset: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(dataset.parent / "phantoms", copy / "phantoms")
    write_import(copy / "dataset", [import_phantoms(copy / "phantoms")])
    source = DatasetSource(copy / "dataset")
    image = Path(source.dataset.study(source.series[0]).image.path)
    shutil.rmtree(image)
    with pytest.raises(IngestionError, match=f"{image}: the image of series .* is missing"):
        source.study(0)


def test_a_study_annotated_for_one_kind_gives_find_planes_of_that_kind_and_no_background(
    dataset: Path,
) -> None:
    """Find planes ask only for the kinds a study annotates exhaustively; background clicks
    ("nothing here" of both kinds) need both; a study annotating neither gives no planes."""
    study = DatasetSource(dataset).study(0)
    lesion = next(f for f in study.findings if f.kind == "lesion")
    vessel_only = TrainingStudy(
        study.volume,
        tuple(f for f in study.findings if f.kind == "vessel"),
        "partial",
        negatives=(dataclasses.replace(lesion, label=Label.NEGATIVE),),  # type: ignore[type-var]
        annotated=("vessel",),
    )

    class One:
        def __init__(self, study: TrainingStudy) -> None:
            self.value = study

        def study(self, index: int) -> TrainingStudy:
            return self.value

        def describe(self) -> dict[str, object]:
            return {}

    def pool(study: TrainingStudy) -> StudyPool:
        made = StudyPool(
            One(study),
            TINY.measure_inputs,
            TINY.find_inputs,
            size=1,
            initial=1,
            studies_per_step=0.0,
            planes_per_study=2,
            background_per_study=2,
            seed=3,
        )
        made.advance(0)
        return made

    complete = pool(study)
    assert len(complete.planes) == 2 and len(complete.background) == 2
    partial = pool(vessel_only)
    assert len(partial.planes) == 2 and all(p.kinds == {FindingKind.VESSEL} for p in partial.planes)
    asked = partial.find_examples(4, np.random.default_rng(0))
    assert {e.prompt for e in asked} == {"find vessels in the image"}
    assert all("lesion" not in (e.answer or "") for e in asked)  # the lesion is not claimed
    # the one background patch is the reviewer's negative example, centred where it was
    assert [p.center_lps_mm for p in partial.background] == [lesion.center_lps_mm]
    assert len(partial.patches) == 1  # the vessel still trains the measure task
    unannotated = pool(dataclasses.replace(vessel_only, annotated=()))
    assert unannotated.planes == [] and unannotated.find_examples(4, np.random.default_rng(0)) == []


class Recording:
    """A source that says which of its studies was asked for (the test is about mixing)."""

    def __init__(self, name: str, volume: object) -> None:
        self.name = name
        self.volume = volume

    def study(self, index: int) -> TrainingStudy:
        return TrainingStudy(self.volume, (), f"{self.name} {index}")  # type: ignore[arg-type]

    def describe(self) -> dict[str, object]:
        return {"source": self.name}


def test_mixed_source_draws_by_weight_deterministically() -> None:
    parts = [(Recording("a", None), 3.0), (Recording("b", None), 1.0)]
    mixed = MixedSource(parts, seed=5)
    names = [mixed.study(i).name for i in range(400)]
    again = MixedSource(parts, seed=5)
    assert [again.study(i).name for i in reversed(range(400))] == names[::-1]  # any order
    share = sum(n.startswith("a") for n in names) / len(names)
    assert 0.70 < share < 0.80  # weight 3:1
    # each source's own studies come in order, none skipped or repeated
    for prefix in ("a", "b"):
        indices = [int(n.split()[1]) for n in names if n.startswith(prefix)]
        assert indices == list(range(len(indices)))
    other = MixedSource(parts, seed=6)
    assert [other.study(i).name for i in range(40)] != names[:40]  # the seed matters
    assert mixed.describe()["parts"] == [
        {"weight": 0.75, "source": "a"},
        {"weight": 0.25, "source": "b"},
    ]
    with pytest.raises(ConfigurationError, match="weights must be > 0"):
        MixedSource([(Recording("a", None), 0.0)], seed=1)


def test_dataset_specs(dataset: Path) -> None:
    assert parse_sources("phantoms", 4) == PhantomSource(4)
    single = parse_sources(str(dataset), 4)
    assert isinstance(single, DatasetSource) and len(single) == 3
    mixed = parse_sources(f"{dataset}:3, phantoms:1", 4)
    assert isinstance(mixed, MixedSource)
    assert mixed.weights.tolist() == [0.75, 0.25]
    assert isinstance(mixed.parts[0], DatasetSource) and mixed.parts[1] == PhantomSource(4)
    for bad, message in (
        (f"{dataset},", "an empty entry"),
        (f"{dataset}:0", "the weight must be > 0"),
        (f"{dataset}:-2", "the weight must be > 0"),
        (f"{dataset.parent / 'nothing'}", "is not a radcaliper dataset"),
    ):
        with pytest.raises(ConfigurationError, match=message):
            parse_sources(bad, 4)


def test_the_series_is_found_in_a_folder_of_several(dataset: Path) -> None:
    """An image reference to a folder holding several series (a study folder, as a store's run
    records it) loads the row's series, each of them."""
    from ingestion.dataset.format import Dataset
    from model.measurer.data.sources import load_dataset_volume

    data = read_dataset(dataset)
    parent = Path(data.studies[0].image.path).parents[1]  # the phantoms folder: 3 series
    studies = tuple(
        dataclasses.replace(s, image=dataclasses.replace(s.image, path=str(parent)))
        for s in data.studies
    )
    moved = Dataset(dataset, studies, data.findings)
    for uid in moved.series():
        volume = load_dataset_volume(moved, uid)
        assert volume.identifiers.series_instance_uid == uid
