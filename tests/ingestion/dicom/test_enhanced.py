"""Enhanced multi-frame CT/MR: geometry and rescale from the per-frame functional groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import RLELossless

from ingestion import load_path, scan_path

from tests.support.enhanced import write_enhanced


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
