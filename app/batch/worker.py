"""Loading one study's series in a worker process: what ``radcaliper batch`` runs in its process
pool while the main process measures the study before. Imports neither torch nor the model.

A worker gets a :class:`StudyJob` (the study's candidate series, best first, as file lists) and
returns a :class:`StudyLoad`: the volume(s) with their input fingerprints, and a note for each
series or part that could not be used. It never raises for bad input. The readers (pydicom) are
imported by the first load, not by this module: a batch with nothing to load imports none.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ingestion.errors import IngestionError
from ingestion.selection import Note, NoteKind

if TYPE_CHECKING:
    from ingestion.volume import Volume

__all__ = [
    "LoadOutline",
    "LoadedSeries",
    "StudyJob",
    "StudyLoad",
    "load_study",
    "start_worker",
]

logger = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class StudyJob:
    """The series of one study to try, best first: ``(series uid, files)`` each."""

    study_instance_uid: str
    series: tuple[tuple[str, tuple[Path, ...]], ...]
    all_series: bool = False


@dataclass(frozen=True)
class LoadedSeries:
    volume: Volume
    fingerprint: str  # db.store.input_fingerprint of the volume


@dataclass(frozen=True)
class LoadOutline:
    """What the batch decides from when a study is loaded: the loaded series as ``(series
    uid, input fingerprint)``, in the order of :attr:`StudyLoad.loaded`, their store keys
    (``Identifiers.series_key``: the UID, or a stack's key where the series holds several), and
    the notes. No pixels: on a cluster the volumes stay with the workers."""

    study_instance_uid: str
    series: tuple[tuple[str, str], ...]
    notes: tuple[Note, ...]
    tried: tuple[str, ...]  # series UIDs tried, in order
    seconds: float
    keys: tuple[str, ...]  # the store key of each of ``series``


@dataclass(frozen=True)
class StudyLoad:
    """What loading a study gave: volumes (none when no series could be used) and notes."""

    study_instance_uid: str
    loaded: tuple[LoadedSeries, ...]
    notes: tuple[Note, ...]
    tried: tuple[str, ...]  # series UIDs tried, in order
    seconds: float

    def outline(self) -> LoadOutline:
        series = tuple(
            (s.volume.identifiers.series_instance_uid, s.fingerprint) for s in self.loaded
        )
        keys = tuple(s.volume.identifiers.series_key for s in self.loaded)
        return LoadOutline(
            self.study_instance_uid, series, self.notes, self.tried, self.seconds, keys
        )


def _load_series(uid: str, paths: tuple[Path, ...], notes: list[Note]) -> LoadedSeries | None:
    from db.store import input_fingerprint
    from ingestion.load import load_series
    from ingestion.scan import scan_files

    scanned = scan_files(paths)
    for rejected in scanned.rejected:
        notes.append(Note(NoteKind.REJECTED, rejected.path, uid, rejected.reason))
    if not scanned.series:
        return None
    parts = sorted(scanned.series, key=lambda ref: -len(ref.slices))
    for part in parts[1:]:
        notes.append(
            Note(
                NoteKind.SKIPPED,
                part.slices[0].path,
                uid,
                f"series {part.label}: a smaller part of a split series; the largest part "
                f"({len(parts[0].slices)} planes) is measured",
            )
        )
    try:
        volume = load_series(parts[0])
    except IngestionError as exc:
        notes.append(
            Note(NoteKind.REJECTED, parts[0].slices[0].path, uid, f"series {parts[0].label}: {exc}")
        )
        return None
    return LoadedSeries(volume, input_fingerprint(volume))


def load_study(job: StudyJob) -> StudyLoad:
    """Load the first series of ``job`` that loads (every one with ``all_series``)."""
    began = time.perf_counter()
    notes: list[Note] = []
    loaded: list[LoadedSeries] = []
    tried: list[str] = []
    for uid, paths in job.series:
        tried.append(uid)
        series = _load_series(uid, paths, notes)
        if series is not None:
            loaded.append(series)
            if not job.all_series:
                break
    return StudyLoad(
        job.study_instance_uid,
        tuple(loaded),
        tuple(notes),
        tuple(tried),
        time.perf_counter() - began,
    )


def _exit_with_parent(parent: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent:  # the batch died (kill -9): nobody will collect our work
            os._exit(0)


def _killed_with_parent() -> None:
    """Linux: the kernel sends this process SIGKILL when the batch process dies, so that a
    measuring process stores nothing after a killed batch (elsewhere the poll in
    :func:`_exit_with_parent` ends it within half a second)."""
    if sys.platform != "linux":
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl in this C library: the poll stays
        logger.debug("prctl(PR_SET_PDEATHSIG) is not available")


def start_worker(parent: int, log_level: int = logging.WARNING) -> None:
    """Process-pool initializer: leave Ctrl-C to the batch (which stops the pool), end when the
    batch process is gone, so that a killed batch leaves no workers behind, and log as the batch
    does (a spawned process starts without logging set up: its warnings would be bare lines)."""
    from app.logs import configure_logging

    configure_logging(logging.getLevelName(log_level))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _killed_with_parent()
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
