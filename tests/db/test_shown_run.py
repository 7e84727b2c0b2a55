"""The run a study is shown, listed and exported by: its latest run of the whole study; a run
of clicked points (``measure --at``) stands for the study only when there is nothing else."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from app.measuring import clicks_identity
from app.sr import export_study_sr
from db.engine import Store
from db.queries import WorklistFilter, study_measurements, worklist_rows
from db.store import RunIdentity, input_fingerprint, store_result
from ingestion.volume import Volume
from model.measurer.results import StudyResult

from tests.support.db import make_result, store_one


class _Model:
    checkpoint_hash = "c" * 64


def _store_clicks(store: Store, result: StudyResult, volume: Volume) -> None:
    identity: RunIdentity = clicks_identity(_Model(), input_fingerprint(volume), [(1.0, 2.0, 3.0)])
    with store.writer() as session:
        store_result(
            session, result, volume, identity, actor="cli:test", started_at=datetime.now(UTC)
        )
        session.commit()


def test_a_click_run_does_not_hide_the_whole_study(
    store: Store, volume: Volume, tmp_path: Path
) -> None:
    whole = make_result(volume, version="1.0.0")
    store_one(store, whole, volume)
    clicked = make_result(volume, version="2.0.0-clicks", values=(9.0, 4.0, 7.0))
    _store_clicks(store, clicked, volume)
    uid = whole.study_instance_uid
    with store.reader() as session:
        shown = study_measurements(session, uid)
        (row,) = worklist_rows(session, WorklistFilter())
        done = export_study_sr(session, uid, tmp_path)
    assert shown is not None and shown["model"].endswith("1.0.0")
    assert row["model"].endswith("1.0.0")
    assert "1.0.0" in done.path.read_bytes().decode("latin-1")


def test_a_study_only_clicked_is_shown_by_its_clicks(store: Store, volume: Volume) -> None:
    clicked = make_result(volume, version="2.0.0-clicks", values=(9.0, 4.0, 7.0))
    _store_clicks(store, clicked, volume)
    with store.reader() as session:
        shown = study_measurements(session, clicked.study_instance_uid)
        (row,) = worklist_rows(session, WorklistFilter())
    assert shown is not None and shown["model"].endswith("2.0.0-clicks")
    assert row["model"].endswith("2.0.0-clicks")
