"""``radcaliper batch``: measure every study under a folder tree, unattended, resumably and
idempotently, and say what could not be used and why (README "Batch processing").

1. **Scan**: every file's header goes into the work index on disk (``ingestion.work_index``),
   so memory does not depend on the tree; unchanged files are not read again on a re-run.
2. **Plan** each study from its cataloged headers (``ingestion.selection``): the candidate
   series, best first, and a note on every series left out.
3. **Skip** a study done before: its files' signature is the one remembered in the batch state
   and its runs are in the store (same model name, version, checkpoint and input fingerprint).
   No pixel is read.
4. **Load** the chosen series in worker processes (``app.batch.worker``), a bounded number of
   studies ahead of
5. **measure** and **store** (``app.batch.measure``), in this process or, on a machine without a
   GPU, in measuring processes of one torch thread each (``app.batch.pool``): one transaction per
   study, so a batch killed at any moment leaves whole studies or nothing. A study found in the
   store after loading (same input fingerprint) is not measured again.

Steps 1, 4 and 5 run on a :class:`BatchEngine`: :class:`LocalEngine` on this machine, or
``app.batch.ray_engine.RayEngine`` on a Ray cluster (header reads and loads as tasks, measuring and
storing in actors). Planning, skipping, the state and the report stay in this process, so both
engines store the same rows and write the same report.
6. **Export** the study's DICOM SR when asked (once: an existing file is kept).

A bad study never stops the batch: it becomes a failed record with its reason. Only a database
that stops working stops it (``BatchSummary.aborted``).

Modules: ``options`` (the options, summary, events and the engine protocol, below the rest),
``run`` (``run_batch``), ``local`` (:class:`LocalEngine`), ``worker`` (loading), ``measure``
(measuring and storing), ``pool`` (measuring processes), ``ray_engine`` (``RayEngine``),
``state`` (the batch state) and ``report`` (the JSON and CSV report). Names are served lazily
(PEP 562): a worker that imports ``app.batch.worker`` pays for nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from app.batch.local import LocalEngine
    from app.batch.options import (
        BatchEngine,
        BatchListener,
        BatchOptions,
        BatchSummary,
        Loaded,
        MeasuredStudy,
        default_work_dir,
        default_workers,
        inference_threads,
    )
    from app.batch.run import run_batch

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

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(
        __name__,
        {
            "app.batch.options": (
                "BatchEngine",
                "BatchListener",
                "BatchOptions",
                "BatchSummary",
                "Loaded",
                "MeasuredStudy",
                "default_work_dir",
                "default_workers",
                "inference_threads",
            ),
            "app.batch.local": ("LocalEngine",),
            "app.batch.run": ("run_batch",),
        },
        globals(),
    )
