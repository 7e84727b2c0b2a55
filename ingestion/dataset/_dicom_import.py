"""What the DICOM SEG and SR importers share: finding their files under a source, the index of
the image series they reference, and collecting rows into one ``ImportResult``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ingestion.dataset._series_index import ImageIndex
from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImportProgress,
    ImportResult,
    Provenance,
    Skipped,
    SourceType,
)
from ingestion.errors import ConfigurationError
from ingestion.scan import iter_files

__all__ = ["Collected", "FileImporter", "import_objects"]

logger = logging.getLogger(__name__)


@dataclass
class Collected:
    """What an import found so far: studies by series UID, findings, skipped items."""

    studies: dict[str, DatasetStudy] = field(default_factory=dict)
    findings: list[DatasetFinding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


FileImporter = Callable[[Path, str, ImageIndex, Provenance, Collected], None]
"""Imports one file: (path, its path relative to the source ("" for a file source), the index of
image series, the input's provenance, what was collected so far)."""


def import_objects(
    kind: SourceType,
    source: Path,
    *,
    images: Path | None,
    annotator: str | None,
    licence: str,
    is_object: Callable[[Path], bool],
    name: str,
    import_file: FileImporter,
    on_item: ImportProgress | None = None,
) -> ImportResult:
    """Import every file of ``source`` (a file, or a folder searched recursively) for which
    ``is_object`` holds, with ``import_file``, against the series under ``images`` (default:
    ``source`` when it is a folder, else the file's folder).

    Raises:
        ConfigurationError: ``source`` or ``images`` does not exist.
    """
    source = Path(source).resolve()
    if not source.exists():
        raise ConfigurationError(f"{source}: no such {name} file or folder")
    folder = (
        Path(images).resolve()
        if images is not None
        else (source if source.is_dir() else source.parent)
    )
    if not folder.is_dir():
        raise ConfigurationError(f"{folder}: no such folder of images (give --images)")
    base = Provenance(kind, str(source), "", annotator or "unknown", licence)
    out = Collected()
    files = [p for p in iter_files(source) if is_object(p)]
    if not files:
        reason = (
            f"not a DICOM {name}" if source.is_file() else f"no DICOM {name} file under this folder"
        )
        out.skipped.append(Skipped(kind, base.path, str(source), "", reason))
    index = ImageIndex(folder) if files else ImageIndex.empty(folder)
    for done, path in enumerate(files):
        if on_item is not None:
            on_item(done, len(files), str(path))
        relative = "" if source.is_file() else path.relative_to(source).as_posix()
        import_file(path, relative, index, base, out)
    logger.info(
        "%s import of %s: %d findings, %d series, %d skipped",
        name,
        source,
        len(out.findings),
        len(out.studies),
        len(out.skipped),
    )
    return ImportResult(
        kind,
        base.path,
        tuple(out.studies[uid] for uid in sorted(out.studies)),
        tuple(out.findings),
        tuple(out.skipped),
    )
