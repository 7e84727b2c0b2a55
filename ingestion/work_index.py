"""The batch work index: every file of a tree with what its header said, in an SQLite file on
disk, so that memory does not grow with the tree and a second scan reads no unchanged header.

- :meth:`WorkIndex.scan` walks the tree lazily (one folder listing at a time). A file whose
  size and modification time match its row is not read again; any other file is read with
  :func:`~ingestion.catalog.catalog_file` (headers only). Each scan is a *generation*: rows of
  files no longer in the tree stay behind but are never returned.
- :meth:`WorkIndex.studies` pages through the study UIDs of the last scan;
  :meth:`WorkIndex.study_images` returns one study's image files, :meth:`WorkIndex.damaged`
  the rejected files of given series, :meth:`WorkIndex.unreadable` the files that could not be
  read at all, :meth:`WorkIndex.problems_of` both for a study's images (what series selection
  needs), :meth:`WorkIndex.files` streams files by status.
- A rejected file whose image (SOPInstanceUID) is an image file of the last scan is returned as a
  damaged copy: ``intact_copy`` names that file and its reason says so. This is worked out
  when the files are read back, not stored: it holds for the tree as it is now.

The index is a cache: deleting it costs one full header scan, nothing else. It is used by one
process at a time (the batch takes a lock on its work folder).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingestion.catalog import FileRecord, FileStatus, ImageAttributes, catalog_file
from ingestion.errors import UnreadableFileError
from ingestion.scan import damaged_copy_reason, iter_files

__all__ = ["HeaderReader", "ScanCounts", "WorkIndex", "read_headers_here"]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = "3"  # 3: rejected files keep their SOPInstanceUID
_COMMIT_EVERY = 500

# Reads the headers of chunks of files (``catalog_file`` each) and yields each chunk's records,
# in any order: in this process (``read_headers_here``) or spread over a cluster
# (app.batch.ray_engine).
HeaderReader = Callable[[Iterator[list[Path]]], Iterator[list[FileRecord]]]


def read_headers_here(chunks: Iterator[list[Path]]) -> Iterator[list[FileRecord]]:
    """The default :data:`HeaderReader`: one chunk after the other, in this process."""
    for chunk in chunks:
        yield [catalog_file(path) for path in chunk]


_PAGE = 256
_COLUMNS = (
    "path, size, mtime_ns, status, reason, error, series_uid, study_uid, sop_uid, modality, "
    "series_number, series_description, image_type, rows, columns, planes, nx, ny, nz, "
    "depth_min, depth_max, pixel_spacing, thickness"
)
# a rejected file's intact copy: an image file of the same generation with its SOPInstanceUID
_COPY = (
    "(SELECT i.path FROM files AS i WHERE i.sop_uid = files.sop_uid AND i.status = 'image' "
    "AND i.seen = files.seen ORDER BY i.path LIMIT 1)"
)
_INSERT = (
    f"INSERT OR REPLACE INTO files ({_COLUMNS.replace('mtime_ns,', 'mtime_ns, seen,')}) "
    f"VALUES ({', '.join('?' * 24)})"
)
_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE files (
    path BLOB PRIMARY KEY,          -- os.fsencode(path): any file name round-trips
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    seen INTEGER NOT NULL,          -- the last scan generation that saw the file
    status TEXT NOT NULL,           -- image | skipped | rejected
    reason TEXT NOT NULL,
    error TEXT NOT NULL,
    series_uid TEXT,                -- images, and rejected files of a known series
    study_uid TEXT,
    sop_uid TEXT,                   -- images, and rejected files of a known image
    modality TEXT, series_number INTEGER,
    series_description TEXT, image_type TEXT, rows INTEGER, columns INTEGER, planes INTEGER,
    nx REAL, ny REAL, nz REAL, depth_min REAL, depth_max REAL, pixel_spacing REAL,
    thickness REAL
);
-- no index on status alone: SQLite would prefer it (it saves a sort) and read every image row
-- for each study; the report's once-per-run listing by status scans the table instead
CREATE INDEX ix_files_study ON files (study_uid, status);
CREATE INDEX ix_files_series ON files (series_uid, status);
CREATE INDEX ix_files_sop ON files (sop_uid, status);
INSERT INTO meta VALUES ('schema', '{SCHEMA_VERSION}'), ('generation', '0');
"""


@dataclass
class ScanCounts:
    """What one scan saw."""

    files: int = 0
    read: int = 0  # headers read: new or changed files
    reused: int = 0  # unchanged since an earlier scan: the header was not read again
    images: int = 0
    skipped: int = 0
    rejected: int = 0


def _row(record: FileRecord, seen: int) -> tuple[Any, ...]:
    image = record.image
    base = (
        os.fsencode(record.path),
        record.size,
        record.mtime_ns,
        seen,
        str(record.status),
        record.reason,
        record.error,
    )
    if image is None:
        return (*base, record.series_instance_uid, None, record.sop_instance_uid, *([None] * 14))
    return (
        *base,
        image.series_instance_uid,
        image.study_instance_uid,
        image.sop_instance_uid,
        image.modality,
        image.series_number,
        image.series_description,
        image.image_type,
        image.rows,
        image.columns,
        image.planes,
        *image.normal,
        image.depth_min_mm,
        image.depth_max_mm,
        image.pixel_spacing_mm,
        image.nominal_thickness_mm,
    )


def _record(row: Sequence[Any]) -> FileRecord:
    """A row of ``_COLUMNS``, and when it has one more value, the path of its intact copy."""
    (path, size, mtime, status, reason, error, series, study, sop, modality, number) = row[:11]
    (description, image_type, rows, columns, planes, nx, ny, nz) = row[11:19]
    (depth_min, depth_max, spacing, thickness) = row[19:23]
    image = None
    if status == FileStatus.IMAGE:
        image = ImageAttributes(
            study_instance_uid=study,
            series_instance_uid=series,
            sop_instance_uid=sop,
            modality=modality,
            series_number=number,
            series_description=description,
            image_type=image_type,
            rows=rows,
            columns=columns,
            planes=planes,
            normal=(nx, ny, nz),
            depth_min_mm=depth_min,
            depth_max_mm=depth_max,
            pixel_spacing_mm=spacing,
            nominal_thickness_mm=thickness,
        )
    copy = Path(os.fsdecode(row[23])) if len(row) > 23 and row[23] is not None else None
    return FileRecord(
        Path(os.fsdecode(path)),
        size,
        mtime,
        FileStatus(status),
        reason if copy is None else damaged_copy_reason(reason, copy),
        error,
        None if image is not None else series,
        image,
        sop_instance_uid=None if image is not None else sop,
        intact_copy=copy,
    )


class WorkIndex:
    """The SQLite work index at ``path`` (created if missing; rebuilt if of another schema)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = self._open(path)
        self.generation = int(self._meta("generation"))
        self._unreadable: dict[Path, list[FileRecord]] | None = None  # by folder, this generation

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        schema = None
        if "meta" in tables:
            found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            schema = found[0] if found else None
        if schema != SCHEMA_VERSION:
            if tables:
                logger.info("work index %s has another schema; rebuilding it", path)
            db.executescript(
                "BEGIN; DROP TABLE IF EXISTS files; DROP TABLE IF EXISTS meta; "
                + _SCHEMA
                + " COMMIT;"
            )
        return db

    def _meta(self, key: str) -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> WorkIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- scanning ----------------------------------------------------------------------------

    def scan(
        self,
        root: Path,
        *,
        on_file: Callable[[int], None] | None = None,
        read_headers: HeaderReader = read_headers_here,
        chunk: int = 1,
    ) -> ScanCounts:
        """Catalog every file under ``root`` as a new generation; ``on_file(count)`` after each
        file listed. The files to read go to ``read_headers`` in chunks of ``chunk``."""
        db = self._db
        generation = self.generation + 1
        counts = ScanCounts()

        def unreadable_folder(error: OSError) -> None:
            folder = Path(error.filename or root)
            record = FileRecord(
                folder,
                0,
                0,
                FileStatus.REJECTED,
                f"{folder}: cannot list folder ({error.strerror}); its files were not read",
                type(error).__name__,
            )
            self._put(record, generation)

        def to_read() -> Iterator[list[Path]]:
            paths: list[Path] = []
            for path in iter_files(root, on_error=unreadable_folder):
                counts.files += 1
                if not self._touch(path, generation):
                    paths.append(path)
                    if len(paths) >= chunk:
                        yield paths
                        paths = []
                if counts.files % _COMMIT_EVERY == 0:
                    db.execute("COMMIT")
                    db.execute("BEGIN")
                if on_file is not None:
                    on_file(counts.files)
            if paths:
                yield paths

        db.execute("BEGIN")
        try:
            for records in read_headers(to_read()):
                for record in records:
                    self._put(record, generation)
                    counts.read += 1
            db.execute("UPDATE meta SET value = ? WHERE key = 'generation'", (str(generation),))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.generation = generation
        self._unreadable = None
        counts.reused = counts.files - counts.read
        for status, n in db.execute(
            "SELECT status, COUNT(*) FROM files WHERE seen = ? GROUP BY status", (generation,)
        ):
            setattr(counts, {"image": "images"}.get(status, status), n)
        logger.info(
            "scan: %d files (%d headers read, %d unchanged): %d images, %d skipped, %d rejected",
            counts.files,
            counts.read,
            counts.reused,
            counts.images,
            counts.skipped,
            counts.rejected,
        )
        return counts

    def _touch(self, path: Path, generation: int) -> bool:
        """Mark an unchanged, already cataloged file as seen; False when it must be read."""
        try:
            stat = path.stat()
        except OSError:
            return False  # catalog_file reports why
        cursor = self._db.execute(
            "UPDATE files SET seen = ? WHERE path = ? AND size = ? AND mtime_ns = ?",
            (generation, os.fsencode(path), stat.st_size, stat.st_mtime_ns),
        )
        return cursor.rowcount == 1

    def _put(self, record: FileRecord, generation: int) -> None:
        self._db.execute(_INSERT, _row(record, generation))

    # --- reading the last scan ---------------------------------------------------------------

    def study_count(self) -> int:
        row = self._db.execute(
            "SELECT COUNT(DISTINCT study_uid) FROM files WHERE seen = ? AND status = 'image'",
            (self.generation,),
        ).fetchone()
        return int(row[0])

    def studies(self) -> Iterator[str]:
        """The StudyInstanceUIDs of the last scan's images, in order, a page at a time."""
        last = ""
        while True:
            page = [
                r[0]
                for r in self._db.execute(
                    "SELECT DISTINCT study_uid FROM files WHERE seen = ? AND status = 'image' "
                    "AND study_uid > ? ORDER BY study_uid LIMIT ?",
                    (self.generation, last, _PAGE),
                )
            ]
            yield from page
            if len(page) < _PAGE:
                return
            last = page[-1]

    def study_images(self, study_instance_uid: str) -> list[FileRecord]:
        """The image files of one study (last scan), by path."""
        return [
            _record(r)
            for r in self._db.execute(
                f"SELECT {_COLUMNS} FROM files WHERE study_uid = ? AND seen = ? "
                "AND status = 'image' ORDER BY path",
                (study_instance_uid, self.generation),
            )
        ]

    def damaged(self, series_instance_uids: Sequence[str]) -> list[FileRecord]:
        """Rejected files (last scan) that belong to one of these series (damaged copies with
        their ``intact_copy``)."""
        out: list[FileRecord] = []
        for uid in dict.fromkeys(series_instance_uids):
            out += [
                _record(r)
                for r in self._db.execute(
                    f"SELECT {_COLUMNS}, {_COPY} FROM files WHERE series_uid = ? AND seen = ? "
                    "AND status = 'rejected' ORDER BY path",
                    (uid, self.generation),
                )
            ]
        return out

    def unreadable(self) -> Iterator[FileRecord]:
        """The last scan's files that could not be read at all (permission denied, I/O error),
        by path; nothing is known of their content."""
        cursor = self._db.execute(
            f"SELECT {_COLUMNS} FROM files WHERE series_uid IS NULL AND seen = ? "
            "AND status = 'rejected' AND error = ? ORDER BY path",
            (self.generation, UnreadableFileError.__name__),
        )
        for row in cursor:
            yield _record(row)

    def problems_of(self, images: Sequence[FileRecord]) -> list[FileRecord]:
        """The rejected files that bear on these image files' series: those of the same series
        (:meth:`damaged`) and those of the same folders that could not be read at all
        (:meth:`unreadable`, kept in memory once per scan: there are few)."""
        if self._unreadable is None:
            self._unreadable = {}
            for record in self.unreadable():
                self._unreadable.setdefault(record.path.parent, []).append(record)
        out = self.damaged([r.image.series_instance_uid for r in images if r.image is not None])
        for folder in dict.fromkeys(r.path.parent for r in images):
            out += self._unreadable.get(folder, [])
        return out

    def files(self, status: FileStatus) -> Iterator[FileRecord]:
        """Stream the last scan's files of one status, by path (rejected ones that are damaged
        copies with their ``intact_copy``)."""
        copy = f", {_COPY}" if status is FileStatus.REJECTED else ""
        cursor = self._db.execute(
            f"SELECT {_COLUMNS}{copy} FROM files WHERE seen = ? AND status = ? ORDER BY path",
            (self.generation, str(status)),
        )
        for row in cursor:
            yield _record(row)
