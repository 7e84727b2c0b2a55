"""What `radcaliper inspect` reports: a plain, JSON-ready description of each series."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ingestion import (
    Geometry,
    Modality,
    Rejected,
    ScanResult,
    SeriesRef,
    Volume,
    iter_volumes,
)

if TYPE_CHECKING:
    from ingestion.geometry import PlaneLabel

__all__ = [
    "InspectReport",
    "SeriesDescription",
    "describe_series_ref",
    "describe_volume",
    "inspect_path_report",
    "inspect_scan",
]


class Dimensions(TypedDict):
    rows: int
    columns: int
    slices: int


class Spacing(TypedDict):
    row: float
    column: float
    slice: float


class Orientation(TypedDict):
    plane: PlaneLabel
    row_direction: list[float]
    column_direction: list[float]
    slice_direction: list[float]


class GeometryDescription(TypedDict):
    dimensions: Dimensions
    spacing_mm: Spacing
    orientation: Orientation
    origin_lps_mm: list[float]
    tilt_degrees: float


class SeriesDescription(GeometryDescription):
    """One series as ``inspect`` reports it."""

    study_instance_uid: str
    series_instance_uid: str
    patient_id: str | None
    study_date: str | None
    series_number: int | None
    description: str
    modality: str | None
    source_format: str
    files: int
    warnings: list[str]


class RejectedFile(TypedDict):
    path: str
    reason: str


class InspectReport(TypedDict):
    """What ``inspect`` reports: the series found under ``path`` and the files left out."""

    path: str
    series: list[SeriesDescription]
    rejected: list[RejectedFile]


def _round(values: tuple[float, ...] | list[float], digits: int = 6) -> list[float]:
    return [round(float(v), digits) + 0.0 for v in values]


def _geometry(
    geometry: Geometry, rows: int, columns: int, slices: int, tilt: float | None
) -> GeometryDescription:
    """``tilt``: the gantry tilt signed as its GantryDetectorTilt tag; None: the unsigned size."""
    return {
        "dimensions": {"rows": rows, "columns": columns, "slices": slices},
        "spacing_mm": {
            "row": round(geometry.row_spacing, 6),
            "column": round(geometry.column_spacing, 6),
            "slice": round(geometry.slice_spacing, 6),
        },
        "orientation": {
            "plane": geometry.plane,
            "row_direction": _round(geometry.row_direction),
            "column_direction": _round(geometry.column_direction),
            "slice_direction": _round(geometry.slice_direction),
        },
        "origin_lps_mm": _round(geometry.origin, 4),
        "tilt_degrees": round(geometry.tilt_degrees if tilt is None else tilt, 3) + 0.0,
    }


def describe_volume(volume: Volume) -> SeriesDescription:
    """JSON-ready description of a loaded volume."""
    ids = volume.identifiers
    s, r, c = volume.shape
    return {
        "study_instance_uid": ids.study_instance_uid,
        "series_instance_uid": ids.series_instance_uid,
        "patient_id": ids.patient_id,
        "study_date": ids.study_date,
        "series_number": ids.series_number,
        "description": ids.series_description,
        "modality": volume.modality.value if isinstance(volume.modality, Modality) else None,
        "source_format": volume.source_format.value,
        "files": len(volume.sources),
        **_geometry(volume.geometry, r, c, s, volume.gantry_tilt_degrees),
        "warnings": list(volume.warnings),
    }


def describe_series_ref(ref: SeriesRef) -> SeriesDescription:
    """JSON-ready description of a DICOM stack from its headers alone (no pixels read)."""
    info = ref.info
    first = ref.slices[0]
    return {
        "study_instance_uid": info.study_instance_uid,
        "series_instance_uid": info.series_instance_uid,
        "patient_id": info.patient_id,
        "study_date": info.study_date,
        "series_number": info.series_number,
        "description": info.series_description,
        "modality": info.modality.value,
        "source_format": "dicom",
        "files": len({s.path for s in ref.slices}),
        **_geometry(
            ref.geometry, first.rows, first.columns, len(ref.slices), ref.gantry_tilt_degrees
        ),
        "warnings": list(ref.warnings),
    }


def _rejected(items: list[Rejected]) -> list[RejectedFile]:
    return [{"path": str(r.path), "reason": r.reason} for r in items]


def inspect_scan(
    scanned: ScanResult,
    *,
    read_pixels: bool,
    path: Path,
    nifti_modality: Modality | None = None,
) -> InspectReport:
    """Build the inspect report; with ``read_pixels`` every series is fully loaded (without,
    DICOM series are described from their headers; NIfTI and NRRD files are always read)."""
    series: list[SeriesDescription] = []
    rejected = list(scanned.rejected)
    to_load = scanned
    if not read_pixels:
        series = [describe_series_ref(ref) for ref in scanned.series]
        to_load = ScanResult(nifti=scanned.nifti, nrrd=scanned.nrrd)
    for item in iter_volumes(to_load, nifti_modality):
        if isinstance(item, Volume):
            series.append(describe_volume(item))
        else:
            rejected.append(item)
    return {"path": str(path), "series": series, "rejected": _rejected(rejected)}


def inspect_path_report(
    path: Path, *, read_pixels: bool = True, nifti_modality: Modality | None = None
) -> InspectReport:
    """Scan ``path`` and report what would be ingested."""
    from ingestion import scan_path

    return inspect_scan(
        scan_path(path), read_pixels=read_pixels, path=path, nifti_modality=nifti_modality
    )
