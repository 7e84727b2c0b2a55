"""NRRD (``ingestion.nrrd``): geometry against SimpleITK and NIfTI, space names, rejections, and
NRRD files in scans (``load_path``, ``radcaliper inspect``, the batch catalog)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nrrd
import numpy as np
import numpy.typing as npt
import pytest
import SimpleITK as sitk
from typer.testing import CliRunner

from app.cli import app
from ingestion import Geometry, load_nifti, load_nrrd, load_path
from ingestion.catalog import FileStatus, catalog_file
from ingestion.errors import MissingGeometryError, NotDicomError, UnsupportedObjectError
from ingestion.volume import Modality, SourceFormat

SHAPE = (6, 7, 9)  # (slices, rows, columns)
SEGMENTATION = "a segmentation (label map), not an image: import it with radcaliper dataset import"


def _rotation(degrees: tuple[float, float, float]) -> npt.NDArray[np.float64]:
    """Rotation matrix x-then-y-then-z (extrinsic)."""
    a, b, c = np.radians(degrees)
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return np.asarray(rz @ ry @ rx, dtype=np.float64)


# (ITK direction matrix: columns = LPS directions of i, j, k; spacing of i, j, k; origin LPS)
CASES: dict[str, tuple[npt.NDArray[np.float64], tuple[float, float, float], tuple[float, ...]]] = {
    "axial": (np.eye(3), (0.7, 0.7, 2.5), (-120.0, -140.5, 30.25)),
    "oblique": (_rotation((12.0, -20.0, 35.0)), (0.8, 0.9, 1.5), (10.0, -20.0, 55.5)),
    "anisotropic_flipped": (
        np.array([[0.0, 0.0, -1.0], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]),  # left-handed, sagittal
        (0.45, 1.3, 5.0),
        (80.0, -33.3, 12.0),
    ),
}


def _voxels(seed: int) -> npt.NDArray[np.int16]:
    return np.random.default_rng(seed).integers(-1000, 2000, size=SHAPE).astype(np.int16)


def _itk_image(case: str, seed: int = 0) -> Any:
    direction, spacing, origin = CASES[case]
    image = sitk.GetImageFromArray(_voxels(seed))  # numpy (k, j, i) = (slice, row, column)
    image.SetDirection(tuple(float(v) for v in direction.ravel()))
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    return image


@pytest.mark.parametrize("case", sorted(CASES))
def test_geometry_and_voxels_equal_nifti_and_simpleitk(case: str, tmp_path: Path) -> None:
    image = _itk_image(case)
    sitk.WriteImage(image, str(tmp_path / "a.nrrd"))
    sitk.WriteImage(image, str(tmp_path / "a.nii.gz"))
    from_nrrd = load_nrrd(tmp_path / "a.nrrd", Modality.MR)
    from_nifti = load_nifti(tmp_path / "a.nii.gz")
    assert from_nrrd.shape == SHAPE
    np.testing.assert_array_equal(from_nrrd.voxels, from_nifti.voxels)
    np.testing.assert_array_equal(from_nrrd.voxels, _voxels(0).astype(np.float32))
    np.testing.assert_allclose(from_nrrd.affine, from_nifti.affine, atol=1e-6)
    for s, r, c in [(0, 0, 0), (5, 0, 0), (0, 6, 0), (0, 0, 8), (3, 2, 7)]:  # ITK: (i, j, k)
        expected = image.TransformIndexToPhysicalPoint((c, r, s))  # LPS, as DICOM
        np.testing.assert_allclose(from_nrrd.geometry.index_to_lps([s, r, c]), expected, atol=1e-6)
    assert from_nrrd.source_format is SourceFormat.NRRD and from_nrrd.modality is Modality.MR
    ids = from_nrrd.identifiers
    assert ids.uids_derived and ids.study_instance_uid.startswith("2.25.")
    assert ids.sop_instance_uids == (None,) * SHAPE[0]
    again = load_nrrd(tmp_path / "a.nrrd")
    assert again.identifiers.series_instance_uid == ids.series_instance_uid


def _write(path: Path, data: npt.NDArray[Any], header: dict[str, Any]) -> Path:
    nrrd.write(str(path), data, header)
    return path


def _lps_ijk(geometry: Geometry) -> npt.NDArray[np.float64]:
    return np.asarray(geometry.affine[:, [2, 1, 0, 3]], dtype=np.float64)  # LPS over (i, j, k)


GEOMETRY = Geometry(
    origin=(15.0, -7.5, 40.0),
    row_direction=tuple(_rotation((0.0, 0.0, 20.0))[:, 0]),
    column_direction=tuple(_rotation((0.0, 0.0, 20.0))[:, 1]),
    slice_direction=(0.0, 0.0, 1.0),
    spacing=(3.0, 0.6, 0.75),
)


@pytest.mark.parametrize(
    ("space", "flips"),
    [
        ("left-posterior-superior", (1, 1, 1)),
        ("right-anterior-superior", (-1, -1, 1)),
        ("RAS", (-1, -1, 1)),
        ("left-anterior-superior", (1, -1, 1)),
    ],
)
def test_every_patient_space_gives_the_same_lps_geometry(
    space: str, flips: tuple[int, int, int], tmp_path: Path
) -> None:
    """The file's space is converted to LPS (MONAI's own LPS -> RAS flip is not applied)."""
    affine = np.diag([*flips, 1]) @ _lps_ijk(GEOMETRY)  # in the file's space
    data = _voxels(1).transpose(2, 1, 0)  # (i, j, k)
    header = {"space": space, "space directions": affine[:3, :3].T, "space origin": affine[:3, 3]}
    volume = load_nrrd(_write(tmp_path / "a.nrrd", data, header))
    np.testing.assert_allclose(volume.affine, GEOMETRY.affine, atol=1e-9)
    np.testing.assert_array_equal(volume.voxels, _voxels(1).astype(np.float32))


def test_an_axis_of_one_value_is_dropped(tmp_path: Path) -> None:
    lps = _lps_ijk(GEOMETRY)
    data = _voxels(2).transpose(2, 1, 0)[np.newaxis]  # (1, i, j, k): one vector component
    directions = np.vstack([np.full(3, np.nan), lps[:3, :3].T])
    header = {
        "space": "left-posterior-superior",
        "space directions": directions,
        "space origin": lps[:3, 3],
        "kinds": ["vector", "domain", "domain", "domain"],
    }
    volume = load_nrrd(_write(tmp_path / "a.nrrd", data, header))
    np.testing.assert_allclose(volume.affine, GEOMETRY.affine, atol=1e-9)
    np.testing.assert_array_equal(volume.voxels, _voxels(2).astype(np.float32))


def test_four_d_vector_and_two_d_images_are_refused(tmp_path: Path) -> None:
    four_d = tmp_path / "t.nrrd"
    sitk.WriteImage(sitk.Image([9, 7, 6, 5], sitk.sitkInt16), str(four_d))
    with pytest.raises(UnsupportedObjectError, match=r"holds 5 volumes.*extract it first"):
        load_nrrd(four_d)
    vector = tmp_path / "v.nrrd"
    rgb = np.zeros((*SHAPE, 3), np.float32)
    sitk.WriteImage(sitk.GetImageFromArray(rgb, isVector=True), str(vector))
    with pytest.raises(UnsupportedObjectError, match=r"3 values per voxel.*extract one"):
        load_nrrd(vector)
    flat = tmp_path / "f.nrrd"
    sitk.WriteImage(sitk.GetImageFromArray(np.zeros((7, 9), np.int16)), str(flat))
    with pytest.raises(UnsupportedObjectError, match="2-D image"):
        load_nrrd(flat)


def test_missing_space_information_is_refused(tmp_path: Path) -> None:
    data = _voxels(3).transpose(2, 1, 0)
    lps = _lps_ijk(GEOMETRY)
    full: dict[str, Any] = {"space directions": lps[:3, :3].T, "space origin": lps[:3, 3]}
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "names no patient space"),
        # directions in an unnamed space: MONAI would assume LPS; radcaliper does not
        ({**full, "space dimension": 3}, "names no patient space"),
        ({**full, "space": "scanner-xyz"}, "not a patient frame"),
        ({"space": "left-posterior-superior", "space directions": lps[:3, :3].T}, "'space origin'"),
    ]
    for number, (header, words) in enumerate(cases):
        path = _write(tmp_path / f"{number}.nrrd", data, header)
        with pytest.raises(MissingGeometryError, match=words):
            load_nrrd(path)


def test_unreadable_and_non_finite_files_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "e.nrrd"
    empty.write_bytes(b"")
    with pytest.raises(NotDicomError, match="empty file"):
        load_nrrd(empty)
    junk = tmp_path / "j.nrrd"
    junk.write_text("not an NRRD header\n")
    with pytest.raises(NotDicomError, match="not a readable NRRD file"):
        load_nrrd(junk)
    data = _voxels(4).astype(np.float32)
    data[2, 3, 4] = np.nan
    image = sitk.GetImageFromArray(data)
    sitk.WriteImage(image, str(tmp_path / "n.nrrd"))
    with pytest.raises(UnsupportedObjectError, match="NaN or infinite"):
        load_nrrd(tmp_path / "n.nrrd")


@pytest.fixture
def slicer_folder(tmp_path: Path) -> Path:
    """An image.nrrd with its labels.seg.nrrd beside it, as 3D Slicer saves them."""
    folder = tmp_path / "case"
    folder.mkdir()
    sitk.WriteImage(_itk_image("oblique", seed=5), str(folder / "image.nrrd"))
    labels = sitk.GetImageFromArray((_voxels(5) > 1500).astype(np.uint8))
    labels.CopyInformation(_itk_image("oblique", seed=5))
    sitk.WriteImage(labels, str(folder / "labels.seg.nrrd"))
    return folder


def test_load_path_loads_the_image_and_leaves_out_the_segmentation(slicer_folder: Path) -> None:
    loaded = load_path(slicer_folder, nifti_modality=Modality.CT)
    (volume,) = loaded.volumes
    assert volume.source_format is SourceFormat.NRRD and volume.modality is Modality.CT
    assert volume.sources == (slicer_folder / "image.nrrd",)
    np.testing.assert_array_equal(volume.voxels, _voxels(5).astype(np.float32))
    (rejected,) = loaded.rejected
    assert rejected.path == slicer_folder / "labels.seg.nrrd"
    assert SEGMENTATION in rejected.reason


@pytest.mark.parametrize("headers_only", [False, True])
def test_inspect_reports_an_nrrd_series(slicer_folder: Path, headers_only: bool) -> None:
    argv = ["inspect", str(slicer_folder), "--json"] + (["--headers-only"] if headers_only else [])
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (series,) = report["series"]
    assert series["source_format"] == "nrrd" and series["modality"] is None
    assert series["dimensions"] == {"rows": 7, "columns": 9, "slices": 6}
    assert series["spacing_mm"] == {"row": 0.9, "column": 0.8, "slice": 1.5}
    assert series["origin_lps_mm"] == [10.0, -20.0, 55.5]
    (rejected,) = report["rejected"]
    assert rejected["path"].endswith("labels.seg.nrrd") and SEGMENTATION in rejected["reason"]


def test_batch_catalog_skips_nrrd_files(slicer_folder: Path) -> None:
    image = catalog_file(slicer_folder / "image.nrrd")
    segmentation = catalog_file(slicer_folder / "labels.seg.nrrd")
    assert image.status is FileStatus.SKIPPED and "NRRD file; batch measures DICOM" in image.reason
    assert segmentation.status is FileStatus.SKIPPED and SEGMENTATION in segmentation.reason
