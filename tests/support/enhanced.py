"""Enhanced (multi-frame) CT files written for the ingestion tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian

from tests.support.series import fixed_uid


def write_enhanced(
    path: Path,
    *,
    frames: int = 5,
    order: list[int] | None = None,
    rows: int = 6,
    cols: int = 7,
    gap: float = 1.5,
    per_frame_rescale: bool = False,
    drop_position_of: int | None = None,
    orientations: list[list[float]] | None = None,
) -> tuple[np.ndarray, list[int]]:
    """Write an Enhanced CT object whose frame f sits at slice order[f]; return (HU, order)."""
    rng = np.random.default_rng(7)
    order = order if order is not None else [3, 0, 4, 1, 2][:frames]
    stored = rng.integers(0, 4000, size=(frames, rows, cols), dtype=np.uint16)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ENHANCED_CT
    meta.MediaStorageSOPInstanceUID = fixed_uid("enhanced", frames, order, "instance")
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = ENHANCED_CT
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = fixed_uid("enhanced", frames, order, "study")
    ds.SeriesInstanceUID = fixed_uid("enhanced", frames, order, "series")
    ds.Modality = "CT"
    ds.PatientID = "ENH-1"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"]
    ds.Rows, ds.Columns = rows, cols
    ds.NumberOfFrames = frames
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    shared = _item(
        PixelMeasuresSequence=Sequence([_item(PixelSpacing=[0.6, 0.9], SliceThickness=gap)]),
        PlaneOrientationSequence=Sequence([_item(ImageOrientationPatient=[1, 0, 0, 0, 1, 0])]),
        PixelValueTransformationSequence=Sequence(
            [_item(RescaleSlope=1, RescaleIntercept=-1024, RescaleType="HU")]
        ),
    )
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    per_frame = []
    slopes = []
    for f in range(frames):
        item = _item()
        iop = np.asarray(orientations[f] if orientations else [1, 0, 0, 0, 1, 0], float)
        normal = np.cross(iop[:3], iop[3:])
        if f != drop_position_of:
            position = np.array([5.0, -3.0, 10.0]) + gap * order[f] * normal
            item.PlanePositionSequence = Sequence([_item(ImagePositionPatient=list(position))])
        if per_frame_rescale:
            slope = 1.0 + 0.5 * f
            item.PixelValueTransformationSequence = Sequence(
                [_item(RescaleSlope=slope, RescaleIntercept=-1000, RescaleType="HU")]
            )
            slopes.append((slope, -1000.0))
        else:
            slopes.append((1.0, -1024.0))
        if orientations is not None:
            item.PlaneOrientationSequence = Sequence(
                [_item(ImageOrientationPatient=orientations[f])]
            )
        per_frame.append(item)
    ds.PerFrameFunctionalGroupsSequence = Sequence(per_frame)
    ds.PixelData = stored.astype("<u2").tobytes()
    ds.save_as(path, enforce_file_format=True)
    hu = np.stack([stored[f] * s + b for f, (s, b) in enumerate(slopes)]).astype(np.float32)
    return hu, order


ENHANCED_CT = "1.2.840.10008.5.1.4.1.1.2.1"


def _item(**attrs: object) -> Dataset:
    ds = Dataset()
    for key, value in attrs.items():
        setattr(ds, key, value)
    return ds
