"""``run_batch``: scan, plan, skip, load, measure, store and export one tree on an engine, and
keep its state and report (the steps: ``app.batch``)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from app.batch.local import LocalEngine
from app.batch.measure import (
    DeferredMeasurer,
    StudyStored,
    database_reason,
)
from app.batch.options import (
    PROBLEMS_KEPT,
    BatchEngine,
    BatchListener,
    BatchOptions,
    BatchSummary,
    Loaded,
    MeasuredStudy,
    ModelIdentity,
)
from app.batch.report import write_report
from app.batch.state import BatchState, DoneEntry, Outcome, StudyRecord
from app.batch.worker import LoadOutline, StudyJob
from app.measuring import NamedModel, run_identity
from db.engine import Store
from ingestion.catalog import FileRecord, FileStatus
from ingestion.errors import ConfigurationError, NothingToExportError, StorageError
from ingestion.selection import Note, NoteKind, SelectionRules, StudyPlan, plan_study
from ingestion.work_index import WorkIndex

if TYPE_CHECKING:
    from model.measurer.protocol import Measurer

__all__ = ["run_batch"]

logger = logging.getLogger(__name__)

INDEX_NAME = "index.sqlite3"
STATE_NAME = "state.sqlite3"


class _Quiet:
    def scanned(self, files: int) -> None:
        pass

    def planned(self, studies: int) -> None:
        pass

    def finished(self, record: StudyRecord, summary: BatchSummary) -> None:
        pass


class _DatabaseFailed(Exception):
    """The store failed: stop the batch (every further study would fail the same way)."""


@contextlib.contextmanager
def _work_lock(work_dir: Path) -> Iterator[None]:
    import fcntl

    work_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / "lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigurationError(
                f"another radcaliper batch is using the work folder {work_dir}; wait for it to "
                "finish, or give this one its own --work DIR"
            ) from None
        yield


@dataclass(frozen=True)
class _Planned:
    plan: StudyPlan
    signature: str
    began: float

    @property
    def uid(self) -> str:
        return self.plan.study_instance_uid

    def job(self, all_series: bool) -> StudyJob:
        series = tuple((c.series_instance_uid, c.paths) for c in self.plan.candidates)
        return StudyJob(self.uid, series, all_series)


def _signature(plan_input: list[FileRecord], rules: SelectionRules) -> str:
    digest = hashlib.sha256(repr(sorted(rules.to_json().items())).encode())
    for record in plan_input:
        digest.update(b"\0" + os.fsencode(record.path))
        digest.update(f"\0{record.size}\0{record.mtime_ns}".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class _ToMeasure:
    """A loaded study, between its load and its measuring."""

    outline: LoadOutline
    measure: tuple[int, ...]  # positions in outline.series
    kept: tuple[tuple[str, str, int], ...]  # (series key, fingerprint, run id) stored before


class _Runner:
    def __init__(
        self,
        options: BatchOptions,
        store: Store,
        measurer: NamedModel,
        engine: BatchEngine,
        index: WorkIndex,
        state: BatchState,
        summary: BatchSummary,
        listener: BatchListener,
    ) -> None:
        self.options = options
        self.store = store
        self.measurer = measurer
        self.engine = engine
        self.index = index
        self.state = state
        self.summary = summary
        self.listener = listener
        info = measurer.info
        self.model_key = f"{info.name}\x1f{info.version}\x1f{measurer.checkpoint_hash}"
        self.planned: dict[int, _Planned] = {}
        self.measuring: dict[int, _ToMeasure] = {}
        self.keys = itertools.count()

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            for uid in self.index.studies():
                planned = self._plan(uid)
                if planned is None:
                    continue
                key = next(self.keys)
                self.planned[key] = planned
                self.engine.load(key, planned.job(self.options.rules.all_series))
                while len(self.planned) >= self.engine.capacity:
                    self._handle(self.engine.next_event())
            while self.planned:
                self._handle(self.engine.next_event())
        except _DatabaseFailed as failure:
            self.summary.aborted = str(failure)
        except KeyboardInterrupt:
            self.summary.interrupted = True
        finally:
            self.engine.close()

    def _handle(self, event: Loaded | MeasuredStudy) -> None:
        key = event.key
        planned = self.planned[key]
        if isinstance(event, Loaded):
            work = None if event.outline is None else self._loaded(planned, event.outline)
            if event.outline is None:
                self._failed(planned, event.error)
            if work is None:
                del self.planned[key]
                self.engine.release(key)
                return
            self.measuring[key] = work
            self.engine.measure(key, work.measure)
            return
        del self.planned[key]
        work = self.measuring.pop(key)
        if event.stored is None:
            self._failed(planned, event.error)
            return
        if event.stored.database_error:
            raise _DatabaseFailed(event.stored.database_error)
        self._measured(planned, work, event.stored)

    # --- one study ---------------------------------------------------------------------------

    def _plan(self, uid: str) -> _Planned | None:
        began = time.perf_counter()
        images = self.index.study_images(uid)
        damaged = self.index.problems_of(images)
        plan = plan_study(uid, images, damaged, self.options.rules)
        planned = _Planned(plan, _signature([*images, *damaged], self.options.rules), began)
        self.state.note(uid, plan.notes)
        self.summary.skipped_series += len(plan.notes)
        if not plan.candidates:
            self._failed(planned, plan.no_candidate_reason())
            return None
        entry = self.state.done(uid, self.model_key)
        if entry is not None and entry.signature == planned.signature:
            runs = self._stored_runs(entry.series)
            if runs is not None:
                used = tuple(series_uid for _, series_uid in runs)
                self._note_not_chosen(planned, used, used)
                record = StudyRecord(
                    uid,
                    Outcome.ALREADY_STORED,
                    tuple(s for s, _ in entry.series),
                    tuple(run_id for run_id, _ in runs),
                )
                self._done(planned, record)
                return None
        return planned

    def _stored_runs(
        self, series: tuple[tuple[str, str], ...]
    ) -> tuple[tuple[int, str], ...] | None:
        """The stored runs of these (series key, fingerprint) pairs by this model, as (run id,
        DICOM series UID); None if one is missing. A series key is ``Identifiers.series_key``:
        the UID, or a stack's key where the series holds several."""
        from sqlalchemy.exc import SQLAlchemyError

        from db.store import dicom_series_uid, find_run

        info = self.measurer.info
        found = []
        try:
            with self.store.reader() as session:
                for key, fingerprint in series:
                    identity = run_identity(self.measurer, fingerprint)
                    run = find_run(session, key, info.name, info.version, identity)
                    if run is None:
                        return None
                    found.append((run.id, dicom_series_uid(run.series)))
        except (SQLAlchemyError, StorageError) as exc:
            raise _DatabaseFailed(database_reason(exc)) from exc
        return tuple(found)

    def _note_not_chosen(
        self, planned: _Planned, used: tuple[str, ...], tried: tuple[str, ...]
    ) -> None:
        """A note on each candidate that was not tried because a better one was measured."""
        if self.options.rules.all_series or not used:
            return
        candidates = planned.plan.candidates
        chosen = next((c for c in candidates if c.series_instance_uid == used[0]), None)
        if chosen is None:
            return
        notes = [
            Note(
                NoteKind.SKIPPED,
                None,
                c.series_instance_uid,
                f"series {c.describe()}: not chosen; series {chosen.describe()} is measured "
                "(one series per study: axial first, then the thinnest; --all-series measures "
                "every one)",
            )
            for c in candidates
            if c.series_instance_uid not in tried
        ]
        self.state.note(planned.uid, notes)
        self.summary.skipped_series += len(notes)

    def _loaded(self, planned: _Planned, load: LoadOutline) -> _ToMeasure | None:
        """Record the load's notes; what is left to measure (None: the study is done)."""
        self.state.note(planned.uid, load.notes)
        rejected = [n for n in load.notes if n.kind is NoteKind.REJECTED]
        self.summary.rejected_series += len(rejected)
        for note in rejected:
            self.summary.problem(note.reason)
        self.summary.skipped_series += len(load.notes) - len(rejected)
        if not load.series:
            reasons = "; ".join(n.reason for n in rejected) or "nothing loaded"
            self._failed(planned, f"no series could be loaded: {reasons}")
            return None
        self._note_not_chosen(planned, tuple(uid for uid, _ in load.series), load.tried)
        kept: list[tuple[str, str, int]] = []  # (series key, fingerprint, run id) stored before
        to_measure: list[int] = []
        for position, ((_, fingerprint), key) in enumerate(
            zip(load.series, load.keys, strict=True)
        ):
            found = self._stored_runs(((key, fingerprint),))
            if found is None:
                to_measure.append(position)
            else:
                kept.append((key, fingerprint, found[0][0]))
        work = _ToMeasure(load, tuple(to_measure), tuple(kept))
        if not to_measure:
            self._measured(planned, work, StudyStored((), ()))
            return None
        return work

    def _measured(self, planned: _Planned, work: _ToMeasure, stored: StudyStored) -> None:
        failures = stored.failures
        if not stored.stored and not work.kept:
            self._failed(planned, "; ".join(reason for _, reason in failures))
            return
        if failures:  # --all-series: some series measured, others refused
            notes = [Note(NoteKind.REJECTED, None, uid, reason) for uid, reason in failures]
            self.state.note(planned.uid, notes)
            self.summary.rejected_series += len(notes)
            for _, reason in failures:
                self.summary.problem(f"study {planned.uid}: {reason}")
        pairs = [(s, f) for s, f, _ in work.kept] + [
            (s.series_instance_uid, s.fingerprint) for s in stored.stored
        ]
        record = StudyRecord(
            planned.uid,
            Outcome.STORED if any(s.created for s in stored.stored) else Outcome.ALREADY_STORED,
            tuple(s for s, _ in pairs),
            tuple(i for _, _, i in work.kept) + tuple(s.run_id for s in stored.stored),
            sum(s.findings for s in stored.stored) if stored.stored else None,
        )
        if not failures:  # a study with a refused series is tried again next time
            self.state.mark_done(
                planned.uid, self.model_key, DoneEntry(planned.signature, tuple(pairs))
            )
        self._done(planned, record)

    def _failed(self, planned: _Planned, reason: str) -> None:
        self.summary.problem(f"study {planned.uid}: {reason}")
        self._done(planned, StudyRecord(planned.uid, Outcome.FAILED, reason=reason))

    def _done(self, planned: _Planned, record: StudyRecord) -> None:
        out_dir = self.options.export_sr
        if record.outcome is not Outcome.FAILED and out_dir is not None:
            record = replace(record, sr=self._export(record.study_instance_uid, out_dir))
        seconds = time.perf_counter() - planned.began
        record = replace(record, seconds=seconds)
        self.state.record(record)
        summary = self.summary
        if record.outcome is Outcome.STORED:
            summary.stored += 1
        elif record.outcome is Outcome.ALREADY_STORED:
            summary.already_stored += 1
        else:
            summary.failed += 1
        logger.info("study %s in %.2f s", record.outcome, seconds)
        self.listener.finished(record, summary)

    def _export(self, study_uid: str, out_dir: Path) -> str:
        """Write the study's SR unless it is there already; what happened, for the report."""
        from app.sr import export_study_sr, sr_path

        path = sr_path(out_dir, study_uid)
        if path.exists():
            return f"kept {path}"
        try:
            with self.store.reader() as session:
                done = export_study_sr(
                    session,
                    study_uid,
                    out_dir,
                    organization=self.options.organization,
                    limits=self.options.correction_limits,
                )
        except NothingToExportError as exc:
            return f"none: {exc}"
        except Exception as exc:  # highdicom or the store: the SR fails, the study stays stored
            logger.debug("SR export failed", exc_info=exc)
            self.summary.sr_failed += 1
            self.summary.problem(f"study {study_uid}: SR export failed: {exc}")
            return f"failed: {exc}"
        self.summary.sr_written += 1
        return str(done.path)


def run_batch(
    options: BatchOptions,
    *,
    store: Store,
    measurer: Measurer | DeferredMeasurer | ModelIdentity,
    listener: BatchListener | None = None,
    engine: BatchEngine | None = None,
) -> BatchSummary:
    """Scan ``options.root`` and measure and store every study (module doc).

    ``engine`` runs the reads, loads and measuring: by default a :class:`LocalEngine` on this
    machine (inference gets the CPUs its loaders leave); ``app.batch.ray_engine.RayEngine`` on a Ray
    cluster. ``measurer`` names the model (``info``, ``checkpoint_hash``) and, with the local
    engine, measures: a :class:`~app.batch.measure.DeferredMeasurer` loads its model only when
    a study needs measuring.

    Raises:
        ConfigurationError: another batch holds the work folder.
        ModelError: the deferred measurer's model could not be loaded (the batch stops).
    """
    began = time.perf_counter()
    listener = listener or _Quiet()
    info = measurer.info
    summary = BatchSummary(
        root=options.root,
        work_dir=options.work_dir,
        started_at=datetime.now(UTC),
        model={
            "name": info.name,
            "version": info.version,
            "checkpoint_hash": measurer.checkpoint_hash,
            "not_for_clinical_use": info.not_for_clinical_use,
        },
    )
    with (
        _work_lock(options.work_dir),
        WorkIndex(options.work_dir / INDEX_NAME) as index,
        BatchState(options.work_dir / STATE_NAME) as state,
    ):
        if engine is None:
            if isinstance(measurer, ModelIdentity):
                raise ValueError("a ModelIdentity cannot measure: give the engine that does")
            engine = LocalEngine(options, store, measurer)
        try:
            summary.scan = index.scan(
                options.root,
                on_file=listener.scanned,
                read_headers=engine.read_headers,
                chunk=engine.scan_chunk,
            )
        except KeyboardInterrupt:
            summary.interrupted = True
            summary.seconds = time.perf_counter() - began
            return summary
        state.begin()
        for record in itertools.islice(index.files(FileStatus.REJECTED), PROBLEMS_KEPT):
            summary.problem(record.reason)
        summary.studies = index.study_count()
        listener.planned(summary.studies)
        runner = _Runner(options, store, measurer, engine, index, state, summary, listener)
        runner.run()
        summary.seconds = time.perf_counter() - began
        if options.report is not None:
            summary.report = write_report(options.report, summary, index, state)
    return summary
