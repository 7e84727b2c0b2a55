"""Write a :class:`Phantom` as a DICOM series (one file per slice) or as one NIfTI file."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from pathlib import Path

import nibabel as nib
import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import UID, CTImageStorage, ExplicitVRLittleEndian
from pydicom.valuerep import format_number_as_ds

from ingestion.nifti import volume_to_nifti_affine
from ingestion.phantoms.truth import Phantom, derived_uid

__all__ = ["write_dicom", "write_nifti"]

logger = logging.getLogger(__name__)

RESCALE_INTERCEPT = -1024
_UINT16_MAX = 65535
_IMPLEMENTATION_CLASS_UID = derived_uid("implementation-class")
_IMPLEMENTATION_VERSION = "RADCALIPER_PH1"
_SERIES_DESCRIPTION = "radcaliper phantom"
_NAME_SALT = 0x4E414D45  # separates the file-name stream from the content stream of a seed


def _ds(value: float) -> str:
    """A decimal string of at most 16 characters (DICOM DS)."""
    return format_number_as_ds(float(value))


def _study_date(seed: int) -> str:
    """A deterministic study date in 2020-2024 derived from the seed."""
    days = int.from_bytes(hashlib.sha256(f"date/{seed}".encode()).digest()[:4], "big") % 1827
    return (dt.date(2020, 1, 1) + dt.timedelta(days=days)).strftime("%Y%m%d")


def _file_names(seed: int, count: int) -> list[str]:
    """``count`` distinct random names (16 hex characters + .dcm), deterministic for ``seed``."""
    rng = np.random.default_rng([seed, _NAME_SALT])
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < count:
        name = rng.bytes(8).hex() + ".dcm"
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def _series_template(phantom: Phantom) -> Dataset:
    """Attributes shared by every slice of the series."""
    g = phantom.geometry
    date = _study_date(phantom.seed)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = CTImageStorage
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.ImplementationClassUID = UID(_IMPLEMENTATION_CLASS_UID)
    ds.file_meta.ImplementationVersionName = _IMPLEMENTATION_VERSION
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.SOPClassUID = CTImageStorage
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = date
    ds.StudyTime = ds.SeriesTime = ds.ContentTime = "120000"
    ds.AccessionNumber = ""
    ds.Modality = "CT"
    ds.Manufacturer = "radcaliper"
    ds.ReferringPhysicianName = ""
    ds.SeriesDescription = _SERIES_DESCRIPTION
    ds.PatientName = phantom.patient_id.replace("-", "^", 1)
    ds.PatientID = phantom.patient_id
    ds.PatientBirthDate = ""
    ds.PatientSex = "O"
    ds.KVP = ""
    ds.StudyInstanceUID = phantom.study_instance_uid
    ds.SeriesInstanceUID = phantom.series_instance_uid
    ds.StudyID = "1"
    ds.SeriesNumber = 1
    ds.AcquisitionNumber = 1
    ds.FrameOfReferenceUID = derived_uid(phantom.seed, "frame-of-reference")
    ds.PositionReferenceIndicator = ""
    ds.ImageOrientationPatient = [_ds(v) for v in (*g.row_direction, *g.column_direction)]
    ds.PixelSpacing = [_ds(g.row_spacing), _ds(g.column_spacing)]
    ds.SliceThickness = _ds(g.slice_spacing)
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = phantom.shape[1], phantom.shape[2]
    ds.BitsAllocated = 16
    ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    ds.WindowCenter = "40"
    ds.WindowWidth = "400"
    ds.RescaleIntercept = str(RESCALE_INTERCEPT)
    ds.RescaleSlope = "1"
    ds.RescaleType = "HU"
    ds.BurnedInAnnotation = "NO"
    return ds


def write_dicom(phantom: Phantom, out_dir: Path) -> list[Path]:
    """Write one CT Image Storage file per slice into ``out_dir`` (created if missing).

    Explicit VR little endian, 16-bit unsigned, stored = HU + 1024 clipped to [0, 65535]
    (RescaleIntercept -1024, RescaleSlope 1). File names are random hex strings drawn from the
    phantom's seed: they carry no slice order (ImagePositionPatient does; InstanceNumber too).

    Returns:
        The written paths, in slice order.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    g = phantom.geometry
    stored = np.clip(phantom.hu.astype(np.int32) - RESCALE_INTERCEPT, 0, _UINT16_MAX)
    stored = stored.astype("<u2")  # (S, R, C)
    ds = _series_template(phantom)
    names = _file_names(phantom.seed, phantom.shape[0])
    positions = g.index_to_lps(
        np.stack(
            [np.arange(phantom.shape[0]), np.zeros(phantom.shape[0]), np.zeros(phantom.shape[0])], 1
        )
    )  # (S, 3): centre of voxel [k, 0, 0]
    paths: list[Path] = []
    for k, (name, uid) in enumerate(zip(names, phantom.sop_instance_uids, strict=True)):
        ds.file_meta.MediaStorageSOPInstanceUID = UID(uid)
        ds.SOPInstanceUID = uid
        ds.InstanceNumber = k + 1
        ds.ImagePositionPatient = [_ds(v) for v in positions[k]]
        ds.SliceLocation = _ds(positions[k][2])
        ds.PixelData = stored[k].tobytes()
        path = out_dir / name
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    logger.debug("wrote %d DICOM slices to %s", len(paths), out_dir)
    return paths


def write_nifti(phantom: Phantom, path: Path) -> Path:
    """Write the voxels as int16 HU (no scaling) to a ``.nii`` / ``.nii.gz`` file.

    The affine is RAS over (i, j, k) = (column, row, slice), from
    :func:`ingestion.nifti.volume_to_nifti_affine`; sform and qform are both set with code 1
    (scanner). Parent folders are created.

    Raises:
        ValueError: ``path`` does not end in .nii or .nii.gz.
    """
    name = path.name.lower()
    if not (name.endswith(".nii") or name.endswith(".nii.gz")):
        raise ValueError(f"path must end in .nii or .nii.gz, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    affine = volume_to_nifti_affine(phantom.geometry)
    img = nib.Nifti1Image(phantom.hu.transpose(2, 1, 0), affine)  # (S, R, C) -> (i, j, k)
    img.header.set_data_dtype(np.int16)
    img.header.set_xyzt_units(xyz="mm")
    img.header["descrip"] = _SERIES_DESCRIPTION.encode()
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    nib.save(img, str(path))
    logger.debug("wrote NIfTI %s", path)
    return path
