"""``radcaliper batch`` (issue 9): a PACS-export-like tree of phantom studies with a DICOMDIR copy,
a duplicate, SR / SEG / RTSTRUCT, scouts, reformats and 20 corrupt files is stored exactly once
per study with a report of every rejected file and skipped series (exit 1); a re-run stores
nothing and reads no header again; a batch killed with SIGKILL half way and resumed ends with the
same rows as an uninterrupted one. With the bundled demo model, on SQLite and PostgreSQL.

The 8-study scenario (the fewest the tree takes) runs in CI; the issue's 200-study scenario is
the same code, marked slow.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner, Result

from app.batch import BatchOptions, run_batch
from app.batch.pool import measuring_processes, process_memory_bytes
from app.batch.report import report_paths
from app.cli import app
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import AuditEvent, Run
from ingestion.phantoms import write_phantoms
from ingestion.selection import SelectionRules

from tests.support.batch import SMALL, Tree, build_tree, by_position, rewrite_series, stored_rows
from tests.support.series import SeriesFactory
from tests.support.sr import check_against_store, dciodvfy

runner = CliRunner()
REPOSITORY = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    return build_tree(tmp_path_factory.mktemp("pacs"), n=8)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """For the tests where the backend does not matter (the scenarios run on both)."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    upgrade(url)
    opened = open_store(url)
    yield opened
    opened.dispose()


@pytest.fixture(scope="module")
def measurer() -> Any:
    """The demo model (run_batch gives it the CPUs the loaders leave)."""
    from model.measurer.checkpoint.settings import default_checkpoint
    from model.measurer.infer.pipeline import CheckpointMeasurer

    return CheckpointMeasurer.load(default_checkpoint())


def _batch(root: Path, store: Store, work: Path, *options: str, verbose: bool = False) -> Result:
    args = ["batch", str(root), "--db", str(store.url), "--work", str(work), *options]
    return runner.invoke(app, ["-v", *args] if verbose else args)


def _runs(store: Store) -> int:
    with store.reader() as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def _events(store: Store) -> int:
    with store.reader() as session:
        return int(session.scalar(select(func.count()).select_from(AuditEvent)) or 0)


def _check_report(tree: Tree, report: dict[str, Any], rows: list[dict[str, str]]) -> None:
    summary = report["summary"]
    n = len(tree.study_uids)
    assert summary["studies"] == {"total": n, "stored": n, "already_stored": 0, "failed": 0}
    assert summary["files"]["rejected"] == len(tree.corrupt) == 20
    assert summary["exit_code"] == 1
    rejected = {r["path"]: r for r in report["rejected"] if r["path"] is not None}
    for path, words in tree.corrupt.items():  # every corrupt file, with its reason
        entry = rejected.pop(str(path))
        assert words in entry["reason"] and str(path) in entry["reason"], entry
        assert entry["error"]
    assert rejected == {}  # and nothing else
    skipped = {r["path"]: r for r in report["skipped"] if r["path"] is not None}
    for path, words in tree.skipped.items():  # DICOMDIR, SR, SEG, RTSTRUCT, scouts, ...
        assert words in skipped[str(path)]["reason"], skipped[str(path)]
    duplicates = [p for p in tree.duplicates if str(p) in skipped]
    assert len(duplicates) == len(tree.duplicates) // 2  # one copy of each pair is used
    assert all("duplicate of" in skipped[str(p)]["reason"] for p in duplicates)
    series = {r["series_instance_uid"]: r["reason"] for r in report["skipped"] if not r["path"]}
    for uid, words in tree.series_left_out.items():
        assert words in series[uid], series[uid]
    studies = {s["study_instance_uid"]: s for s in report["studies"]}
    assert set(studies) == set(tree.study_uids)
    for uid, study in studies.items():
        assert study["outcome"] == "stored" and study["findings"] is not None
        assert study["series_instance_uids"] == [tree.chosen[uid]]  # the thinnest axial series
    by_record = [r["record"] for r in rows]
    assert by_record.count("study") == n
    assert len(rows) == n + len(report["rejected"]) + len(report["skipped"])
    assert {r["path"] for r in rows if r["outcome"] == "rejected"} >= {str(p) for p in tree.corrupt}


def _check_srs(tree: Tree, report: dict[str, Any], sr_dir: Path, store: Store) -> None:
    """One SR per study with findings; every one passes dciodvfy and reads back (highdicom) to
    the values stored for its study."""
    written = sorted(sr_dir.glob("*.sr.dcm"))
    with_findings = [s for s in report["studies"] if s["findings"]]
    assert len(written) == len(with_findings) >= len(tree.study_uids) // 2
    for study in report["studies"]:
        if study["findings"]:
            assert study["sr"] == str(sr_dir / f"{study['study_instance_uid']}.sr.dcm")
        else:
            assert study["sr"].startswith("none: ")  # TID 1500 needs a measurement group
    for path in written:
        dciodvfy(path)
        check_against_store(store, path, path.name.removesuffix(".sr.dcm"), axes=None)


def _kill_half_way(tree: Tree, store: Store, work: Path, log: Path) -> int:
    """Start a batch in another process, SIGKILL it once half the studies are stored; return
    how many were stored then. Its loader processes must go with it."""
    half = len(tree.study_uids) // 2
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "app.cli", "batch", str(tree.root)),
                *("--db", str(store.url), "--work", str(work), "--workers", "1"),
            ],
            cwd=REPOSITORY,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the workers can be found
        )
        try:
            deadline = time.monotonic() + 900
            while _runs(store) < half:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the batch did not get half way"
                time.sleep(0.05)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            stored = _runs(store)
            deadline = time.monotonic() + 15
            while True:  # the loader processes see their parent gone and exit
                try:
                    os.killpg(process.pid, 0)
                except ProcessLookupError:
                    break
                if time.monotonic() > deadline:
                    os.killpg(process.pid, signal.SIGKILL)
                    pytest.fail("loader processes outlived the killed batch")
                time.sleep(0.1)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == -signal.SIGKILL
    assert half <= stored < len(tree.study_uids), "killed too late to test anything"
    return stored


def _scenario(tree: Tree, store_factory: Callable[[], Store], tmp_path: Path) -> None:
    """The issue's acceptance scenario; its figures go to ``tmp_path/scenario.json``."""
    n = len(tree.study_uids)
    figures: dict[str, Any] = {"studies": n, "files": sum(1 for _ in tree.root.rglob("*.*"))}
    reference = store_factory()
    began = time.monotonic()
    first = _batch(
        tree.root,
        reference,
        tmp_path / "work-a",
        "--report",
        str(tmp_path / "report.json"),
        "--export-sr",
        str(tmp_path / "sr"),
        verbose=True,
    )
    figures["first_wall_s"] = time.monotonic() - began
    assert first.exit_code == 1, first.output
    assert "Traceback" not in first.output
    assert "PHANTOM-" not in first.stderr  # logs carry no patient identifiers
    assert f"{n} studies under {tree.root}: {n} stored" in first.stdout
    assert f"studies: {n}/{n} (100 %)" in first.stderr and "ETA" in first.stderr
    rows = stored_rows(reference)
    assert [s[0] for s in rows["studies"]] == sorted(tree.study_uids)  # exactly once each
    assert sorted(r[0] for r in rows["runs"]) == sorted(tree.chosen.values())
    report = json.loads((tmp_path / "report.json").read_text())
    figures["first"] = report["summary"]
    with (tmp_path / "report.csv").open(newline="") as handle:
        _check_report(tree, report, list(csv.DictReader(handle)))
    _check_srs(tree, report, tmp_path / "sr", reference)

    # a re-run: nothing new, no header read again, in seconds
    events = _events(reference)
    began = time.monotonic()
    again = _batch(tree.root, reference, tmp_path / "work-a", "--report", str(tmp_path / "again"))
    wall = time.monotonic() - began
    assert again.exit_code == 1, again.output  # the corrupt files are still there
    summary = json.loads((tmp_path / "again.json").read_text())["summary"]
    assert summary["studies"] == {"total": n, "stored": 0, "already_stored": n, "failed": 0}
    assert summary["files"]["headers_read"] == 0 and summary["files"]["rejected"] == 20
    assert summary["seconds"] < max(10.0, n * 0.05), summary  # the batch itself, no model load
    assert stored_rows(reference) == rows and _events(reference) == events
    figures.update(rerun=summary, rerun_wall_s=wall)

    # SIGKILL half way, then the same command again: the same rows as the uninterrupted run
    resumed_store = store_factory()
    work = tmp_path / "work-b"
    killed_at = _kill_half_way(tree, resumed_store, work, tmp_path / "killed.log")
    partial = stored_rows(resumed_store)
    assert len(partial["runs"]) == killed_at  # whole studies only
    for table, kept in partial.items():
        assert set(kept) <= set(rows[table]), table
    began = time.monotonic()
    resumed = _batch(tree.root, resumed_store, work, "--report", str(tmp_path / "resumed.json"))
    figures.update(killed_at=killed_at, resumed_wall_s=time.monotonic() - began)
    assert resumed.exit_code == 1, resumed.output
    summary = json.loads((tmp_path / "resumed.json").read_text())["summary"]
    figures["resumed"] = summary
    final = stored_rows(resumed_store)
    figures["same_rows"] = {table: final[table] == rows[table] for table in rows}
    figures["rows"] = {table: len(kept) for table, kept in rows.items()}
    (tmp_path / "scenario.json").write_text(json.dumps(figures, indent=1))
    assert summary["studies"]["already_stored"] == killed_at
    assert summary["studies"]["stored"] == n - killed_at
    assert final == rows


def test_a_pacs_export_of_8_studies_is_stored_once_and_survives_kill_9(
    tree: Tree, store_factory: Callable[[], Store], tmp_path: Path
) -> None:
    _scenario(tree, store_factory, tmp_path)


@pytest.mark.slow
def test_a_pacs_export_of_200_studies_is_stored_once_and_survives_kill_9(
    tmp_path_factory: pytest.TempPathFactory, store_factory: Callable[[], Store], tmp_path: Path
) -> None:
    tree = build_tree(tmp_path_factory.mktemp("pacs200"), n=200, spec=None)  # full-size phantoms
    _scenario(tree, store_factory, tmp_path)


def test_nothing_can_run_is_exit_2_with_one_line(
    tmp_path: Path, sqlite_store: Store, write_series: SeriesFactory
) -> None:
    work = tmp_path / "work"
    missing = _batch(tmp_path / "nowhere", sqlite_store, work)
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    bad_db = runner.invoke(app, ["batch", str(tmp_path), "--db", "mysql://x/y"])
    assert bad_db.exit_code == 2 and "not supported" in bad_db.output
    write_series(tmp_path / "tree" / "s", n=12, rows=64, cols=64)
    not_a_model = _batch(tmp_path / "tree", sqlite_store, work, "--model", str(tmp_path))
    assert not_a_model.exit_code == 2 and "radcaliper.json is missing" in not_a_model.output
    modality = _batch(tmp_path / "tree", sqlite_store, work, "--modality", "US")
    assert modality.exit_code == 2 and "CT and/or MR" in modality.output
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.dcm").write_bytes(b"")
    report = tmp_path / "junk-report"
    empty = _batch(tmp_path / "junk", sqlite_store, work, "--report", str(report))
    assert empty.exit_code == 2 and "no CT/MR image study" in empty.output
    (entry,) = json.loads(report.with_suffix(".json").read_text())["rejected"]
    assert "empty file" in entry["reason"]
    for result in (missing, bad_db, not_a_model, modality, empty):
        assert "Traceback" not in result.output


def test_another_batch_in_the_same_work_folder_is_refused(
    tmp_path: Path, sqlite_store: Store, measurer: Any, write_series: SeriesFactory
) -> None:
    import fcntl

    write_series(tmp_path / "tree" / "s", n=12, rows=64, cols=64)
    (tmp_path / "work").mkdir()
    with (tmp_path / "work" / "lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = _batch(tmp_path / "tree", sqlite_store, tmp_path / "work")
    assert busy.exit_code == 2 and "another radcaliper batch" in busy.output


def _study_with_two_series(root: Path, seed: int = 5) -> tuple[str, str, str]:
    """A phantom study plus a thicker reconstruction of it; returns (study, thin, thick)."""
    (study,) = write_phantoms(root / "study", n=1, seed=seed, spec=SMALL)
    truth = json.loads((study / "truth.json").read_text())
    thick = rewrite_series(by_position(study / "dicom")[::2], study / "thick", SeriesNumber=2)
    thick_uid = pydicom.dcmread(thick[0]).SeriesInstanceUID
    return truth["study_instance_uid"], truth["series_instance_uid"], thick_uid


def test_a_series_that_fails_to_load_gives_way_to_the_next(
    tmp_path: Path, sqlite_store: Store, measurer: Any
) -> None:
    study_uid, thin, thick = _study_with_two_series(tmp_path / "tree")
    files = sorted((tmp_path / "tree" / "study").rglob("dicom/*.dcm"))
    middle = sorted(files, key=lambda p: float(pydicom.dcmread(p).ImagePositionPatient[2]))[5]
    middle.unlink()  # the thin series now misses a slice: seen only when it is stacked
    options = BatchOptions(
        root=tmp_path / "tree",
        work_dir=tmp_path / "work",
        rules=SelectionRules(min_slices=5),
        workers=0,
        report=tmp_path / "report",
    )
    summary = run_batch(options, store=sqlite_store, measurer=measurer)
    assert (summary.stored, summary.failed, summary.rejected_series) == (1, 0, 1)
    assert summary.exit_code == 1  # a series was rejected
    report = json.loads((tmp_path / "report.json").read_text())
    (study,) = report["studies"]
    assert study["study_instance_uid"] == study_uid and study["series_instance_uids"] == [thick]
    (rejected,) = report["rejected"]
    assert rejected["series_instance_uid"] == thin and "missing slice" in rejected["reason"]
    assert [r["path"] for r in report["skipped"]] == [
        str(tmp_path / "tree/study/phantom_0000/truth.json")
    ]


def test_a_truncated_copy_of_one_image_elsewhere_does_not_fail_the_study(
    tmp_path: Path, sqlite_store: Store, measurer: Any
) -> None:
    """issue 21: a second, truncated copy of one image (same SOPInstanceUID) in another folder
    made a good study fail as "incomplete". The intact copy is used; the damaged one is
    reported as a damaged copy."""
    study_uid, thin, _ = _study_with_two_series(tmp_path / "tree")
    original = sorted((tmp_path / "tree" / "study").rglob("dicom/*.dcm"))[4]
    damaged = tmp_path / "tree" / "export2" / "IM0004.dcm"
    damaged.parent.mkdir()
    damaged.write_bytes(original.read_bytes()[:-3000])
    options = BatchOptions(
        root=tmp_path / "tree",
        work_dir=tmp_path / "work",
        rules=SelectionRules(min_slices=5),
        workers=0,
        report=tmp_path / "report",
    )
    summary = run_batch(options, store=sqlite_store, measurer=measurer)
    assert (summary.stored, summary.failed, summary.rejected_series) == (1, 0, 0)
    report = json.loads((tmp_path / "report.json").read_text())
    (study,) = report["studies"]
    assert study["study_instance_uid"] == study_uid and study["series_instance_uids"] == [thin]
    (rejected,) = report["rejected"]
    assert rejected["path"] == str(damaged) and "truncated pixel data" in rejected["reason"]
    assert f"a damaged copy: the readable copy {original}" in rejected["reason"]
    assert not any("incomplete" in entry["reason"] for entry in report["skipped"])


def test_a_split_series_is_stored_as_its_stack_and_a_re_run_finds_it(
    tmp_path: Path, sqlite_store: Store, measurer: Any
) -> None:
    """issue 41: a series holding two stacks (a finer stack of six slices under the same
    SeriesInstanceUID): the batch measures the largest stack and stores it under the stack's
    key (the DICOM UID recorded beside it); a re-run finds that run (already stored) and still
    says which series was measured instead of the thicker one."""
    from db.models import Series
    from ingestion.load import load_path

    study_uid, thin, thick = _study_with_two_series(tmp_path / "tree", seed=11)
    study = tmp_path / "tree" / "study" / "phantom_0000"
    rewrite_series(
        by_position(study / "dicom")[:6],
        study / "fine",
        SeriesInstanceUID=thin,
        PixelSpacing=[0.5, 0.5],
    )
    parts = [v for v in load_path(study).volumes if v.identifiers.series_instance_uid == thin]
    largest = max(parts, key=lambda v: v.shape[0])
    key = largest.identifiers.series_key
    assert len(parts) == 2 and key != thin
    options = BatchOptions(
        root=tmp_path / "tree",
        work_dir=tmp_path / "work",
        rules=SelectionRules(min_slices=5),
        workers=0,
        report=tmp_path / "report",
    )
    for run, (stored, already) in enumerate(((1, 0), (0, 1))):
        summary = run_batch(options, store=sqlite_store, measurer=measurer)
        assert (summary.stored, summary.already_stored, summary.failed) == (stored, already, 0)
        report = json.loads((tmp_path / "report.json").read_text())
        (done,) = report["studies"]
        assert done["study_instance_uid"] == study_uid and done["series_instance_uids"] == [key]
        skipped = {(r["series_instance_uid"], r["reason"]) for r in report["skipped"]}
        assert any(
            uid == thick and "not chosen" in why and f"series {thin} (" in why
            for uid, why in skipped
        ), (run, skipped)
    with sqlite_store.reader() as session:
        row = session.execute(select(Series)).scalar_one()
        assert row.series_instance_uid == key
        assert row.sop_instance_uids["series_instance_uid"] == thin
        assert row.sop_instance_uids["uids"] == list(largest.identifiers.sop_instance_uids)


def test_inference_gets_the_cpus_the_loaders_leave_and_the_threads_are_restored(
    tmp_path: Path, sqlite_store: Store, measurer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    _study_with_two_series(tmp_path / "tree", seed=8)
    seen: list[int] = []
    measure = measurer.measure

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return measure(*args, **kwargs)

    monkeypatch.setattr(measurer, "measure", counting)
    monkeypatch.setattr("app.batch.options.usable_cpus", lambda: 3)  # as if under taskset -c 0-2
    before = torch.get_num_threads()
    options = BatchOptions(
        root=tmp_path / "tree",
        work_dir=tmp_path / "work",
        rules=SelectionRules(min_slices=5),
        workers=1,
        measurers=1,  # in this process
    )
    assert run_batch(options, store=sqlite_store, measurer=measurer).stored == 1
    assert seen == [2]  # 3 CPUs, 1 loader
    assert torch.get_num_threads() == before


def test_all_series_in_one_transaction_and_loading_in_this_process(
    tmp_path: Path, store: Store, measurer: Any
) -> None:
    _, thin, thick = _study_with_two_series(tmp_path / "tree", seed=6)
    rules = SelectionRules(min_slices=5, all_series=True)
    options = BatchOptions(root=tmp_path / "tree", work_dir=tmp_path / "work", rules=rules)
    done = run_batch(options, store=store, measurer=measurer)
    assert (done.stored, done.exit_code) == (1, 0)
    rows = stored_rows(store)
    assert sorted(r[0] for r in rows["runs"]) == sorted([thin, thick])
    in_process = dataclasses.replace(options, workers=0)
    again = run_batch(in_process, store=store, measurer=measurer)
    assert (again.stored, again.already_stored, again.scan.read) == (0, 1, 0)
    assert stored_rows(store) == rows


def test_a_database_failure_stops_the_batch_and_keeps_the_report(
    tmp_path: Path, sqlite_store: Store, measurer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _study_with_two_series(tmp_path / "tree")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("INSERT ...", {}, Exception("disk I/O error"))

    monkeypatch.setattr("app.batch.measure.store_study", broken)
    options = BatchOptions(
        root=tmp_path / "tree",
        work_dir=tmp_path / "work",
        workers=0,
        measurers=1,  # in this process, where store_study is broken
        report=tmp_path / "r",
    )
    summary = run_batch(options, store=sqlite_store, measurer=measurer)
    assert summary.aborted == "database: disk I/O error" and summary.exit_code == 2
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["aborted"]
    assert _runs(sqlite_store) == 0


def test_ctrl_c_stops_cleanly_and_a_re_run_resumes(
    tmp_path: Path, sqlite_store: Store, measurer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_phantoms(tmp_path / "tree", n=3, seed=8, spec=SMALL)
    calls = []
    measure = measurer.measure

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measure(*args, **kwargs)

    monkeypatch.setattr(measurer, "measure", interrupted)
    options = BatchOptions(
        root=tmp_path / "tree", work_dir=tmp_path / "work", workers=1, measurers=1
    )
    stopped = run_batch(options, store=sqlite_store, measurer=measurer)
    assert stopped.interrupted and stopped.stored == 1 and stopped.exit_code == 1
    monkeypatch.setattr(measurer, "measure", measure)
    resumed = run_batch(options, store=sqlite_store, measurer=measurer)
    assert (resumed.already_stored, resumed.stored, resumed.exit_code) == (1, 2, 0)


def test_measuring_processes_store_what_this_process_stores(
    tmp_path: Path,
    store_factory: Callable[[], Store],
    measurer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two measuring processes (``app.batch.pool``), each storing its studies itself, leave the
    rows the batch process leaves when it measures alone."""
    write_phantoms(tmp_path / "tree", n=3, seed=12, spec=SMALL)
    rows = []
    for measurers in (1, 2):
        store = store_factory()
        options = BatchOptions(
            root=tmp_path / "tree",
            work_dir=tmp_path / f"work-{measurers}",
            workers=1,
            measurers=measurers,
        )
        with caplog.at_level(logging.INFO, logger="app.batch.pool"):
            done = run_batch(options, store=store, measurer=measurer)
        assert (done.stored, done.failed, done.exit_code) == (3, 0, 0)
        rows.append(stored_rows(store))
    assert caplog.text.count("measuring in 2 processes") == 1  # not in the first batch
    assert rows[0] == rows[1]


def test_measuring_processes_follow_the_cpus_and_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model.measurer.checkpoint.settings import default_checkpoint

    model = default_checkpoint()
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    monkeypatch.setattr("app.batch.pool.available_memory", lambda: 64 << 30)
    monkeypatch.setattr("app.batch.pool.usable_cpus", lambda: 2)
    assert measuring_processes(1, model, url) == 2  # the loader waits most of the time
    assert measuring_processes(0, model, url) == 2
    assert measuring_processes(2, model, url) == 1
    monkeypatch.setattr("app.batch.pool.usable_cpus", lambda: 16)
    assert measuring_processes(8, model, url) == 9
    monkeypatch.setattr("app.batch.pool.available_memory", lambda: 5 * process_memory_bytes(model))
    assert measuring_processes(8, model, url) == 2  # half the memory holds two
    assert measuring_processes(1, None, url) == 1  # no directory to load the model from
    assert measuring_processes(1, model, "sqlite://") == 1  # a database only this process has
    with pytest.raises(ValueError, match="measurers must be an integer >= 1, got 0"):
        BatchOptions(root=tmp_path, work_dir=tmp_path, measurers=0)


def test_without_gpu_device_files_the_batch_process_does_not_import_torch(
    tmp_path: Path,
) -> None:
    from model.measurer.checkpoint.settings import default_checkpoint

    ask = (
        "import sys\n"
        "import app.batch.pool as pool\n"
        "pool._GPU_DEVICES = tuple(sys.argv[1:])\n"
        f"n = pool.measuring_processes(1, pool.Path({str(default_checkpoint())!r}), "
        f"{'sqlite:///' + str(tmp_path / 'store.sqlite3')!r})\n"
        "print(n >= 1, pool.may_have_gpu(), 'torch' in sys.modules)\n"
    )
    device = tmp_path / "nvidiactl"
    device.touch()

    def run(*devices: Path) -> str:
        done = subprocess.run(
            [sys.executable, "-c", ask, *map(str, devices)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPOSITORY,
        )
        return done.stdout.strip()

    assert run(tmp_path / "no-such-device") == "True False False"
    assert run(tmp_path / "no-such-device", device) == "True True True"  # torch asked


def test_a_re_run_with_every_study_stored_loads_no_model(
    tmp_path: Path, sqlite_store: Store, measurer: Any
) -> None:
    """The model (torch, transformers, MONAI) is loaded when a study needs measuring: a re-run
    with every study stored, in a fresh interpreter, imports none of them."""
    write_phantoms(tmp_path / "tree", n=2, seed=9, spec=SMALL)
    options = BatchOptions(root=tmp_path / "tree", work_dir=tmp_path / "work", workers=0)
    assert run_batch(options, store=sqlite_store, measurer=measurer).stored == 2
    script = (
        "import sys\n"
        "from app.cli import main\n"
        "sys.argv = ['radcaliper', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as done:\n    status = done.code\n"
        "print('loaded:', [m for m in ('torch', 'transformers', 'monai') if m in sys.modules])\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run(
        [
            *(sys.executable, "-c", script, "batch", str(tmp_path / "tree")),
            *("--db", str(sqlite_store.url), "--work", str(tmp_path / "work")),
        ],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0, done.stderr
    assert "0 stored, 2 already stored" in done.stdout
    assert "loaded: []" in done.stdout


def test_a_model_that_does_not_load_stops_the_batch_with_one_line(
    tmp_path: Path, sqlite_store: Store
) -> None:
    """Its settings are read at the start; its weights when the first study needs them: then
    the batch stops, exit 2, with the model's error (as when it was loaded up front)."""
    import shutil

    from model.measurer.checkpoint.settings import default_checkpoint

    model = tmp_path / "model"
    shutil.copytree(default_checkpoint(), model)
    (model / "numeric_head.safetensors").unlink()
    write_phantoms(tmp_path / "tree", n=1, seed=10, spec=SMALL)
    done = _batch(tmp_path / "tree", sqlite_store, tmp_path / "work", "--model", str(model))
    assert done.exit_code == 2, done.output
    assert "error:" in done.output and "numeric_head.safetensors is missing" in done.output
    assert "Traceback" not in done.output and _runs(sqlite_store) == 0


def test_report_paths_drop_a_json_or_csv_suffix(tmp_path: Path) -> None:
    expected = (tmp_path / "r.json", tmp_path / "r.csv")
    assert report_paths(tmp_path / "r") == expected
    assert report_paths(tmp_path / "r.json") == expected
    assert report_paths(tmp_path / "r.CSV") == (tmp_path / "r.json", tmp_path / "r.csv")
    assert report_paths(tmp_path / "r.txt") == (tmp_path / "r.txt.json", tmp_path / "r.txt.csv")


def test_batch_help_names_every_option() -> None:
    helped = runner.invoke(app, ["batch", "--help"], env={"COLUMNS": "200"})
    assert helped.exit_code == 0
    for option in ("--db", "--workers", "--report", "--export-sr", "--model", "--work"):
        assert option in helped.stdout
    for option in ("--modality", "--min-slices", "--include-derived", "--all-series"):
        assert option in helped.stdout


def test_the_loader_processes_log_as_the_batch_does(
    tmp_path: Path, sqlite_store: Store, write_series: SeriesFactory
) -> None:
    """A series warning raised in a loader process (spawned: no logging set up of its own) is a
    log record on stderr like the batch's own, never a bare line."""
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    def undeclared_non_ascii(ds: pydicom.Dataset, index: int) -> None:
        raw = "PAT-Ünïcödé".encode("latin-1") + b" "
        ds[Tag("PatientID")] = RawDataElement(Tag("PatientID"), "LO", len(raw), raw, 0, False, True)

    write_series(tmp_path / "tree" / "s", n=12, rows=64, cols=64, mutate=undeclared_non_ascii)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "app.cli", "batch", str(tmp_path / "tree")),
            *("--db", str(sqlite_store.url), "--work", str(tmp_path / "work"), "--workers", "1"),
        ],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "SpecificCharacterSet" in line]
    assert said, done.stderr
    assert all("WARNING" in line and "ingestion.load: series" in line for line in said), said
    assert "Ünïcödé" not in done.stderr and "PAT-" not in done.stderr
