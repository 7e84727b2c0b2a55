"""``radcaliper batch``: measure every study under a folder tree, unattended, resumably and
idempotently, and say what could not be used and why (README "Batch processing").

1. **Scan**: every file's header goes into the work index on disk (``ingestion.work_index``),
   so memory does not depend on the tree; unchanged files are not read again on a re-run.
2. **Plan** each study from its cataloged headers (``ingestion.selection``): the candidate
   series, best first, and a note on every series left out.
3. **Skip** a study done before: its files' signature is the one remembered in the batch state
   and its runs are in the store (same model name, version, checkpoint and input fingerprint).
   No pixel is read.
4. **Load** the chosen series in worker processes (``app.batch_worker``), a bounded number of
   studies ahead of
5. **measure** (in this process) and **store**: one transaction per study, so a batch killed at
   any moment leaves whole studies or nothing. A study found in the store after loading (same
   input fingerprint) is not measured again.
6. **Export** the study's DICOM SR when asked (once: an existing file is kept).

A bad study never stops the batch: it becomes a failed record with its reason. Only a database
that stops working stops it (``BatchSummary.aborted``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.batch_report import write_report
from app.batch_state import BatchState, DoneEntry, Outcome, StudyRecord
from app.batch_worker import LoadedSeries, StudyJob, StudyLoad, load_study, start_worker
from app.measuring import run_identity, store_study
from db.engine import Store
from db.review import CorrectionLimits
from db.store import StoreOutcome
from ingestion.catalog import FileStatus
from ingestion.errors import (
    ConfigurationError,
    ModelError,
    NothingToExportError,
    PreparationError,
    StorageError,
)
from ingestion.selection import Note, NoteKind, SelectionRules, StudyPlan, plan_study
from ingestion.volume import Volume
from ingestion.work_index import ScanCounts, WorkIndex
from model.measurer.results import StudyResult

__all__ = [
    "BatchListener",
    "BatchOptions",
    "BatchSummary",
    "default_work_dir",
    "default_workers",
    "inference_threads",
    "run_batch",
]

logger = logging.getLogger(__name__)

_Measured = tuple[StudyResult, Volume, str]  # a result, its volume and input fingerprint

PROBLEMS_KEPT = 10
INDEX_NAME = "index.sqlite3"
STATE_NAME = "state.sqlite3"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. under taskset), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """Loader processes by default: half the CPUs (inference needs the rest), 1 to 8."""
    return max(1, min(8, usable_cpus() // 2))


def inference_threads(workers: int) -> int:
    """Threads for inference beside ``workers`` loaders: the CPUs they leave, at least one.

    More would oversubscribe the CPUs, and torch's spinning intra-op threads then slow down
    many times over (a demo study took 20-50 s instead of 0.6 s on 2 busy cores).
    """
    return max(1, usable_cpus() - workers)


@contextlib.contextmanager
def _threads_beside(workers: int) -> Iterator[None]:
    """torch's intra-op threads set to :func:`inference_threads` while the batch runs, restored
    after (a test or the UI in the same process keeps its own)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(inference_threads(workers))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def default_work_dir(data_dir: Path, root: Path) -> Path:
    """``DATA_DIR/batch/<16 hex of the resolved ROOT>``: one work folder per tree."""
    digest = hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:16]
    return data_dir / "batch" / digest


@dataclass(frozen=True)
class BatchOptions:
    """What to process and how (the command line's options)."""

    root: Path
    work_dir: Path
    rules: SelectionRules = field(default_factory=SelectionRules)
    workers: int = 1  # loader processes; 0 loads in this process
    export_sr: Path | None = None
    report: Path | None = None  # FILE: FILE.json and FILE.csv (app.batch_report)
    organization: str = "radcaliper"
    actor: str = "cli:batch"
    pseudonym_key: str | None = None
    # plausible values (db.review.CorrectionLimits); exported SRs leave the others out
    correction_limits: CorrectionLimits | None = None

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {self.workers!r}")


@dataclass
class BatchSummary:
    """Counts of one batch run (the report holds the details)."""

    root: Path
    work_dir: Path
    started_at: datetime
    model: dict[str, Any]
    scan: ScanCounts = field(default_factory=ScanCounts)
    studies: int = 0
    stored: int = 0
    already_stored: int = 0
    failed: int = 0
    rejected_series: int = 0  # series that were tried and could not be loaded
    skipped_series: int = 0  # series and duplicate files left out by the selection rules
    sr_written: int = 0
    sr_failed: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    aborted: str = ""  # why the batch stopped early (the database failed), else empty
    report: tuple[Path, ...] = ()  # the report files written
    first_problems: list[str] = field(default_factory=list)  # up to PROBLEMS_KEPT reasons

    def problem(self, reason: str) -> None:
        """Keep the first few problems' reasons (for a terminal without a report)."""
        if len(self.first_problems) < PROBLEMS_KEPT:
            self.first_problems.append(reason)

    @property
    def problems(self) -> int:
        """Rejected files and series, failed studies and SR exports."""
        return self.scan.rejected + self.rejected_series + self.failed + self.sr_failed

    @property
    def exit_code(self) -> int:
        """0 all done; 1 something failed or the batch stopped early; 2 no study to run."""
        if self.studies == 0 or (self.aborted and not self.stored + self.already_stored):
            return 2
        return 1 if self.problems or self.interrupted or self.aborted else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "work_dir": str(self.work_dir),
            "started_at": self.started_at.isoformat(),
            "seconds": round(self.seconds, 3),
            "model": self.model,
            "files": {
                "total": self.scan.files,
                "headers_read": self.scan.read,
                "unchanged": self.scan.reused,
                "images": self.scan.images,
                "skipped": self.scan.skipped,
                "rejected": self.scan.rejected,
            },
            "studies": {
                "total": self.studies,
                "stored": self.stored,
                "already_stored": self.already_stored,
                "failed": self.failed,
            },
            "series": {"rejected": self.rejected_series, "skipped": self.skipped_series},
            "sr": {"written": self.sr_written, "failed": self.sr_failed},
            "interrupted": self.interrupted,
            "aborted": self.aborted or None,
            "exit_code": self.exit_code,
        }


class BatchListener(Protocol):
    """Progress callbacks (the command line draws a bar from them)."""

    def scanned(self, files: int) -> None: ...

    def planned(self, studies: int) -> None: ...

    def finished(self, record: StudyRecord, summary: BatchSummary) -> None: ...


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


def _signature(plan_input: list[Any], rules: SelectionRules) -> str:
    digest = hashlib.sha256(repr(sorted(rules.to_json().items())).encode())
    for record in plan_input:
        digest.update(b"\0" + os.fsencode(record.path))
        digest.update(f"\0{record.size}\0{record.mtime_ns}".encode())
    return digest.hexdigest()


class _Runner:
    def __init__(
        self,
        options: BatchOptions,
        store: Store,
        measurer: Any,
        index: WorkIndex,
        state: BatchState,
        summary: BatchSummary,
        listener: BatchListener,
    ) -> None:
        self.options = options
        self.store = store
        self.measurer = measurer
        self.index = index
        self.state = state
        self.summary = summary
        self.listener = listener
        info = measurer.info
        self.model_key = f"{info.name}\x1f{info.version}\x1f{measurer.checkpoint_hash}"
        self.pool: ProcessPoolExecutor | None = None
        self.pending: dict[Future[StudyLoad], _Planned] = {}

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        limit = 2 * self.options.workers
        try:
            for uid in self.index.studies():
                planned = self._plan(uid)
                if planned is None:
                    continue
                if self.options.workers == 0:
                    self._load_here(planned)
                    continue
                self._submit(planned)
                while len(self.pending) >= limit:
                    self._collect()
            while self.pending:
                self._collect()
        except _DatabaseFailed as failure:
            self.summary.aborted = str(failure)
        except KeyboardInterrupt:
            self.summary.interrupted = True
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self, planned: _Planned) -> None:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(
                max_workers=self.options.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_worker,
                initargs=(os.getpid(), logging.getLogger().getEffectiveLevel()),
            )
        future = self.pool.submit(load_study, planned.job(self.options.rules.all_series))
        self.pending[future] = planned

    def _collect(self) -> None:
        done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        for future in done:
            planned = self.pending.pop(future)
            try:
                load = future.result()
            except BrokenProcessPool:
                self._broken_pool()
                self._failed(
                    planned,
                    "the loading process died (out of memory?) while loading this study; run "
                    "the batch again to retry it",
                )
                continue
            except Exception as exc:  # a bug in loading: report it, go on
                self._loading_failed(planned, exc)
                continue
            self._finish(planned, load)

    def _load_here(self, planned: _Planned) -> None:
        """``--workers 0``: load in this process."""
        try:
            load = load_study(planned.job(self.options.rules.all_series))
        except Exception as exc:  # a bug in loading: report it, go on
            self._loading_failed(planned, exc)
            return
        self._finish(planned, load)

    def _loading_failed(self, planned: _Planned, exc: Exception) -> None:
        logger.debug("loading a study failed", exc_info=exc)
        self._failed(planned, f"while loading: {_unexpected(exc)}")

    def _broken_pool(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None

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
            run_ids = self._stored_runs(entry.series)
            if run_ids is not None:
                used = tuple(s for s, _ in entry.series)
                self._note_not_chosen(planned, used, used)
                record = StudyRecord(
                    uid,
                    Outcome.ALREADY_STORED,
                    tuple(s for s, _ in entry.series),
                    run_ids,
                )
                self._done(planned, record)
                return None
        return planned

    def _stored_runs(self, series: tuple[tuple[str, str], ...]) -> tuple[int, ...] | None:
        """The stored runs of these (series, fingerprint) pairs by this model; None if one is
        missing."""
        from sqlalchemy.exc import SQLAlchemyError

        from db.store import find_run

        info = self.measurer.info
        ids = []
        try:
            with self.store.reader() as session:
                for uid, fingerprint in series:
                    identity = run_identity(self.measurer, fingerprint)
                    run = find_run(session, uid, info.name, info.version, identity)
                    if run is None:
                        return None
                    ids.append(run.id)
        except (SQLAlchemyError, StorageError) as exc:
            raise _DatabaseFailed(_database_reason(exc)) from exc
        return tuple(ids)

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

    def _finish(self, planned: _Planned, load: StudyLoad) -> None:
        self.state.note(planned.uid, load.notes)
        rejected = [n for n in load.notes if n.kind is NoteKind.REJECTED]
        self.summary.rejected_series += len(rejected)
        for note in rejected:
            self.summary.problem(note.reason)
        self.summary.skipped_series += len(load.notes) - len(rejected)
        if not load.loaded:
            reasons = "; ".join(n.reason for n in rejected) or "nothing loaded"
            self._failed(planned, f"no series could be loaded: {reasons}")
            return
        self._note_not_chosen(planned, tuple(_uid(s) for s in load.loaded), load.tried)
        kept: list[tuple[str, str, int]] = []  # (series, fingerprint, run id) already stored
        to_measure: list[LoadedSeries] = []
        for series in load.loaded:
            found = self._stored_runs(((_uid(series), series.fingerprint),))
            if found is None:
                to_measure.append(series)
            else:
                kept.append((_uid(series), series.fingerprint, found[0]))
        measured, failures = self._measure(to_measure)
        if not measured and not kept:
            self._failed(planned, "; ".join(reason for _, reason in failures))
            return
        if failures:  # --all-series: some series measured, others refused
            notes = [Note(NoteKind.REJECTED, None, uid, reason) for uid, reason in failures]
            self.state.note(planned.uid, notes)
            self.summary.rejected_series += len(notes)
            for _, reason in failures:
                self.summary.problem(f"study {planned.uid}: {reason}")
        outcomes = self._store(measured)
        pairs = [(s, f) for s, f, _ in kept] + [(r.series_instance_uid, f) for r, _, f in measured]
        record = StudyRecord(
            planned.uid,
            Outcome.STORED if any(o.created for o in outcomes) else Outcome.ALREADY_STORED,
            tuple(s for s, _ in pairs),
            tuple(i for _, _, i in kept) + tuple(o.run_id for o in outcomes),
            sum(len(r.findings) for r, _, _ in measured) if measured else None,
        )
        if not failures:  # a study with a refused series is tried again next time
            self.state.mark_done(
                planned.uid, self.model_key, DoneEntry(planned.signature, tuple(pairs))
            )
        self._done(planned, record)

    def _measure(self, loaded: list[LoadedSeries]) -> tuple[list[_Measured], list[tuple[str, str]]]:
        """Measure each series; the refused ones (model, preparation or a bug) as reasons."""
        measured: list[_Measured] = []
        failures: list[tuple[str, str]] = []  # (series uid, why it was not measured)
        for series in loaded:
            volume = series.volume
            source = os.path.commonpath([str(p) for p in volume.sources])
            try:
                result = self.measurer.measure(volume, source=source)
            except (ModelError, PreparationError) as exc:
                failures.append((_uid(series), f"series {_uid(series)}: {exc}"))
                continue
            except Exception as exc:  # a bug on one input must not stop the batch
                logger.debug("measuring a series failed", exc_info=exc)
                failures.append((_uid(series), f"series {_uid(series)}: {_unexpected(exc)}"))
                continue
            measured.append((result, volume, series.fingerprint))
        return measured, failures

    def _store(self, measured: list[_Measured]) -> list[StoreOutcome]:
        if not measured:
            return []
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return store_study(
                self.store,
                self.measurer,
                measured,
                started_at=datetime.now(UTC),
                actor=self.options.actor,
                pseudonym_key=self.options.pseudonym_key,
            )
        except (SQLAlchemyError, StorageError) as exc:
            raise _DatabaseFailed(_database_reason(exc)) from exc

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


def _unexpected(exc: Exception) -> str:
    return f"unexpected error: {type(exc).__name__}: {exc}"


def _uid(series: LoadedSeries) -> str:
    return series.volume.identifiers.series_instance_uid


def _database_reason(exc: Exception) -> str:
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"database: {reason[0] if reason else type(exc).__name__}"


def run_batch(
    options: BatchOptions,
    *,
    store: Store,
    measurer: Any,
    listener: BatchListener | None = None,
) -> BatchSummary:
    """Scan ``options.root`` and measure and store every study (module doc).

    Raises:
        ConfigurationError: another batch holds the work folder.
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
        try:
            summary.scan = index.scan(options.root, on_file=listener.scanned)
        except KeyboardInterrupt:
            summary.interrupted = True
            summary.seconds = time.perf_counter() - began
            return summary
        state.begin()
        for record in itertools.islice(index.files(FileStatus.REJECTED), PROBLEMS_KEPT):
            summary.problem(record.reason)
        summary.studies = index.study_count()
        listener.planned(summary.studies)
        with _threads_beside(options.workers):
            _Runner(options, store, measurer, index, state, summary, listener).run()
        summary.seconds = time.perf_counter() - began
        if options.report is not None:
            summary.report = write_report(options.report, summary, index, state)
    return summary
