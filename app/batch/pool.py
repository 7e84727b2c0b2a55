"""Measuring processes for the local batch engine (``app.batch.LocalEngine``).

On a machine without a GPU, single-threaded processes that each hold the model measure more
studies per hour than one process with as many threads: the demo's matrices are too small for
torch's threads to pay off, and two such processes on 2 cores measured 1.7 times the studies of
one (benchmarks/RESULTS.md). :func:`measuring_processes` says how many a batch starts:

- one (the batch process itself measures) with a GPU, or when the model has no directory a
  process could load it from, or the database is an in-memory SQLite one;
- else one per CPU, less the loader processes beyond the first (a loader waits for a free slot
  most of the time), and no more than half the available memory holds.

A :class:`MeasuringPool` starts them (spawned, each exits when the batch process is gone) when
the first study needs measuring; each loads the model and opens the database at its first
study, measures with one torch thread and stores the study itself (one transaction per study,
as in the batch process; SQLite queues the writers, PostgreSQL locks the audit head).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.batch.measure import StudyStored, measure_and_store_study, open_worker
from app.batch.worker import LoadedSeries, start_worker
from app.threads import usable_cpus
from db.engine import in_memory
from ingestion.errors import ModelError

if TYPE_CHECKING:
    from db.engine import Store
    from model.measurer.infer.pipeline import CheckpointMeasurer

__all__ = [
    "MeasuringPool",
    "MeasuringSetup",
    "available_memory",
    "may_have_gpu",
    "measuring_processes",
    "process_memory_bytes",
]

logger = logging.getLogger(__name__)

_PROCESS_BASE_BYTES = 7 << 28  # 1.75 GiB: torch, transformers, MONAI, the largest study kept
_MEMORY_SHARE = 0.5  # of the available memory, for all measuring processes together
_GPU_DEVICES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")  # NVIDIA's driver, WSL's, ROCm's


@dataclass(frozen=True)
class MeasuringSetup:
    """What a measuring process needs: the model it loads (checked against the batch's by its
    checkpoint hash), the database it stores into and the audit actor."""

    model_dir: Path
    checkpoint_hash: str
    db_url: str
    actor: str
    pseudonym_key: str | None
    level: int  # the batch's logging level


def process_memory_bytes(model_dir: Path) -> int:
    """What one measuring process may hold: a fixed base and its weights' files twice (the
    loaded tensors and what loading them touches)."""
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    weights += sum(p.stat().st_size for p in model_dir.glob("*.bin"))
    return _PROCESS_BASE_BYTES + 2 * weights


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (Linux), else None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def may_have_gpu() -> bool:
    """False where torch cannot find a GPU: Linux without the device files of NVIDIA's
    driver, of WSL's or of ROCm's. Asking torch imports it (1.2 s and about 100 MiB of the batch
    process, which does not measure on a machine without one)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(device) for device in _GPU_DEVICES)


def measuring_processes(workers: int, model_dir: Path | None, db_url: str) -> int:
    """How many processes measure (module doc); 1 means the batch process itself. Imports
    torch to ask for a GPU where there may be one (:func:`may_have_gpu`): call it when a study
    needs measuring."""
    if model_dir is None or in_memory(db_url):
        return 1
    if may_have_gpu():
        import torch

        if torch.cuda.is_available():
            return 1
    cpus = usable_cpus()
    by_cpus = max(1, min(cpus, cpus - workers + 1))
    available = available_memory()
    if available is None:
        return by_cpus
    by_memory = int(available * _MEMORY_SHARE) // process_memory_bytes(model_dir)
    return max(1, min(by_cpus, by_memory))


class MeasuringPool:
    """``processes`` spawned processes that measure and store studies (module doc)."""

    def __init__(self, processes: int, setup: MeasuringSetup) -> None:
        self._executor = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(os.getpid(), setup),
        )
        logger.info("measuring in %d processes of one torch thread each", processes)

    def submit(self, series: tuple[LoadedSeries, ...]) -> Future[StudyStored]:
        """Measure and store these series of one study in a measuring process."""
        return self._executor.submit(_measure, series)

    def close(self, *, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=True)


# --- in a measuring process ---------------------------------------------------------------


_setup: MeasuringSetup | None = None
_opened: tuple[CheckpointMeasurer, Store] | None = None  # from the first study on


def _start(parent: int, setup: MeasuringSetup) -> None:
    """Process-pool initializer: as a loader (``start_worker``), and remember the setup."""
    global _setup
    start_worker(parent, setup.level)
    _setup = setup


def _measure(series: tuple[LoadedSeries, ...]) -> StudyStored:
    global _opened
    if _setup is None:
        raise RuntimeError("a measuring process was not started by MeasuringPool")
    if _opened is None:
        measurer, store = open_worker(_setup.model_dir, _setup.db_url, threads=1)
        if measurer.checkpoint_hash != _setup.checkpoint_hash:
            store.dispose()
            raise ModelError(
                f"the checkpoint at {_setup.model_dir} changed while the batch ran (its hash is "
                "not the one the batch started with); run the batch again"
            )
        _opened = measurer, store
    measurer, store = _opened
    return measure_and_store_study(
        measurer, store, series, actor=_setup.actor, pseudonym_key=_setup.pseudonym_key
    )
