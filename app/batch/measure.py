"""Measuring and storing one study's loaded series: the batch's measuring step, run in the batch
process (the local engine) or in a measuring worker on a cluster (``app.batch.ray_engine``).

It never raises for a series the model refuses or a bug on one input (the series becomes a
failure with its reason), and reports a database that fails as :attr:`StudyStored.database_error`
(the batch then stops: every further study would fail the same way).

A :class:`DeferredMeasurer` is the model as the batch sees it before anything needs measuring:
its name, version and checkpoint hash (enough to skip what is stored), its weights loaded only
when the first study needs them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from app.batch.worker import LoadedSeries
from app.measuring import store_study
from db.engine import Store
from ingestion.errors import ModelError, PreparationError, StorageError
from ingestion.volume import Volume
from model.measurer.results import ModelInfo, StudyResult

if TYPE_CHECKING:
    from model.measurer.infer import CheckpointMeasurer
    from model.measurer.protocol import Measurer

__all__ = [
    "DeferredMeasurer",
    "SeriesStored",
    "StudyStored",
    "database_reason",
    "measure_and_store_study",
    "open_worker",
    "unexpected",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeriesStored:
    """One series measured and stored: its run (``created`` False: it was stored before)."""

    series_instance_uid: str  # its store key: the UID, or a stack's (Identifiers.series_key)
    fingerprint: str
    run_id: int
    created: bool
    findings: int


@dataclass(frozen=True)
class StudyStored:
    """What measuring and storing a study's series gave."""

    stored: tuple[SeriesStored, ...]
    failures: tuple[tuple[str, str], ...]  # (series uid, why it was not measured)
    database_error: str = ""  # the store failed: nothing of this study was stored


class DeferredMeasurer:
    """A measurer checkpoint whose model is loaded when it first measures.

    :attr:`info` and :attr:`checkpoint_hash` are read from the directory at once, without
    importing torch or transformers: what a batch needs to skip the studies stored before.
    :meth:`load` loads the model (once); ``ModelError`` when it cannot.
    """

    def __init__(
        self,
        info: ModelInfo,
        checkpoint_hash: str,
        load: Callable[[], Measurer],
        directory: Path | None = None,
    ) -> None:
        self.info = info
        self.checkpoint_hash = checkpoint_hash
        self.directory = directory  # where a measuring process loads the model from
        self._load = load
        self._measurer: Measurer | None = None

    @classmethod
    def of(cls, directory: Path) -> DeferredMeasurer:
        """The checkpoint at ``directory``: its ``radcaliper.json`` read and its files hashed
        now (``ModelError`` when it is not a measurer checkpoint), its weights at :meth:`load`
        (``model.measurer.infer.pipeline.CheckpointMeasurer.load``)."""
        from model.measurer.checkpoint.settings import checkpoint_hash, read_settings

        info = read_settings(directory).model_info()

        def load() -> Measurer:
            from model.measurer.infer import CheckpointMeasurer

            return CheckpointMeasurer.load(directory)

        return cls(info, checkpoint_hash(directory), load, directory.resolve())

    def load(self) -> Measurer:
        """The measurer, loaded on the first call (``ModelError`` when it cannot be)."""
        if self._measurer is None:
            self._measurer = self._load()
        return self._measurer


def open_worker(model_dir: Path, db_url: str, threads: int) -> tuple[CheckpointMeasurer, Store]:
    """What a measuring worker (a Ray actor, a local measuring process) measures and stores
    with: the checkpoint at ``model_dir`` loaded with torch on ``threads`` threads (without
    transformers' "Loading weights" bar, one per worker in the log), malloc keeping what
    inference frees (``app.heap``), and the database opened."""
    import torch
    from transformers.utils import logging as transformers_logging

    from app.heap import keep_freed_memory
    from db.engine import open_store
    from model.measurer.infer.pipeline import CheckpointMeasurer

    torch.set_num_threads(threads)
    keep_freed_memory()
    transformers_logging.disable_progress_bar()
    return CheckpointMeasurer.load(model_dir), open_store(db_url)


def unexpected(exc: BaseException) -> str:
    """A reason for an error nobody expected (a bug): its class and message."""
    return f"unexpected error: {type(exc).__name__}: {exc}"


def database_reason(exc: BaseException) -> str:
    """One line on a database failure (the driver's first line, without the SQL)."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"database: {reason[0] if reason else type(exc).__name__}"


def measure_and_store_study(
    measurer: Measurer,
    store: Store,
    series: Sequence[LoadedSeries],
    *,
    actor: str,
    pseudonym_key: str | None,
) -> StudyStored:
    """Measure each series with ``measurer`` and store the results in one transaction."""
    measured: list[tuple[StudyResult, Volume, str]] = []
    failures: list[tuple[str, str]] = []
    for loaded in series:
        volume = loaded.volume
        uid = volume.identifiers.series_instance_uid
        source = os.path.commonpath([str(p) for p in volume.sources])
        try:
            result = measurer.measure(volume, source=source)
        except (ModelError, PreparationError) as exc:
            failures.append((uid, f"series {uid}: {exc}"))
            continue
        except Exception as exc:  # a bug on one input must not stop the batch
            logger.debug("measuring a series failed", exc_info=exc)
            failures.append((uid, f"series {uid}: {unexpected(exc)}"))
            continue
        measured.append((result, volume, loaded.fingerprint))
    if not measured:
        return StudyStored((), tuple(failures))
    from sqlalchemy.exc import SQLAlchemyError

    try:
        outcomes = store_study(
            store,
            measurer,
            measured,
            started_at=datetime.now(UTC),
            actor=actor,
            pseudonym_key=pseudonym_key,
        )
    except (SQLAlchemyError, StorageError) as exc:
        return StudyStored((), tuple(failures), database_reason(exc))
    stored = tuple(
        SeriesStored(
            volume.identifiers.series_key,  # what the store finds the run by
            fingerprint,
            outcome.run_id,
            outcome.created,
            len(result.findings),
        )
        for (result, volume, fingerprint), outcome in zip(measured, outcomes, strict=True)
    )
    return StudyStored(stored, tuple(failures))
