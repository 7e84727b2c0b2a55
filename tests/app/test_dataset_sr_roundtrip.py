"""radcaliper's own ``export-sr`` output imported as a dataset (``ingestion.dataset.sr``): a
phantom DICOM study measured (a result as the measurer returns it, with axes, ``tests/app/
test_sr.py``'s helper) and stored in a real SQLite store, exported before and after review, and
imported against the study's DICOM files: the rows carry the store's current values (the
reviewer's where corrected), and a rejected measurement is absent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from app.sr import export_study_sr
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import Finding, Measurement, ReviewAction, Role
from db.review import CorrectionLimits, review_measurement
from db.users import add_user
from ingestion.dataset.sr import import_sr
from ingestion.load import load_path
from ingestion.phantoms import write_phantoms
from ingestion.volume import Volume

from tests.support.sr import AXES, sr_values, store_study

LIMITS = CorrectionLimits()  # the default limits (the command line: the settings')
CORRECTED = 9.25  # the reviewer's short axis: shorter than the long axis, else no lesion


@pytest.fixture
def study(tmp_path: Path) -> tuple[Path, Volume]:
    (folder,) = write_phantoms(tmp_path / "phantoms", n=1, seed=2207)
    (volume,) = load_path(folder / "dicom").volumes
    return folder / "dicom", volume


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    yield store
    store.dispose()


def _axes_lps(volume: Volume, slice_index: int, k: int) -> np.ndarray:
    """The k-th stored axis of a finding on ``slice_index`` (test_sr.AXES: (row, column))."""
    return np.array([volume.geometry.index_to_lps([slice_index, r, c]) for r, c in AXES[k]])


def test_an_exported_study_imports_with_its_current_values(
    sqlite_store: Store, study: tuple[Path, Volume], tmp_path: Path
) -> None:
    dicom, volume = study
    study_uid = store_study(sqlite_store, volume)
    assert sr_values(volume)[0] > CORRECTED
    with sqlite_store.reader() as session:
        pending = export_study_sr(session, study_uid, tmp_path / "pending")
        slices = {f.kind: f.slice_index for f in session.execute(select(Finding)).scalars()}
    before = import_sr(pending.path, images=dicom, limits=LIMITS)
    assert not before.skipped
    lesion, vessel = sorted(before.findings, key=lambda f: f.kind)
    assert (lesion.long_axis_mm, lesion.short_axis_mm, vessel.diameter_mm) == sr_values(volume)
    assert lesion.slice_index == slices["lesion"] and vessel.slice_index == slices["vessel"]
    for got, k, on in (
        (lesion.long_axis_lps_mm, 0, "lesion"),
        (lesion.short_axis_lps_mm, 1, "lesion"),
        (vessel.diameter_lps_mm, 0, "vessel"),
    ):
        np.testing.assert_allclose(got, _axes_lps(volume, slices[on], k), atol=1e-3)
    np.testing.assert_allclose(
        lesion.center_lps_mm, _axes_lps(volume, slices["lesion"], 0).mean(axis=0), atol=1e-3
    )
    assert lesion.provenance.annotator.startswith("radcaliper-test")
    assert lesion.provenance.annotator.endswith("1.0.0 (model)")
    (row,) = before.studies
    assert row.series_instance_uid == volume.identifiers.series_instance_uid
    assert row.image.path == str(dicom.resolve()) and row.annotated == ()

    with sqlite_store.writer() as session:
        alice = add_user(session, "alice", Role.REVIEWER, password="correct horse", actor="t")
        bob = add_user(session, "bob", Role.REVIEWER, password="correct horse", actor="t")
        long_axis, short_axis, diameter = session.execute(
            select(Measurement).order_by(Measurement.id)
        ).scalars()
        for m, who, action, value in (
            (long_axis, alice, ReviewAction.ACCEPT, None),
            (short_axis, bob, ReviewAction.CORRECT, CORRECTED),
            (diameter, alice, ReviewAction.REJECT, None),
        ):
            review_measurement(
                session,
                m.id,
                action=action,
                reviewer=who,
                seen_version=1,
                value_mm=value,
                reason="reviewed",
            )
        session.commit()
    with sqlite_store.reader() as session:
        reviewed = export_study_sr(session, study_uid, tmp_path / "reviewed")
    assert reviewed.verified
    after = import_sr(reviewed.path, images=dicom, limits=LIMITS)
    assert not after.skipped
    (lesion_after,) = after.findings  # the vessel's only measurement was rejected: absent
    assert lesion_after.kind == "lesion"
    assert (lesion_after.long_axis_mm, lesion_after.short_axis_mm) == (
        sr_values(volume)[0],
        CORRECTED,
    )
    assert lesion_after.short_axis_lps_mm is None  # a corrected value carries no axis
    np.testing.assert_allclose(lesion_after.long_axis_lps_mm, lesion.long_axis_lps_mm, atol=1e-9)
    assert lesion_after.center_lps_mm == lesion.center_lps_mm
    assert lesion_after.provenance.annotator.endswith("(model), corrected by alice, bob")
    again = import_sr(reviewed.path, images=dicom, limits=LIMITS)
    assert [f.to_json() for f in again.findings] == [f.to_json() for f in after.findings]
