"""One SeriesInstanceUID holding three stacks (issue 41, second trust round): real archives
write an axial, a coronal and a finer axial reconstruction under one SeriesInstanceUID. Each
stack is its own stored series (keyed by the UID and a digest of its images), with its own
geometry and SOP instances, and the study's SR references the measured stack's own images,
on SQLite and PostgreSQL (it was one series row with the first stack's geometry and images, and
``export-sr`` failed with a highdicom traceback)."""

from __future__ import annotations

from pathlib import Path

import highdicom as hd
import numpy as np
import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from app.cli import app
from app.sr import export_study_sr
from db.engine import Store
from db.models import Run, Series
from ingestion.load import load_path
from ingestion.volume import Volume

from tests.support.db import make_result, store_one
from tests.support.series import SeriesFactory, fixed_uid
from tests.support.sr import check_against_store, dciodvfy, store_study

runner = CliRunner()
SERIES_UID = fixed_uid("one series, three stacks")
STUDY_UID = fixed_uid("the study of three stacks")
# (name, options of write_series): axial; coronal; axial with finer pixels elsewhere
STACKS = (
    ("axial", {"rows": 40, "cols": 44, "pixel_spacing": (0.7, 0.8)}),
    (
        "coronal",
        {
            "rows": 36,
            "cols": 40,
            "pixel_spacing": (0.9, 0.9),
            "row_direction": (1.0, 0.0, 0.0),
            "column_direction": (0.0, 0.0, -1.0),
            "origin": (-15.0, -40.0, 60.0),
        },
    ),
    ("fine", {"rows": 48, "cols": 48, "pixel_spacing": (0.5, 0.5), "origin": (5.0, 0.0, -20.0)}),
)


@pytest.fixture
def stacks(write_series: SeriesFactory, tmp_path: Path) -> list[Volume]:
    """The three stacks as ``load_path`` gives them (in its order)."""
    for seed, (name, options) in enumerate(STACKS):
        write_series(
            tmp_path / "study" / name,
            n=8,
            seed=seed,
            study_uid=STUDY_UID,
            series_uid=SERIES_UID,
            **options,  # type: ignore[arg-type]
        )
    loaded = load_path(tmp_path / "study")
    assert not loaded.rejected and len(loaded.volumes) == 3
    assert {v.identifiers.series_instance_uid for v in loaded.volumes} == {SERIES_UID}
    return loaded.volumes


def _geometry(volume: Volume) -> dict[str, list[float]]:
    g = volume.geometry
    return {
        "origin": list(g.origin),
        "row_direction": list(g.row_direction),
        "column_direction": list(g.column_direction),
        "slice_direction": list(g.slice_direction),
        "spacing": list(g.spacing),
    }


def _evidence(path: Path) -> tuple[set[str], list[str]]:
    """The SR's evidence: the series UIDs it names and its image SOP instances."""
    sr = hd.sr.srread(path)
    (study,) = sr.CurrentRequestedProcedureEvidenceSequence
    series = {str(s.SeriesInstanceUID) for s in study.ReferencedSeriesSequence}
    images = [
        str(i.ReferencedSOPInstanceUID)
        for s in study.ReferencedSeriesSequence
        for i in s.ReferencedSOPSequence
    ]
    return series, images


def test_each_stack_is_its_own_series_and_its_sr_references_its_own_images(
    store: Store, stacks: list[Volume], tmp_path: Path
) -> None:
    for number, volume in enumerate(stacks, start=1):
        assert store_study(store, volume) == STUDY_UID
        with store.reader() as session:
            assert session.scalar(select(func.count()).select_from(Series)) == number
            done = export_study_sr(session, STUDY_UID, tmp_path / f"sr{number}")
        dciodvfy(done.path)
        check_against_store(store, done.path, STUDY_UID)  # coordinates by this stack's geometry
        series, images = _evidence(done.path)
        assert series == {SERIES_UID}  # the DICOM SeriesInstanceUID, not the store's key
        assert images == list(volume.identifiers.sop_instance_uids)
        _, groups = _read_groups(done.path)
        for group in groups:
            (source,) = group.source_images
            assert source.ReferencedSOPSequence[0].ReferencedSOPInstanceUID in images
    with store.reader() as session:
        rows = session.execute(select(Series).order_by(Series.id)).scalars().all()
        runs = session.execute(select(Run).order_by(Run.id)).scalars().all()
        assert [run.series_id for run in runs] == [row.id for row in rows]
        keys = [row.series_instance_uid for row in rows]
        assert len(set(keys)) == 3 and all(len(key) <= 64 for key in keys)
        for row, volume in zip(rows, stacks, strict=True):
            assert row.series_instance_uid == volume.identifiers.series_key != SERIES_UID
            assert row.sop_instance_uids["uids"] == list(volume.identifiers.sop_instance_uids)
            assert row.sop_instance_uids["series_instance_uid"] == SERIES_UID
            assert row.geometry is not None
            for name, value in _geometry(volume).items():
                assert row.geometry[name] == pytest.approx(value), name
            slices, rows_, columns = volume.shape
            assert row.shape == {"slices": slices, "rows": rows_, "columns": columns}
    again = store_one(store, make_result(stacks[1]), stacks[1])  # the same input: stored once
    with store.reader() as session:
        assert session.scalar(select(func.count()).select_from(Series)) == 3
        assert not again.created and again.run_id == runs[1].id
    done_by_cli = runner.invoke(
        app, ["export-sr", STUDY_UID, str(tmp_path / "cli"), "--db", str(store.url)]
    )
    assert done_by_cli.exit_code == 0, done_by_cli.output
    assert "Traceback" not in done_by_cli.output


def test_a_stack_key_is_stable_and_names_its_images(stacks: list[Volume], tmp_path: Path) -> None:
    """The key depends on the stack's images, not on the order the scan found the stacks in:
    loading again (another folder order) gives each stack the same key."""
    keys = {v.identifiers.series_key: list(v.identifiers.sop_instance_uids) for v in stacks}
    assert len(keys) == 3
    moved = tmp_path / "study"
    for name in ("axial", "fine"):  # renamed: the scan meets the stacks in another order
        (moved / name).rename(moved / f"z{name}")
    again = load_path(moved).volumes
    assert [v.identifiers.series_key for v in again] != list(keys)
    assert {v.identifiers.series_key: list(v.identifiers.sop_instance_uids) for v in again} == keys
    (single,) = load_path(moved / "coronal").volumes  # alone, the coronal stack is the series
    assert single.identifiers.series_key == SERIES_UID


def _read_groups(path: Path) -> tuple[object, list[object]]:
    sr = hd.sr.srread(path)
    return sr, list(sr.content.get_image_measurement_groups())


def test_an_unsplit_series_keeps_its_uid_as_its_key(
    store: Store, write_series: SeriesFactory, tmp_path: Path
) -> None:
    """Nothing changes for a series that is one stack: its row is keyed by its UID and holds
    what it held before (no extra field)."""
    write_series(tmp_path / "one", n=8, rows=32, cols=32, seed=7)
    (volume,) = load_path(tmp_path / "one").volumes
    store_study(store, volume)
    with store.reader() as session:
        row = session.execute(select(Series)).scalar_one()
        assert row.series_instance_uid == volume.identifiers.series_instance_uid
        assert set(row.sop_instance_uids) == {"uids", "frames"}


def test_the_review_ui_opens_the_measured_stack(
    store: Store, stacks: list[Volume], tmp_path: Path
) -> None:
    """The study view shows the latest run on its own stack's images (it opened the first stack
    of the UID whichever was measured)."""
    from app.ui.context import UiContext
    from db.queries import study_measurements

    context = UiContext(store, None, None, tmp_path / "uploads")
    for volume in reversed(stacks):
        store_study(store, volume)
        with store.reader() as session:
            shown = study_measurements(session, STUDY_UID)
        assert shown is not None
        opened = context.volume(str(tmp_path / "study"), shown["series_instance_uid"])
        assert opened.identifiers.sop_instance_uids == volume.identifiers.sop_instance_uids
        np.testing.assert_array_equal(opened.voxels, volume.voxels)


def test_a_dataset_row_of_a_stack_loads_that_stack(stacks: list[Volume], tmp_path: Path) -> None:
    """A dataset row imported from the store names a stack by its key and loads that stack; a
    row naming only the UID of a series of several stacks (from a store of before) is refused
    with what to do, not given the first stack."""
    from ingestion.dataset.format import Dataset, DatasetStudy, ImageRef, Provenance, SourceType
    from ingestion.errors import IngestionError
    from model.measurer.data.sources import load_dataset_volume

    provenance = Provenance(SourceType.STORE, "sqlite:///store", "", "reviewers", "site data")
    image = ImageRef(str(tmp_path / "study"), "dicom", "CT")
    keys = [v.identifiers.series_key for v in stacks]
    rows = [DatasetStudy(STUDY_UID, key, image, (), provenance) for key in [*keys, SERIES_UID]]
    dataset = Dataset(tmp_path / "dataset", tuple(rows))
    for key, volume in zip(keys, stacks, strict=True):
        loaded = load_dataset_volume(dataset, key)
        assert loaded.identifiers.sop_instance_uids == volume.identifiers.sop_instance_uids
    with pytest.raises(IngestionError, match="holds 3 stacks and the dataset row does not say"):
        load_dataset_volume(dataset, SERIES_UID)


def test_a_run_stored_under_another_stacks_row_is_refused_with_what_to_do(
    store: Store, stacks: list[Volume], tmp_path: Path
) -> None:
    """A database from before: the second stack's run under the first stack's row (as the
    store kept them). Its SR would reference images its series does not list: export-sr says
    so in one line (exit 2), no traceback, no file."""
    from sqlalchemy import update

    store_study(store, stacks[0])
    store_study(store, stacks[1])
    with store.writer() as session:
        first, second = session.execute(select(Run).order_by(Run.id)).scalars()
        session.execute(update(Run).where(Run.id == second.id).values(series_id=first.series_id))
        session.commit()
    done = runner.invoke(
        app, ["export-sr", STUDY_UID, str(tmp_path / "sr"), "--db", str(store.url)]
    )
    assert done.exit_code == 2, done.output
    assert "which its series row" in done.output and "measure the study again" in done.output
    assert "Traceback" not in done.output and not (tmp_path / "sr").exists()
