"""NIfTI: RAS -> LPS, sform/qform choice, and rejections."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ingestion import Geometry, load_nifti, load_path, volume_to_nifti_affine
from ingestion.errors import MissingGeometryError, NotDicomError, UnsupportedObjectError
from ingestion.volume import Modality, SourceFormat


def save(
    path: Path, data: np.ndarray, affine: np.ndarray, *, sform: int = 1, qform: int = 1
) -> Path:
    img = nib.Nifti1Image(data, affine)
    img.set_sform(affine if sform else None, code=sform)
    img.set_qform(affine if qform else None, code=qform)
    nib.save(img, path)
    return path


def test_ras_affine_becomes_lps_in_slice_row_column_order(tmp_path: Path) -> None:
    data = np.arange(4 * 5 * 3, dtype=np.int16).reshape(4, 5, 3)  # (i, j, k)
    affine = np.diag([0.8, 0.9, 2.5, 1.0])
    affine[:3, 3] = [-30.0, -40.0, 12.0]
    vol = load_nifti(save(tmp_path / "a.nii.gz", data, affine))
    assert vol.shape == (3, 5, 4)
    assert vol.voxels[2, 4, 3] == data[3, 4, 2]
    # i grows towards R in RAS = -x in LPS; j towards A = -y; k towards S = +z
    assert vol.geometry.row_direction == pytest.approx((-1.0, 0.0, 0.0))
    assert vol.geometry.column_direction == pytest.approx((0.0, -1.0, 0.0))
    assert vol.geometry.slice_direction == pytest.approx((0.0, 0.0, 1.0))
    assert vol.geometry.origin == pytest.approx((30.0, 40.0, 12.0))
    assert vol.geometry.spacing == pytest.approx((2.5, 0.9, 0.8))
    assert vol.source_format is SourceFormat.NIFTI and vol.modality is None
    assert vol.identifiers.uids_derived and vol.identifiers.study_instance_uid.startswith("2.25.")
    assert vol.identifiers.patient_name is None  # NIfTI records no patient


def test_geometry_round_trips_through_the_writer_affine(tmp_path: Path) -> None:
    g = Geometry(
        origin=(-12.0, 7.5, 99.0),
        row_direction=(0.0, 1.0, 0.0),
        column_direction=(0.0, 0.0, -1.0),
        slice_direction=(-1.0, 0.0, 0.0),
        spacing=(1.25, 0.6, 0.7),
    )
    data = np.zeros((3, 4, 5), np.int16)
    vol = load_nifti(save(tmp_path / "g.nii", data, volume_to_nifti_affine(g)), Modality.MR)
    np.testing.assert_allclose(vol.geometry.affine, g.affine, atol=1e-5)
    assert vol.modality is Modality.MR


def test_sform_preferred_over_qform_and_qform_used_alone(tmp_path: Path) -> None:
    data = np.zeros((2, 2, 2), np.int16)
    s_aff = np.diag([1.0, 1.0, 1.0, 1.0])
    q_aff = np.diag([2.0, 2.0, 2.0, 1.0])
    img = nib.Nifti1Image(data, None)
    img.set_sform(s_aff, code=2)
    img.set_qform(q_aff, code=1)
    nib.save(img, tmp_path / "both.nii")
    vol = load_nifti(tmp_path / "both.nii")
    assert vol.geometry.spacing == pytest.approx((1.0, 1.0, 1.0))
    assert any("sform and qform differ" in w for w in vol.warnings)
    img.set_sform(s_aff, code=0)
    nib.save(img, tmp_path / "q.nii")
    assert load_nifti(tmp_path / "q.nii").geometry.spacing == pytest.approx((2.0, 2.0, 2.0))


def test_no_spatial_transform_is_rejected(tmp_path: Path) -> None:
    path = save(tmp_path / "n.nii", np.zeros((2, 2, 2), np.int16), np.eye(4), sform=0, qform=0)
    with pytest.raises(MissingGeometryError, match="neither sform nor qform"):
        load_nifti(path)


def test_four_d_is_rejected_but_trailing_singleton_accepted(tmp_path: Path) -> None:
    four = save(tmp_path / "4d.nii", np.zeros((3, 3, 3, 2), np.int16), np.eye(4))
    with pytest.raises(UnsupportedObjectError, match="holds 2 volumes"):
        load_nifti(four)
    single = save(tmp_path / "4d1.nii", np.ones((3, 3, 3, 1), np.int16), np.eye(4))
    assert load_nifti(single).shape == (3, 3, 3)


def test_two_d_gets_one_slice(tmp_path: Path) -> None:
    vol = load_nifti(save(tmp_path / "2d.nii", np.ones((4, 3), np.float32), np.eye(4)))
    assert vol.shape == (1, 3, 4)


def test_truncated_and_empty_files(tmp_path: Path) -> None:
    good = save(tmp_path / "g.nii", np.ones((20, 20, 20), np.int16), np.eye(4))
    (tmp_path / "cut.nii").write_bytes(good.read_bytes()[:2000])
    (tmp_path / "empty.nii.gz").write_bytes(b"")
    with pytest.raises(NotDicomError):
        load_nifti(tmp_path / "cut.nii")
    with pytest.raises(NotDicomError, match="empty file"):
        load_nifti(tmp_path / "empty.nii.gz")
    result = load_path(tmp_path)
    assert len(result.volumes) == 1 and len(result.rejected) == 2


def test_complex_data_is_rejected(tmp_path: Path) -> None:
    path = save(tmp_path / "c.nii", np.zeros((2, 2, 2), np.complex64), np.eye(4))
    with pytest.raises(UnsupportedObjectError, match="not a scalar grey value"):
        load_nifti(path)
