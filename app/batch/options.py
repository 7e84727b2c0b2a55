"""What a batch is given and what it gives back, below its engines and its report: the options,
the summary, the progress listener, the engines' events and the :class:`BatchEngine` protocol."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from app.batch.measure import StudyStored
from app.batch.state import StudyRecord
from app.batch.worker import LoadOutline, StudyJob
from app.threads import usable_cpus
from db.review import CorrectionLimits
from ingestion.catalog import FileRecord
from ingestion.selection import SelectionRules
from ingestion.work_index import ScanCounts
from model.measurer.results import ModelInfo

__all__ = [
    "PROBLEMS_KEPT",
    "BatchEngine",
    "BatchListener",
    "BatchOptions",
    "BatchSummary",
    "Loaded",
    "MeasuredStudy",
    "ModelIdentity",
    "default_work_dir",
    "default_workers",
    "inference_threads",
]

logger = logging.getLogger(__name__)

PROBLEMS_KEPT = 10


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
    # processes that measure (local engine); 1: this process; None: app.batch.pool decides
    measurers: int | None = None
    export_sr: Path | None = None
    report: Path | None = None  # FILE: FILE.json and FILE.csv (app.batch.report)
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
    model: dict[str, str | bool]  # name, version, checkpoint_hash, not_for_clinical_use
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

    def to_json(self) -> dict[str, object]:
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


@dataclass(frozen=True)
class ModelIdentity:
    """What the driver needs of the model: its name and version and its checkpoint's hash
    (``app.measuring.run_identity``), read from the directory without loading any weight."""

    info: ModelInfo
    checkpoint_hash: str
    directory: Path

    @classmethod
    def of(cls, directory: Path) -> ModelIdentity:
        """``ModelError`` when ``directory`` is not a measurer checkpoint."""
        from ingestion.errors import ModelError
        from model.measurer.checkpoint.settings import (
            SETTINGS_NAME,
            MeasurerSettings,
            checkpoint_hash,
        )

        path = directory / SETTINGS_NAME
        try:
            settings = MeasurerSettings.from_json(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ModelError(
                f"{directory} is not a radcaliper measurer checkpoint: cannot read {path} ({exc})"
            ) from None
        return cls(settings.model_info(), checkpoint_hash(directory), directory.resolve())


class BatchListener(Protocol):
    """Progress callbacks (the command line draws a bar from them)."""

    def scanned(self, files: int) -> None: ...

    def planned(self, studies: int) -> None: ...

    def finished(self, record: StudyRecord, summary: BatchSummary) -> None: ...


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
    cluster (``app.batch.ray_engine.RayEngine``). The batch plans, skips and records; an engine runs
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
