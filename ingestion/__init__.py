"""Ingestion: DICOM series, NIfTI and NRRD files into :class:`Volume` objects with exact geometry.

Pipeline stage 1 of radcaliper (see README "Architecture"): ``scan`` groups files into series
and rejects what cannot be measured (never raising for a bad file), ``load_*`` reads voxels, and
``prepare`` (MONAI) turns volumes into model inputs.

Names are served lazily (PEP 562) so that importing one submodule, e.g. ``ingestion.errors``
from the command line, does not pay for numpy/pydicom/nibabel, let alone MONAI and torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from ingestion.catalog import FileRecord, FileStatus, ImageAttributes, catalog_file
    from ingestion.contrast import Contrast, contrast_of
    from ingestion.dicom.stack import SeriesRef
    from ingestion.errors import (
        AccessDeniedError,
        ConfigurationError,
        InconsistentGeometryError,
        IngestionError,
        MissingGeometryError,
        ModelError,
        NotDicomError,
        NothingToExportError,
        NoUsableSeriesError,
        PixelDataError,
        PreparationError,
        RadcaliperError,
        SchemaVersionError,
        StaleEditError,
        StorageError,
        UnreadableFileError,
        UnsupportedObjectError,
    )
    from ingestion.geometry import Geometry
    from ingestion.load import LoadResult, iter_volumes, load_path, load_series
    from ingestion.nifti import load_nifti, nifti_affine_to_lps, volume_to_nifti_affine
    from ingestion.nrrd import load_nrrd
    from ingestion.phantoms import (
        Phantom,
        PhantomSpec,
        TruthFinding,
        generate_phantom,
        write_phantoms,
    )
    from ingestion.prepare import (
        PrepareConfig,
        PreparedVolume,
        SelectSlicesd,
        build_preparation,
        prepare_volume,
        select_slices,
        volume_to_dict,
    )
    from ingestion.scan import Rejected, ScanResult, scan_path
    from ingestion.selection import (
        Note,
        NoteKind,
        SelectionRules,
        SeriesCandidate,
        StudyPlan,
        plan_study,
    )
    from ingestion.volume import Identifiers, Modality, SourceFormat, Volume
    from ingestion.work_index import ScanCounts, WorkIndex

_SOURCES = {
    "ingestion.catalog": ("FileRecord", "FileStatus", "ImageAttributes", "catalog_file"),
    "ingestion.contrast": ("Contrast", "contrast_of"),
    "ingestion.errors": (
        "AccessDeniedError",
        "ConfigurationError",
        "InconsistentGeometryError",
        "IngestionError",
        "MissingGeometryError",
        "ModelError",
        "NoUsableSeriesError",
        "NotDicomError",
        "NothingToExportError",
        "PixelDataError",
        "PreparationError",
        "RadcaliperError",
        "SchemaVersionError",
        "StaleEditError",
        "StorageError",
        "UnreadableFileError",
        "UnsupportedObjectError",
    ),
    "ingestion.geometry": ("Geometry",),
    "ingestion.load": ("LoadResult", "iter_volumes", "load_path", "load_series"),
    "ingestion.nifti": ("load_nifti", "nifti_affine_to_lps", "volume_to_nifti_affine"),
    "ingestion.nrrd": ("load_nrrd",),
    "ingestion.phantoms": (
        "Phantom",
        "PhantomSpec",
        "TruthFinding",
        "generate_phantom",
        "write_phantoms",
    ),
    "ingestion.prepare": (
        "PrepareConfig",
        "PreparedVolume",
        "SelectSlicesd",
        "build_preparation",
        "prepare_volume",
        "select_slices",
        "volume_to_dict",
    ),
    "ingestion.scan": ("Rejected", "ScanResult", "scan_path"),
    "ingestion.selection": (
        "Note",
        "NoteKind",
        "SelectionRules",
        "SeriesCandidate",
        "StudyPlan",
        "plan_study",
    ),
    "ingestion.dicom.stack": ("SeriesRef",),
    "ingestion.volume": ("Identifiers", "Modality", "SourceFormat", "Volume"),
    "ingestion.work_index": ("ScanCounts", "WorkIndex"),
}
__all__ = [
    "AccessDeniedError",
    "ConfigurationError",
    "Contrast",
    "FileRecord",
    "FileStatus",
    "Geometry",
    "Identifiers",
    "ImageAttributes",
    "InconsistentGeometryError",
    "IngestionError",
    "LoadResult",
    "MissingGeometryError",
    "Modality",
    "ModelError",
    "NoUsableSeriesError",
    "NotDicomError",
    "Note",
    "NoteKind",
    "NothingToExportError",
    "Phantom",
    "PhantomSpec",
    "PixelDataError",
    "PreparationError",
    "PrepareConfig",
    "PreparedVolume",
    "RadcaliperError",
    "Rejected",
    "ScanCounts",
    "ScanResult",
    "SchemaVersionError",
    "SelectSlicesd",
    "SelectionRules",
    "SeriesCandidate",
    "SeriesRef",
    "SourceFormat",
    "StaleEditError",
    "StorageError",
    "StudyPlan",
    "TruthFinding",
    "UnreadableFileError",
    "UnsupportedObjectError",
    "Volume",
    "WorkIndex",
    "build_preparation",
    "catalog_file",
    "contrast_of",
    "generate_phantom",
    "iter_volumes",
    "load_nifti",
    "load_nrrd",
    "load_path",
    "load_series",
    "nifti_affine_to_lps",
    "plan_study",
    "prepare_volume",
    "scan_path",
    "select_slices",
    "volume_to_dict",
    "volume_to_nifti_affine",
    "write_phantoms",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
