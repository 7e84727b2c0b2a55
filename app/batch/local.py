"""The batch engine of this machine (:class:`LocalEngine`): loads in worker processes and
measures in this process or in measuring processes (``app.batch.pool``)."""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING

from app.batch.measure import (
    DeferredMeasurer,
    StudyStored,
    measure_and_store_study,
    unexpected,
)
from app.batch.options import BatchOptions, Loaded, MeasuredStudy, inference_threads
from app.batch.pool import MeasuringPool, MeasuringSetup, measuring_processes
from app.batch.worker import StudyJob, StudyLoad, load_study, start_worker
from app.heap import keep_freed_memory
from app.threads import torch_threads
from db.engine import Store
from ingestion.catalog import FileRecord
from ingestion.errors import ModelError
from ingestion.work_index import read_headers_here

if TYPE_CHECKING:
    from model.measurer.protocol import Measurer

__all__ = ["LocalEngine"]

logger = logging.getLogger(__name__)


def _wait_first(
    loads: Iterable[Future[StudyLoad]], measured: Iterable[Future[StudyStored]]
) -> None:
    """Until one of the futures is done (``concurrent.futures.wait``, ``FIRST_COMPLETED``, for
    futures of two result types)."""
    done = threading.Event()
    for load in loads:
        load.add_done_callback(lambda _: done.set())
    for stored in measured:
        stored.add_done_callback(lambda _: done.set())
    done.wait()


class LocalEngine:
    """Loads in ``workers`` processes of this machine (0: in this process) and measures and
    stores in this process or in measuring processes (``app.batch.pool``), a bounded number of
    studies ahead.

    The first study to measure decides where it is measured (``BatchOptions.measurers``, else
    :func:`~app.batch.pool.measuring_processes`). In this process, a
    :class:`~app.batch.measure.DeferredMeasurer` loads its model then (a ``ModelError`` stops
    the batch: no study could be measured) and torch gets the CPUs the loaders leave
    (:func:`inference_threads`) until :meth:`close`; a measuring process loads the model at its
    first study (its ``ModelError`` stops the batch the same way). A batch whose studies are
    all stored imports neither torch nor the model."""

    def __init__(
        self, options: BatchOptions, store: Store, measurer: Measurer | DeferredMeasurer
    ) -> None:
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
            _wait_first(self.pending, self.measuring)
            for measured in [f for f in self.measuring if f.done()]:
                self._measured(self.measuring.pop(measured), measured)
            for future in [f for f in self.pending if f.done()]:
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

    def _directory(self) -> Path | None:
        """The checkpoint folder a measuring process loads the model from (a
        ``DeferredMeasurer``'s or a ``CheckpointMeasurer``'s), None for another measurer."""
        directory: Path | None = getattr(self.measurer, "directory", None)
        return directory

    def _pool(self) -> MeasuringPool | None:
        """The measuring processes (started at the first study), or None: this process
        measures."""
        if self.processes is None:
            self.processes = measuring_processes(
                self.options.workers, self._directory(), self.store.url
            )
        if self.processes == 1:
            return None
        if self.measurers is None:
            directory = self._directory()
            if directory is None:
                raise ValueError("measuring processes need a measurer loaded from a checkpoint")
            setup = MeasuringSetup(
                model_dir=Path(directory),
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

    def _measurer(self) -> Measurer:
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
