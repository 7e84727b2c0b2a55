"""Datasets of true findings from real annotations: one format (``format``), importers from
label maps, DICOM SEG, DICOM SR TID 1500 and phantoms, and RECIST truth from masks
(``recist``). Training, calibration and evaluation read the format (README "Datasets").

Names are served lazily (PEP 562), as in ``ingestion``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from ingestion.dataset.format import (
        FORMAT_NAME,
        FORMAT_VERSION,
        Dataset,
        DatasetFinding,
        DatasetStudy,
        ImageRef,
        ImportResult,
        Label,
        Provenance,
        Skipped,
        SourceType,
        TrueFinding,
        finding_id,
        read_dataset,
        write_import,
    )

_SOURCES = {
    "ingestion.dataset.format": (
        "FORMAT_NAME",
        "FORMAT_VERSION",
        "Dataset",
        "DatasetFinding",
        "DatasetStudy",
        "ImageRef",
        "ImportResult",
        "Label",
        "Provenance",
        "Skipped",
        "SourceType",
        "TrueFinding",
        "finding_id",
        "read_dataset",
        "write_import",
    ),
}
__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Dataset",
    "DatasetFinding",
    "DatasetStudy",
    "ImageRef",
    "ImportResult",
    "Label",
    "Provenance",
    "Skipped",
    "SourceType",
    "TrueFinding",
    "finding_id",
    "read_dataset",
    "write_import",
]

__getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
