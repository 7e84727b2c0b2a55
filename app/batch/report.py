"""The batch report: every study's outcome, every rejected file and series, every file and series
left out, as JSON and as CSV (README "Batch processing").

``--report FILE`` writes ``FILE.json`` and ``FILE.csv`` (a ``.json`` or ``.csv`` suffix of FILE is
dropped first: ``--report out/report.json`` writes ``out/report.json`` and ``out/report.csv``).
Both are streamed from the work index and the batch state, so memory does not grow with the
tree, and each is written to a temporary name and renamed, so a reader never sees half a file.

JSON: ``{"summary": {...}, "studies": [...], "rejected": [...], "skipped": [...]}``; a study has
``study_instance_uid, outcome (stored | already stored | failed), series_instance_uids, run_ids,
findings, reason, sr, seconds``; a rejected or skipped entry has ``path`` (null for a whole
series), ``study_instance_uid`` and ``series_instance_uid`` (when known), ``reason`` and
``error`` (the exception class, for files). CSV: one row per entry with the column ``record``
(study, file or series) and ``outcome`` (the study's outcome, or rejected / skipped).
No patient identifiers are written.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from app.batch.state import BatchState
from ingestion.catalog import FileRecord, FileStatus
from ingestion.selection import Note, NoteKind
from ingestion.work_index import WorkIndex

if TYPE_CHECKING:
    from app.batch.options import BatchSummary

__all__ = ["CSV_COLUMNS", "report_paths", "write_report"]

CSV_COLUMNS = (
    "record",
    "outcome",
    "study_instance_uid",
    "series_instance_uid",
    "path",
    "reason",
    "error",
    "run_ids",
    "findings",
    "sr",
    "seconds",
)


def report_paths(path: Path) -> tuple[Path, Path]:
    """``(FILE.json, FILE.csv)`` for ``--report FILE`` (module doc)."""
    base = path.with_suffix("") if path.suffix.lower() in (".json", ".csv") else path
    return base.with_name(base.name + ".json"), base.with_name(base.name + ".csv")


def _file_entry(record: FileRecord) -> dict[str, object]:
    return {
        "path": os.fsdecode(record.path),
        "study_instance_uid": None,
        "series_instance_uid": record.series_instance_uid,
        "reason": record.reason,
        "error": record.error,
    }


def _note_entry(study_uid: str, note: Note) -> dict[str, object]:
    return {
        "path": None if note.path is None else os.fsdecode(note.path),
        "study_instance_uid": study_uid,
        "series_instance_uid": note.series_instance_uid,
        "reason": note.reason,
        "error": "",
    }


def _entries(index: WorkIndex, state: BatchState, kind: NoteKind) -> Iterator[dict[str, object]]:
    status = FileStatus.REJECTED if kind is NoteKind.REJECTED else FileStatus.SKIPPED
    for record in index.files(status):
        yield _file_entry(record)
    for study_uid, note in state.notes(kind):
        yield _note_entry(study_uid, note)


def _json_list(handle: IO[str], key: str, items: Iterator[dict[str, object]]) -> None:
    handle.write(f',\n"{key}": [')
    separator = "\n"
    for item in items:
        handle.write(separator + json.dumps(item))
        separator = ",\n"
    handle.write("\n]")


def _write_json(path: Path, summary: BatchSummary, index: WorkIndex, state: BatchState) -> None:
    with path.open("w", encoding="utf-8") as handle:
        handle.write('{"summary": ' + json.dumps(summary.to_json(), indent=1))
        _json_list(handle, "studies", (s.to_json() for s in state.outcomes()))
        _json_list(handle, "rejected", _entries(index, state, NoteKind.REJECTED))
        _json_list(handle, "skipped", _entries(index, state, NoteKind.SKIPPED))
        handle.write("\n}\n")


def _write_csv(path: Path, index: WorkIndex, state: BatchState) -> None:
    with path.open("w", encoding="utf-8", errors="backslashreplace", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, restval="")
        writer.writeheader()
        for study in state.outcomes():
            row = study.to_json()
            writer.writerow(
                {
                    "record": "study",
                    "outcome": row["outcome"],
                    "study_instance_uid": row["study_instance_uid"],
                    "series_instance_uid": " ".join(study.series_instance_uids),
                    "reason": row["reason"],
                    "run_ids": " ".join(str(i) for i in study.run_ids),
                    "findings": "" if study.findings is None else study.findings,
                    "sr": row["sr"],
                    "seconds": row["seconds"],
                }
            )
        for kind in (NoteKind.REJECTED, NoteKind.SKIPPED):
            for entry in _entries(index, state, kind):
                writer.writerow(
                    {
                        "record": "series" if entry["path"] is None else "file",
                        "outcome": str(kind),
                        **{k: "" if v is None else v for k, v in entry.items()},
                    }
                )


def write_report(
    path: Path, summary: BatchSummary, index: WorkIndex, state: BatchState
) -> tuple[Path, Path]:
    """Write the report of the run that ``index`` and ``state`` hold; returns the two paths."""
    json_path, csv_path = report_paths(path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    for target, write in (
        (json_path, lambda p: _write_json(p, summary, index, state)),
        (csv_path, lambda p: _write_csv(p, index, state)),
    ):
        partial = target.with_name(target.name + ".partial")
        write(partial)
        partial.replace(target)
    return json_path, csv_path
