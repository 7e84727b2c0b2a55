"""Enhanced multi-frame CT/MR: geometry and rescale from the per-frame functional groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, RLELossless

from ingestion import load_path, scan_path

from conftest import fixed_uid

ENHANCED_CT = "1.2.840.10008.5.1.4.1.1.2.1"


def _item(**attrs: object) -> Dataset:
    ds = Dataset()
    for key, value in attrs.items():
        setattr(ds, key, value)
    return ds


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


def test_frames_are_ordered_by_their_positions(tmp_path: Path) -> None:
    hu, order = write_enhanced(tmp_path / "enh.dcm")
    vol = load_path(tmp_path / "enh.dcm").volumes[0]
    by_slice = np.argsort(order)  # frame index at each slice position
    np.testing.assert_array_equal(vol.voxels, hu[by_slice])
    assert vol.identifiers.frame_numbers == tuple(int(f) + 1 for f in by_slice)
    assert len(set(vol.identifiers.sop_instance_uids)) == 1
    assert vol.geometry.origin == pytest.approx((5.0, -3.0, 10.0))
    assert vol.geometry.spacing == pytest.approx((1.5, 0.6, 0.9))


def test_per_frame_rescale_overrides_shared(tmp_path: Path) -> None:
    hu, order = write_enhanced(tmp_path / "enh.dcm", per_frame_rescale=True)
    vol = load_path(tmp_path / "enh.dcm").volumes[0]
    np.testing.assert_allclose(vol.voxels, hu[np.argsort(order)])


def test_missing_frame_position_rejects_the_object(tmp_path: Path) -> None:
    write_enhanced(tmp_path / "enh.dcm", drop_position_of=2)
    (rejected,) = scan_path(tmp_path / "enh.dcm").rejected
    assert "missing PlanePositionSequence (frame 3)" in rejected.reason


def test_frames_with_two_orientations_are_split(tmp_path: Path) -> None:
    axial = [1, 0, 0, 0, 1, 0]
    coronal = [1, 0, 0, 0, 0, -1]
    write_enhanced(
        tmp_path / "enh.dcm",
        order=[0, 1, 2, 0, 1],
        orientations=[axial, axial, axial, coronal, coronal],
    )
    result = load_path(tmp_path / "enh.dcm")
    assert sorted(v.shape[0] for v in result.volumes) == [2, 3]


def test_rle_compressed_multiframe_decodes_each_frame(tmp_path: Path) -> None:
    hu, order = write_enhanced(tmp_path / "enh.dcm")
    ds = pydicom.dcmread(tmp_path / "enh.dcm")
    ds.compress(RLELossless)
    ds.save_as(tmp_path / "rle.dcm")
    (tmp_path / "enh.dcm").unlink()
    vol = load_path(tmp_path / "rle.dcm").volumes[0]
    np.testing.assert_array_equal(vol.voxels, hu[np.argsort(order)])
