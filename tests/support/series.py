"""Small real DICOM series written with chosen geometry, and volumes built from arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, MRImageStorage, generate_uid


def fixed_uid(*parts: object) -> str:
    """A DICOM UID derived from ``parts`` (always 64 characters): test files are the same bytes
    on every run, so that a cut at a fixed offset always lands in the same place (a random UID
    can be shorter and shift every byte after it)."""
    return str(generate_uid(entropy_srcs=[repr(p) for p in parts]))


@dataclass
class WrittenSeries:
    """What a factory call wrote: files in slice order and the expected HU volume."""

    paths: list[Path]  # in ascending position along the normal
    hu: np.ndarray  # (S, R, C) float32, ascending along the normal
    positions: np.ndarray  # (S, 3) LPS of each slice, ascending along the normal
    row_direction: np.ndarray
    column_direction: np.ndarray
    pixel_spacing: tuple[float, float]
    study_uid: str
    series_uid: str


def make_dataset(
    *,
    position: Sequence[float],
    row_direction: Sequence[float],
    column_direction: Sequence[float],
    pixel_spacing: Sequence[float],
    stored: np.ndarray,
    study_uid: str,
    series_uid: str,
    instance: int,
    slope: float = 1.0,
    intercept: float = -1024.0,
    modality: str = "CT",
    thickness: float | None = 2.5,
    sop_instance_uid: str | None = None,
) -> Dataset:
    """A minimal but valid single-frame CT/MR image dataset (its SOPInstanceUID derived from the
    series, instance number and position unless given)."""
    meta = FileMetaDataset()
    sop_class = CTImageStorage if modality == "CT" else MRImageStorage
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = sop_instance_uid or fixed_uid(
        series_uid, instance, *(float(v) for v in position)
    )
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.PatientID = "TEST-0001"
    ds.PatientName = "Test^Patient"
    ds.StudyDate = "20260101"
    ds.Modality = modality
    ds.SeriesNumber = 3
    ds.SeriesDescription = "test series"
    ds.InstanceNumber = instance
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.ImagePositionPatient = [f"{v:.6f}" for v in position]
    ds.ImageOrientationPatient = [f"{v:.8f}" for v in (*row_direction, *column_direction)]
    ds.PixelSpacing = [f"{v:.6f}" for v in pixel_spacing]
    if thickness is not None:
        ds.SliceThickness = f"{thickness:g}"
    ds.RescaleSlope = f"{slope:g}"
    ds.RescaleIntercept = f"{intercept:g}"
    ds.Rows, ds.Columns = stored.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = 16
    ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    ds.PixelData = stored.astype("<u2").tobytes()
    return ds


SeriesFactory = Callable[..., WrittenSeries]


def read(path: Path) -> Dataset:
    return pydicom.dcmread(path)


def volume_from_array(voxels: np.ndarray, geometry: Any) -> Any:
    """A CT ``Volume`` of ``voxels`` with ``geometry`` and placeholder identifiers."""
    from ingestion.volume import Volume

    return Volume.in_memory(voxels, geometry)
