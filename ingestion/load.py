"""Turn scanned series, NIfTI and NRRD files into :class:`~ingestion.volume.Volume` objects."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ingestion.dicom.pixels import read_stack_voxels
from ingestion.dicom.stack import SeriesRef
from ingestion.errors import IngestionError, UnreadableFileError
from ingestion.nifti import load_nifti
from ingestion.nrrd import load_nrrd
from ingestion.scan import Rejected, ScanResult, scan_path
from ingestion.volume import Identifiers, Modality, SourceFormat, Volume

__all__ = ["LoadResult", "iter_volumes", "load_path", "load_series"]

logger = logging.getLogger(__name__)


def load_series(ref: SeriesRef) -> Volume:
    """Read the voxels of one ordered DICOM stack.

    Raises:
        PixelDataError: a slice is truncated or cannot be decoded.
    """
    voxels = read_stack_voxels(ref.slices)
    info = ref.info
    series_uid = info.series_instance_uid
    for warning in info.text_warnings:  # names the tag, never the value (no identifiers)
        logger.warning("series %s: %s", series_uid, warning)
    return Volume(
        voxels=voxels,
        geometry=ref.geometry,
        identifiers=Identifiers(
            study_instance_uid=info.study_instance_uid,
            series_instance_uid=series_uid,
            sop_instance_uids=tuple(s.sop_instance_uid for s in ref.slices),
            frame_numbers=tuple(None if s.frame is None else s.frame + 1 for s in ref.slices),
            patient_id=info.patient_id,
            patient_name=info.patient_name,
            study_date=info.study_date,
            series_number=info.series_number,
            series_description=info.series_description,
            stack=ref.part,
        ),
        modality=info.modality,
        source_format=SourceFormat.DICOM,
        sources=tuple(dict.fromkeys(s.path for s in ref.slices)),
        warnings=ref.warnings,
        gantry_tilt_degrees=ref.gantry_tilt_degrees,
    )


@dataclass
class LoadResult:
    """Volumes that loaded, and everything that did not, with reasons."""

    volumes: list[Volume] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


def iter_volumes(
    scanned: ScanResult, nifti_modality: Modality | None = None
) -> Iterator[Volume | Rejected]:
    """Load every series, NIfTI and NRRD file of a scan, one at a time (memory: one volume).

    ``nifti_modality`` is recorded for NIfTI and NRRD files alike (neither stores a modality).
    """
    for ref in scanned.series:
        try:
            yield load_series(ref)
        except IngestionError as exc:
            yield Rejected(ref.slices[0].path, f"series {ref.label}: {exc}")
    files = [(p, load_nifti) for p in scanned.nifti] + [(p, load_nrrd) for p in scanned.nrrd]
    for path, load in files:
        try:
            yield load(path, modality=nifti_modality)
        except IngestionError as exc:
            yield Rejected(path, str(exc))
        except OSError as exc:
            yield Rejected(path, str(UnreadableFileError.from_os_error(path, exc)))


def load_path(path: Path, nifti_modality: Modality | None = None) -> LoadResult:
    """Scan ``path`` (file or folder tree) and load everything loadable."""
    scanned = scan_path(path)
    result = LoadResult(rejected=list(scanned.rejected))
    for item in iter_volumes(scanned, nifti_modality):
        if isinstance(item, Volume):
            result.volumes.append(item)
        else:
            result.rejected.append(item)
    return result
