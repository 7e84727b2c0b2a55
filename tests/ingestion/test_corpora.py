"""Every file bundled with pydicom and nibabel: a volume whose geometry equals what pydicom /
nibabel report, or a specific rejection that names the file. Never an exception."""

from __future__ import annotations

import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pydicom.data
import pydicom.pixels
import pytest

from ingestion import Volume, load_path
from ingestion.nifti import RAS_TO_LPS


def _corpus(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


PYDICOM_ROOT = Path(pydicom.data.get_testdata_file("CT_small.dcm")).parent  # type: ignore[arg-type]
NIBABEL_ROOT = Path(nib.__file__).parent
PYDICOM_FILES = _corpus(PYDICOM_ROOT)
NIBABEL_FILES = [p for p in _corpus(NIBABEL_ROOT) if "data" in p.parts and p.suffix != ".py"]


def check_dicom_volume(path: Path, vol: Volume) -> None:
    ds = pydicom.dcmread(path)
    g = vol.geometry
    assert vol.shape[0] == 1  # every pydicom sample image is loaded on its own
    np.testing.assert_allclose(g.origin, [float(v) for v in ds.ImagePositionPatient], atol=1e-9)
    iop = np.array([float(v) for v in ds.ImageOrientationPatient])
    np.testing.assert_allclose(g.row_direction, iop[:3] / np.linalg.norm(iop[:3]), atol=1e-9)
    np.testing.assert_allclose(g.column_direction, iop[3:] / np.linalg.norm(iop[3:]), atol=1e-9)
    assert (g.row_spacing, g.column_spacing) == tuple(float(v) for v in ds.PixelSpacing)
    with warnings.catch_warnings():  # pydicom warns about MR_small_padded's excess padding
        warnings.simplefilter("ignore", UserWarning)
        pixels = pydicom.pixels.pixel_array(ds, correct_unused_bits=True)
    slope = float(ds.get("RescaleSlope", 1.0))
    intercept = float(ds.get("RescaleIntercept", 0.0))
    expected = (pixels.astype(np.float64) * slope + intercept).astype(np.float32)
    np.testing.assert_array_equal(vol.voxels[0], expected)


def check_nifti_volume(path: Path, vol: Volume) -> None:
    img = nib.load(path)
    affine_lps = RAS_TO_LPS @ img.affine  # nibabel's affine over (i, j, k)
    # radcaliper index (slice, row, column) = nibabel (k, j, i)
    rng = np.random.default_rng(0)
    ijk = rng.uniform(0, 5, size=(10, 3))
    expected = ijk @ affine_lps[:3, :3].T + affine_lps[:3, 3]
    np.testing.assert_allclose(vol.geometry.index_to_lps(ijk[:, ::-1]), expected, atol=1e-6)
    data = np.asarray(img.dataobj, dtype=np.float32)
    np.testing.assert_array_equal(vol.voxels, data.reshape(data.shape[:3]).transpose(2, 1, 0))


@pytest.mark.parametrize(
    "path", PYDICOM_FILES + NIBABEL_FILES, ids=lambda p: str(p).split("site-packages/")[-1]
)
def test_bundled_file_loads_exactly_or_is_rejected_with_reason(path: Path) -> None:
    result = load_path(path)
    assert result.volumes or result.rejected
    for rejected in result.rejected:
        assert str(path) in rejected.reason or rejected.path == path
        assert len(rejected.reason) > len(str(path)) + 10  # a reason, not just the name
    for vol in result.volumes:
        if path.name.endswith((".nii", ".nii.gz")):
            check_nifti_volume(path, vol)
        else:
            check_dicom_volume(path, vol)


def test_corpora_contain_what_the_claims_rest_on() -> None:
    """The parametrised test above is only meaningful if both kinds of outcome occur."""
    outcomes = {p.name: load_path(p) for p in PYDICOM_FILES + NIBABEL_FILES}
    loaded = {name for name, r in outcomes.items() if r.volumes}
    assert {"CT_small.dcm", "MR_small.dcm", "MR_small_RLE.dcm", "anatomical.nii"} <= loaded
    reasons = " | ".join(r.reason for res in outcomes.values() for r in res.rejected)
    for expected in (
        "DICOMDIR",
        "structured report",
        "segmentation",
        "RT structure set",
        "RT plan",
        "modality RTDOSE",
        "waveform",
        "localizer/scout",
        "truncated pixel data",
        "not a DICOM file",
        "Siemens mosaic",
        "4-D image",
    ):
        assert expected in reasons, expected
