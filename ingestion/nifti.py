"""Read NIfTI-1/2 files (.nii, .nii.gz) into volumes in DICOM patient space (LPS).

NIfTI's world space is RAS; LPS flips the first two axes. Its voxel array is ``[i, j, k]`` with
``i`` fastest on disk; radcaliper's array order is ``[slice, row, column]`` = ``[k, j, i]``.
The affine is the sform when ``sform_code > 0``, else the qform when ``qform_code > 0`` (what
nibabel reports as ``img.affine``); a file with neither is rejected: its position in the patient
is unknown and radcaliper does not guess geometry.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ingestion.errors import (
    InconsistentGeometryError,
    MissingGeometryError,
    NotDicomError,
    UnsupportedObjectError,
)
from ingestion.geometry import Geometry
from ingestion.volume import Identifiers, Modality, SourceFormat, Volume

__all__ = ["RAS_TO_LPS", "load_nifti", "nifti_affine_to_lps", "volume_to_nifti_affine"]

logger = logging.getLogger(__name__)

RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])
# (i, j, k) NIfTI index order -> (k, j, i) radcaliper order, as a permutation of affine columns.
_IJK_TO_SRC = [2, 1, 0, 3]


def nifti_affine_to_lps(affine_ras: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """NIfTI RAS affine over (i, j, k) -> LPS affine over (slice, row, column) = (k, j, i)."""
    mat = RAS_TO_LPS @ np.asarray(affine_ras, dtype=np.float64)
    return np.asarray(mat[:, _IJK_TO_SRC], dtype=np.float64)


def volume_to_nifti_affine(geometry: Geometry) -> npt.NDArray[np.float64]:
    """Inverse of :func:`nifti_affine_to_lps`: the RAS affine over (i, j, k) for writing."""
    mat = geometry.affine[
        :, _IJK_TO_SRC
    ]  # (k, j, i) -> (i, j, k): the permutation is its own inverse
    return np.asarray(RAS_TO_LPS @ mat, dtype=np.float64)


def _derived_uid(digest: bytes) -> str:
    """A DICOM UID under the 2.25 root (ISO/IEC 9834-8) from 128 bits of a digest."""
    return "2.25." + str(int.from_bytes(digest[:16], "big"))


def _file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def load_nifti(path: Path, modality: Modality | None = None) -> Volume:
    """Load a 3-D NIfTI file. ``modality`` is recorded as given (NIfTI does not store it).

    Raises:
        NotDicomError: empty, truncated or not a NIfTI file.
        UnsupportedObjectError: 4-D (several volumes), vector/complex/RGB data.
        MissingGeometryError: neither sform nor qform set.
        InconsistentGeometryError: a degenerate affine.
    """
    import nibabel as nib  # imported here: `radcaliper inspect` on DICOM need not pay for it

    if path.stat().st_size == 0:
        raise NotDicomError(f"{path}: empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img = nib.load(str(path))
    except Exception as exc:  # nibabel raises several types for bad files
        raise NotDicomError(f"{path}: not a readable NIfTI file ({exc})") from exc
    if not isinstance(img, nib.Nifti1Image | nib.Nifti2Image):
        raise UnsupportedObjectError(f"{path}: {type(img).__name__} is not NIfTI-1/2")
    header = img.header
    shape = tuple(int(s) for s in img.shape)
    extra = [s for s in shape[3:] if s != 1]
    if extra:
        raise UnsupportedObjectError(
            f"{path}: {len(shape)}-D image of shape {shape} holds {int(np.prod(extra))} "
            "volumes (time points or vector components); radcaliper needs one 3-D volume: "
            "extract it first (e.g. nibabel's image.slicer[..., 0])"
        )
    dtype = header.get_data_dtype()
    if dtype.fields is not None or np.issubdtype(dtype, np.complexfloating):
        raise UnsupportedObjectError(f"{path}: data type {dtype} is not a scalar grey value")
    sform, sform_code = header.get_sform(coded=True)
    qform, qform_code = header.get_qform(coded=True)
    affine = sform if sform_code else qform if qform_code else None
    if affine is None:
        raise MissingGeometryError(
            f"{path}: neither sform nor qform is set (both codes 0): the file does not say "
            "where it lies in the patient, and radcaliper does not guess geometry"
        )
    try:
        geometry = Geometry.from_affine(nifti_affine_to_lps(affine))
    except ValueError as exc:
        raise InconsistentGeometryError(f"{path}: unusable affine ({exc})") from exc
    try:
        data = np.asarray(img.dataobj, dtype=np.float32)
    except Exception as exc:
        raise NotDicomError(f"{path}: cannot read the voxel data ({exc}); truncated?") from exc
    data = data.reshape(shape[:3] + (1,) * (3 - len(shape[:3])))  # 2-D files get one slice
    voxels = np.ascontiguousarray(data.transpose(2, 1, 0))  # (i, j, k) -> (S, R, C)
    if not np.all(np.isfinite(voxels)):
        raise UnsupportedObjectError(
            f"{path}: voxel data contains NaN or infinite values (often the outside of a "
            "resampled image); radcaliper does not invent values: replace them first"
        )
    digest = _file_digest(path)
    study_uid = _derived_uid(hashlib.sha256(b"study" + digest).digest())
    series_uid = _derived_uid(hashlib.sha256(b"series" + digest).digest())
    n = voxels.shape[0]
    warnings_out: list[str] = []
    if sform_code and qform_code and not np.allclose(sform, qform, atol=1e-3):
        warnings_out.append("sform and qform differ; the sform was used (as nibabel does)")
    return Volume(
        voxels=voxels,
        geometry=geometry,
        identifiers=Identifiers(
            study_instance_uid=study_uid,
            series_instance_uid=series_uid,
            sop_instance_uids=(None,) * n,
            frame_numbers=(None,) * n,
            series_description=str(header.get("descrip", b"").astype(str)).strip(),
            uids_derived=True,
        ),
        modality=modality,
        source_format=SourceFormat.NIFTI,
        sources=(path,),
        warnings=tuple(warnings_out),
    )
