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
5. **measure** and **store** (``app.batch_measure``), in this process or, on a machine without a
   GPU, in measuring processes of one torch thread each (``app.batch_pool``): one transaction per
   study, so a batch killed at any moment leaves whole studies or nothing. A study found in the
   store after loading (same input fingerprint) is not measured again.

Steps 1, 4 and 5 run on a :class:`BatchEngine`: :class:`LocalEngine` on this machine, or
``app.batch_ray.RayEngine`` on a Ray cluster (header reads and loads as tasks, measuring and
storing in actors). Planning, skipping, the state and the report stay in this process, so both
engines store the same rows and write the same report.
6. **Export** the study's DICOM SR when asked (once: an existing file is kept).

A bad study never stops the batch: it becomes a failed record with its reason. Only a database
that stops working stops it (``BatchSummary.aborted``).
"""

from __future__ import annotations

import collections
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

from app.batch_measure import (
    DeferredMeasurer,
    StudyStored,
    database_reason,
    measure_and_store_study,
    unexpected,
)
from app.batch_pool import MeasuringPool, MeasuringSetup, measuring_processes
from app.batch_report import write_report
from app.batch_state import BatchState, DoneEntry, Outcome, StudyRecord
from app.batch_worker import LoadOutline, StudyJob, StudyLoad, load_study, start_worker
from app.heap import keep_freed_memory
from app.measuring import run_identity
from app.threads import torch_threads, usable_cpus
from db.engine import Store
from db.review import CorrectionLimits
from ingestion.catalog import FileRecord, FileStatus
from ingestion.errors import ConfigurationError, ModelError, NothingToExportError, StorageError
from ingestion.selection import Note, NoteKind, SelectionRules, StudyPlan, plan_study
from ingestion.work_index import ScanCounts, WorkIndex, read_headers_here

__all__ = [
    "BatchEngine",
    "BatchListener",
    "BatchOptions",
    "BatchSummary",
    "Loaded",
    "LocalEngine",
    "MeasuredStudy",
    "default_work_dir",
    "default_workers",
    "inference_threads",
    "run_batch",
]

logger = logging.getLogger(__name__)

PROBLEMS_KEPT = 10
INDEX_NAME = "index.sqlite3"
STATE_NAME = "state.sqlite3"


def default_workers() -> int:
    """Loader processes by default: half the CPUs (inference needs the rest), 1 to 8."""
    return max(1, min(8, usable_cpus() // 2))


def inference_threads(workers: int) -> int:
    """Threads for inference beside ``workers`` loaders: the CPUs they leave, at least one.

    More would oversubscribe the CPUs, and torch's spinning intra-op threads then slow down
    many times over (a demo study took 20-50 s instead of 0.6 s on 2 busy cores).
    """
    return max(1, usable_cpus() - workers)


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
    # processes that measure (local engine); 1: this process; None: app.batch_pool decides
    measurers: int | None = None
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
        if self.measurers is not None and (
            isinstance(self.measurers, bool)
            or not isinstance(self.measurers, int)
            or self.measurers < 1
        ):
            raise ValueError(f"measurers must be an integer >= 1, got {self.measurers!r}")


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


@dataclass(frozen=True)
class Loaded:
    """An engine's event: a study's series were loaded (``outline``), or loading failed."""

    key: int
    outline: LoadOutline | None
    error: str = ""  # why loading failed (a bug, or the loading process died)


@dataclass(frozen=True)
class MeasuredStudy:
    """An engine's event: a study's series were measured and stored, or that failed."""

    key: int
    stored: StudyStored | None
    error: str = ""  # why measuring failed as a whole (the measuring worker died)


class BatchEngine(Protocol):
    """Where a batch loads, measures and stores: this machine (:class:`LocalEngine`) or a
    cluster (``app.batch_ray.RayEngine``). The batch plans, skips and records; an engine runs
    the work it is given, for studies known by a key, and reports each step as an event."""

    @property
    def capacity(self) -> int:
        """Studies to keep in flight (loading or measuring)."""
        ...

    @property
    def scan_chunk(self) -> int:
        """Files per call of :meth:`read_headers`."""
        ...

    def read_headers(self, chunks: Iterator[list[Path]]) -> Iterator[list[FileRecord]]:
        """The scan's header reads (``ingestion.work_index.HeaderReader``)."""
        ...

    def load(self, key: int, job: StudyJob) -> None:
        """Start loading a study (a :class:`Loaded` event follows)."""
        ...

    def measure(self, key: int, series: tuple[int, ...]) -> None:
        """Measure and store these of the key's loaded series, by position in its outline (a
        :class:`MeasuredStudy` event follows); the load is released after."""
        ...

    def release(self, key: int) -> None:
        """Forget the key's load: nothing of it is measured."""
        ...

    def next_event(self) -> Loaded | MeasuredStudy:
        """The next finished step (blocks until there is one)."""
        ...

    def close(self) -> None:
        """Stop whatever is still running."""
        ...


class LocalEngine:
    """Loads in ``workers`` processes of this machine (0: in this process) and measures and
    stores in this process or in measuring processes (``app.batch_pool``), a bounded number of
    studies ahead.

    The first study to measure decides where it is measured (``BatchOptions.measurers``, else
    :func:`~app.batch_pool.measuring_processes`). In this process, a
    :class:`~app.batch_measure.DeferredMeasurer` loads its model then (a ``ModelError`` stops
    the batch: no study could be measured) and torch gets the CPUs the loaders leave
    (:func:`inference_threads`) until :meth:`close`; a measuring process loads the model at its
    first study (its ``ModelError`` stops the batch the same way). A batch whose studies are
    all stored imports neither torch nor the model."""

    def __init__(self, options: BatchOptions, store: Store, measurer: Any) -> None:
        self.options = options
        self.store = store
        self.measurer = measurer
        self.pool: ProcessPoolExecutor | None = None
        self.pending: dict[Future[StudyLoad], int] = {}
        self.loads: dict[int, StudyLoad] = {}
        self.measurers: MeasuringPool | None = None
        self.measuring: dict[Future[StudyStored], int] = {}
        self.processes = options.measurers  # where studies are measured, once decided
        self.ready: collections.deque[Loaded | MeasuredStudy] = collections.deque()
        self.threads: contextlib.ExitStack | None = None  # torch's threads, set while measuring

    @property
    def capacity(self) -> int:
        loading = max(1, 2 * self.options.workers)
        measuring = self.processes or 1  # one study measured in this process, else each's
        return loading if measuring == 1 else loading + measuring

    scan_chunk = 1

    def read_headers(self, chunks: Iterator[list[Path]]) -> Iterator[list[FileRecord]]:
        return read_headers_here(chunks)

    def load(self, key: int, job: StudyJob) -> None:
        if self.options.workers == 0:
            try:
                self._loaded(key, load_study(job))
            except Exception as exc:  # a bug in loading: report it, go on
                self.ready.append(Loaded(key, None, _loading_failed(exc)))
            return
        if self.pool is None:
            self.pool = ProcessPoolExecutor(
                max_workers=self.options.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_worker,
                initargs=(os.getpid(), logging.getLogger().getEffectiveLevel()),
            )
        self.pending[self.pool.submit(load_study, job)] = key

    def measure(self, key: int, series: tuple[int, ...]) -> None:
        load = self.loads.pop(key)
        chosen = tuple(load.loaded[i] for i in series)
        pool = self._pool()
        if pool is not None:
            self.measuring[pool.submit(chosen)] = key
            return
        stored = measure_and_store_study(
            self._measurer(),
            self.store,
            chosen,
            actor=self.options.actor,
            pseudonym_key=self.options.pseudonym_key,
        )
        self.ready.append(MeasuredStudy(key, stored))

    def release(self, key: int) -> None:
        self.loads.pop(key, None)

    def next_event(self) -> Loaded | MeasuredStudy:
        if not self.ready:
            running: list[Future[Any]] = [*self.pending, *self.measuring]
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                if future in self.measuring:
                    self._measured(self.measuring.pop(future), future)
                    continue
                key = self.pending.pop(future)
                try:
                    self._loaded(key, future.result())
                except BrokenProcessPool:
                    self._broken_pool()
                    reason = (
                        "the loading process died (out of memory?) while loading this study; "
                        "run the batch again to retry it"
                    )
                    self.ready.append(Loaded(key, None, reason))
                except Exception as exc:  # a bug in loading: report it, go on
                    self.ready.append(Loaded(key, None, _loading_failed(exc)))
        return self.ready.popleft()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        if self.measurers is not None:
            self.measurers.close()
            self.measurers = None
        if self.threads is not None:
            self.threads.close()
            self.threads = None

    def _pool(self) -> MeasuringPool | None:
        """The measuring processes (started at the first study), or None: this process
        measures."""
        if self.processes is None:
            directory = getattr(self.measurer, "directory", None)
            self.processes = measuring_processes(self.options.workers, directory, self.store.url)
        if self.processes == 1:
            return None
        if self.measurers is None:
            setup = MeasuringSetup(
                model_dir=Path(self.measurer.directory),
                checkpoint_hash=self.measurer.checkpoint_hash,
                db_url=self.store.url,
                actor=self.options.actor,
                pseudonym_key=self.options.pseudonym_key,
                level=logging.getLogger().getEffectiveLevel(),
            )
            self.measurers = MeasuringPool(self.processes, setup)
        return self.measurers

    def _measured(self, key: int, future: Future[StudyStored]) -> None:
        """A measuring process's study: stored, or why not. Its ``ModelError`` (the model did
        not load there) stops the batch, as in this process."""
        try:
            self.ready.append(MeasuredStudy(key, future.result()))
        except ModelError:
            raise
        except BrokenProcessPool:
            if self.measurers is not None:
                self.measurers.close(wait=False)
                self.measurers = None
            reason = (
                "the measuring process died (out of memory?) while measuring this study; run "
                "the batch again to retry it"
            )
            self.ready.append(MeasuredStudy(key, None, reason))
        except Exception as exc:  # a bug: report it, go on
            logger.debug("measuring a study failed", exc_info=exc)
            self.ready.append(MeasuredStudy(key, None, f"while measuring: {unexpected(exc)}"))

    def _measurer(self) -> Any:
        """The model, loaded the first time a study is measured, with torch's threads set."""
        measurer = self.measurer
        if isinstance(measurer, DeferredMeasurer):
            measurer = measurer.load()
        if self.threads is None:
            keep_freed_memory()
            threads = contextlib.ExitStack()
            threads.enter_context(torch_threads(inference_threads(self.options.workers)))
            self.threads = threads
        return measurer

    def _loaded(self, key: int, load: StudyLoad) -> None:
        self.loads[key] = load
        self.ready.append(Loaded(key, load.outline()))

    def _broken_pool(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


def _loading_failed(exc: Exception) -> str:
    logger.debug("loading a study failed", exc_info=exc)
    return f"while loading: {unexpected(exc)}"


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
        measurer: Any,
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
    measurer: Any,
    listener: BatchListener | None = None,
    engine: BatchEngine | None = None,
) -> BatchSummary:
    """Scan ``options.root`` and measure and store every study (module doc).

    ``engine`` runs the reads, loads and measuring: by default a :class:`LocalEngine` on this
    machine (inference gets the CPUs its loaders leave); ``app.batch_ray.RayEngine`` on a Ray
    cluster. ``measurer`` names the model (``info``, ``checkpoint_hash``) and, with the local
    engine, measures: a :class:`~app.batch_measure.DeferredMeasurer` loads its model only when
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
        engine = engine or LocalEngine(options, store, measurer)
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
