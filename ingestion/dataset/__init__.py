"""Datasets of true findings from real annotations: one format (``format``), importers from
label maps, DICOM SEG, DICOM SR TID 1500, readers' measurements (``reads``) and phantoms,
RECIST truth from masks (``recist``), and one patient-level split of every dataset the project
uses (``split``). Training, calibration and evaluation read the format (README "Datasets").

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
        ImportProgress,
        ImportResult,
        Label,
        MaskRef,
        Provenance,
        Read,
        Skipped,
        SourceType,
        TrueFinding,
        finding_id,
        read_dataset,
        write_import,
    )
    from ingestion.dataset.label_file import read_label_file
    from ingestion.dataset.masks import findings_from_labels, import_masks
    from ingestion.dataset.phantoms import import_phantoms
    from ingestion.dataset.reads import import_reads
    from ingestion.dataset.recist import LesionAxes, VesselSection, lesion_axes, vessel_sections
    from ingestion.dataset.seg import import_seg
    from ingestion.dataset.split import Side, patient_of, select_side, side_of
    from ingestion.dataset.sr import ValueLimits, import_sr

_SOURCES = {
    "ingestion.dataset.format": (
        "FORMAT_NAME",
        "FORMAT_VERSION",
        "Dataset",
        "DatasetFinding",
        "DatasetStudy",
        "ImageRef",
        "ImportProgress",
        "ImportResult",
        "Label",
        "MaskRef",
        "Provenance",
        "Read",
        "Skipped",
        "SourceType",
        "TrueFinding",
        "finding_id",
        "read_dataset",
        "write_import",
    ),
    "ingestion.dataset.label_file": ("read_label_file",),
    "ingestion.dataset.masks": ("findings_from_labels", "import_masks"),
    "ingestion.dataset.phantoms": ("import_phantoms",),
    "ingestion.dataset.reads": ("import_reads",),
    "ingestion.dataset.recist": (
        "LesionAxes",
        "VesselSection",
        "lesion_axes",
        "vessel_sections",
    ),
    "ingestion.dataset.seg": ("import_seg",),
    "ingestion.dataset.split": ("Side", "patient_of", "select_side", "side_of"),
    "ingestion.dataset.sr": ("ValueLimits", "import_sr"),
}
__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Dataset",
    "DatasetFinding",
    "DatasetStudy",
    "ImageRef",
    "ImportProgress",
    "ImportResult",
    "Label",
    "LesionAxes",
    "MaskRef",
    "Provenance",
    "Read",
    "Side",
    "Skipped",
    "SourceType",
    "TrueFinding",
    "ValueLimits",
    "VesselSection",
    "finding_id",
    "findings_from_labels",
    "import_masks",
    "import_phantoms",
    "import_reads",
    "import_seg",
    "import_sr",
    "lesion_axes",
    "patient_of",
    "read_dataset",
    "read_label_file",
    "select_side",
    "side_of",
    "vessel_sections",
    "write_import",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
