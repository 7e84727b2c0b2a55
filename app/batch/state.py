"""What a batch remembers between runs and what its report is made of, in an SQLite file in the
work folder (beside the work index):

- ``done``: per study and model, the signature of the study's files (names, sizes, times and the
  selection rules) and the (series, input fingerprint) pairs stored for it. A re-run whose
  signature matches checks those runs in the store and skips the study without reading pixels.
  It is only a shortcut: the store is the truth, and a study whose runs are not found there is
  processed again.
- ``outcomes`` and ``notes``: this run's per-study outcomes and the series / files it left out,
  streamed into the report at the end (so memory does not grow with the tree).
"""

from __future__ import annotations

import enum
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ingestion.selection import Note, NoteKind

__all__ = ["BatchState", "DoneEntry", "Outcome", "StudyRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS done (
    study_uid TEXT NOT NULL, model_key TEXT NOT NULL, signature TEXT NOT NULL,
    series TEXT NOT NULL,  -- JSON [[series uid, input fingerprint], ...]
    PRIMARY KEY (study_uid, model_key)
);
CREATE TABLE IF NOT EXISTS outcomes (
    seq INTEGER PRIMARY KEY, study_uid TEXT NOT NULL, outcome TEXT NOT NULL,
    series TEXT NOT NULL, run_ids TEXT NOT NULL, findings INTEGER, reason TEXT NOT NULL,
    sr TEXT NOT NULL, seconds REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS notes (
    seq INTEGER PRIMARY KEY, study_uid TEXT NOT NULL, kind TEXT NOT NULL, path BLOB,
    series_uid TEXT, reason TEXT NOT NULL
);
"""


class Outcome(enum.StrEnum):
    """What became of one study."""

    STORED = "stored"
    ALREADY_STORED = "already stored"
    FAILED = "failed"


@dataclass(frozen=True)
class StudyRecord:
    """One study's line in the report."""

    study_instance_uid: str
    outcome: Outcome
    series_instance_uids: tuple[str, ...] = ()
    run_ids: tuple[int, ...] = ()
    findings: int | None = None  # findings stored (None: not measured in this run)
    reason: str = ""  # why it failed
    sr: str = ""  # the SR written, or why none was
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "study_instance_uid": self.study_instance_uid,
            "outcome": str(self.outcome),
            "series_instance_uids": list(self.series_instance_uids),
            "run_ids": list(self.run_ids),
            "findings": self.findings,
            "reason": self.reason,
            "sr": self.sr,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class DoneEntry:
    """A study done before: the signature of its files and its stored (series, fingerprint)."""

    signature: str
    series: tuple[tuple[str, str], ...]


class BatchState:
    """The batch state file at ``path`` (created if missing)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> BatchState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def begin(self) -> None:
        """Start a new run: the previous run's outcomes and notes are dropped."""
        self._db.executescript("BEGIN; DELETE FROM outcomes; DELETE FROM notes; COMMIT;")

    # --- the shortcut for studies done before ------------------------------------------------

    def done(self, study_instance_uid: str, model_key: str) -> DoneEntry | None:
        row = self._db.execute(
            "SELECT signature, series FROM done WHERE study_uid = ? AND model_key = ?",
            (study_instance_uid, model_key),
        ).fetchone()
        if row is None:
            return None
        return DoneEntry(row[0], tuple((s, f) for s, f in json.loads(row[1])))

    def mark_done(self, study_instance_uid: str, model_key: str, entry: DoneEntry) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO done VALUES (?, ?, ?, ?)",
            (study_instance_uid, model_key, entry.signature, json.dumps(entry.series)),
        )

    # --- this run's report -------------------------------------------------------------------

    def record(self, study: StudyRecord) -> None:
        self._db.execute(
            "INSERT INTO outcomes (study_uid, outcome, series, run_ids, findings, reason, sr, "
            "seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                study.study_instance_uid,
                str(study.outcome),
                json.dumps(study.series_instance_uids),
                json.dumps(study.run_ids),
                study.findings,
                study.reason,
                study.sr,
                study.seconds,
            ),
        )

    def note(self, study_instance_uid: str, notes: Sequence[Note]) -> None:
        self._db.executemany(
            "INSERT INTO notes (study_uid, kind, path, series_uid, reason) VALUES (?, ?, ?, ?, ?)",
            [
                (
                    study_instance_uid,
                    str(n.kind),
                    None if n.path is None else os.fsencode(n.path),
                    n.series_instance_uid,
                    n.reason,
                )
                for n in notes
            ],
        )

    def outcomes(self) -> Iterator[StudyRecord]:
        for row in self._db.execute(
            "SELECT study_uid, outcome, series, run_ids, findings, reason, sr, seconds "
            "FROM outcomes ORDER BY study_uid, seq"
        ):
            yield StudyRecord(
                row[0],
                Outcome(row[1]),
                tuple(json.loads(row[2])),
                tuple(json.loads(row[3])),
                row[4],
                row[5],
                row[6],
                row[7],
            )

    def notes(self, kind: NoteKind) -> Iterator[tuple[str, Note]]:
        """This run's notes of one kind with their study UID, by study, in the order written."""
        for study, path, series, reason in self._db.execute(
            "SELECT study_uid, path, series_uid, reason FROM notes WHERE kind = ? "
            "ORDER BY study_uid, seq",
            (str(kind),),
        ):
            where = None if path is None else Path(os.fsdecode(path))
            yield study, Note(kind, where, series, reason)

    def note_count(self, kind: NoteKind) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM notes WHERE kind = ?", (str(kind),))
        return int(row.fetchone()[0])
