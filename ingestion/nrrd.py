"""Read NRRD images (.nrrd, 3D Slicer's default) into volumes in DICOM patient space (LPS).

Read through MONAI's ``NrrdReader`` (pynrrd underneath), with the same contract as
:func:`ingestion.nifti.load_nifti`: one 3-D scalar image, geometry from the file or a rejection.

Geometry: an NRRD names its world frame in the ``space`` field and places axis ``a`` (``a`` fastest
on disk) at ``space origin + index_a * space directions[a]``. MONAI's reader turns that into an
affine over the array axes and, by default (``affine_lps_to_ras=True``), flips it to RAS when the
space is left-posterior-superior **or not named at all** (an unnamed space is assumed LPS), while
leaving any other space as it was: the reported affine's frame depends on the file. radcaliper
therefore asks for the file's own affine (``affine_lps_to_ras=False``) and converts it from the
space the file names: left-posterior-superior (as is), right-anterior-superior (x, y negated) or
left-anterior-superior (y negated); abbreviations (LPS, RAS, LAS) are accepted. A file that names
no space, or a frame not tied to the patient (``scanner-xyz``, ``3D-right-handed``, ...), or lacks
``space directions`` / ``space origin`` is rejected: radcaliper does not guess geometry.

The array is read in NRRD's own axis order ``[i, j, k]`` (``i`` fastest on disk), as nibabel
reads NIfTI; radcaliper's array order is ``[slice, row, column]`` = ``[k, j, i]``. NRRD records
neither the modality nor DICOM UIDs: study and series UIDs are derived from the file's content,
as for NIfTI.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ingestion.errors import (
    InconsistentGeometryError,
    MissingGeometryError,
    NotDicomError,
    UnsupportedObjectError,
)
from ingestion.geometry import Geometry
from ingestion.nifti import _derived_uid, _file_digest
from ingestion.volume import Identifiers, Modality, SourceFormat, Volume

__all__ = ["load_nrrd"]

logger = logging.getLogger(__name__)

# The patient frames an NRRD may name -> the sign flips that take its x, y, z to LPS.
_TO_LPS = {
    "left-posterior-superior": (1.0, 1.0, 1.0),
    "lps": (1.0, 1.0, 1.0),
    "right-anterior-superior": (-1.0, -1.0, 1.0),
    "ras": (-1.0, -1.0, 1.0),
    "left-anterior-superior": (1.0, -1.0, 1.0),
    "las": (1.0, -1.0, 1.0),
}
_SPATIAL_KINDS = frozenset({"domain", "space"})
# (i, j, k) NRRD axis order -> (k, j, i) radcaliper order, as a permutation of affine columns.
_IJK_TO_SRC = [2, 1, 0, 3]


def _value_axes(header: dict[str, Any]) -> list[int]:
    """Axes that hold values rather than positions: no space direction ("none") or a kind
    other than domain / space (vector, RGB-color, list, time, ...)."""
    dimension = int(header["dimension"])
    directions = header.get("space directions")
    kinds = header.get("kinds")
    out = []
    for axis in range(dimension):
        no_direction = directions is not None and not np.all(np.isfinite(directions[axis]))
        kind = str(kinds[axis]).lower() if kinds is not None and axis < len(kinds) else "domain"
        if no_direction or kind not in _SPATIAL_KINDS:
            out.append(axis)
    return out


def _spatial_axes(path: Path, header: dict[str, Any]) -> list[int]:
    """The three spatial axes of a 3-D scalar image, or UnsupportedObjectError saying why not.

    Axes of one value (a vector axis of size 1) are dropped, as NIfTI's trailing axes of size 1."""
    sizes = tuple(int(s) for s in header["sizes"])
    values = _value_axes(header)
    many = [a for a in values if sizes[a] > 1]
    if many:
        kinds = header.get("kinds") or ["none"] * len(sizes)
        raise UnsupportedObjectError(
            f"{path}: image of sizes {sizes} holds {int(np.prod([sizes[a] for a in many]))} "
            f"values per voxel (axis kinds {list(kinds)}); radcaliper needs one scalar 3-D "
            "volume: extract one component first (e.g. SimpleITK's VectorIndexSelectionCast)"
        )
    spatial = [a for a in range(len(sizes)) if a not in values]
    if len(spatial) > 3:
        extra = [sizes[a] for a in spatial[3:] if sizes[a] > 1]
        if extra:
            raise UnsupportedObjectError(
                f"{path}: {len(spatial)}-D image of sizes {sizes} holds "
                f"{int(np.prod(extra))} volumes (time points or other axes); radcaliper needs "
                "one 3-D volume: extract it first (e.g. SimpleITK's image[:, :, :, 0])"
            )
        raise UnsupportedObjectError(
            f"{path}: {len(spatial)}-D image of sizes {sizes}; radcaliper reads 3-D volumes: "
            "save it as a 3-D image"
        )
    if len(spatial) < 3:
        raise UnsupportedObjectError(
            f"{path}: {len(spatial)}-D image of sizes {sizes}; radcaliper needs a 3-D volume "
            "(a single slice records no slice spacing)"
        )
    return spatial


def _space_to_lps(path: Path, header: dict[str, Any]) -> npt.NDArray[np.float64]:
    """The 4x4 matrix taking the file's space to LPS, or MissingGeometryError."""
    space = header.get("space")
    if space is None:
        raise MissingGeometryError(
            f"{path}: the NRRD header names no patient space ('space' field; "
            f"{'only a space dimension' if 'space dimension' in header else 'no space at all'}): "
            "the file does not say how it lies in the patient, and radcaliper does not guess "
            "geometry; save it with space left-posterior-superior (as 3D Slicer does)"
        )
    flips = _TO_LPS.get(str(space).strip().lower())
    if flips is None:
        raise MissingGeometryError(
            f"{path}: NRRD space {space!r} is not a patient frame radcaliper can place "
            "(left-posterior-superior, right-anterior-superior or left-anterior-superior); "
            "radcaliper does not guess geometry: save it in patient space"
        )
    for field in ("space directions", "space origin"):
        if field not in header:
            raise MissingGeometryError(
                f"{path}: the NRRD header has no {field!r}: the file does not say where its "
                "voxels lie in the patient, and radcaliper does not guess geometry"
            )
    return np.diag([*flips, 1.0])


def _read(path: Path) -> Any:
    """MONAI's NrrdReader and the NrrdImage (array, header) it read; NotDicomError if unreadable."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from monai.data.image_reader import NrrdReader  # here: the CLI must not import MONAI

        reader = NrrdReader(dtype=np.float32, index_order="F", affine_lps_to_ras=False)
        try:
            image = reader.read(str(path))
        except Exception as exc:  # pynrrd raises NRRDError, ValueError, OSError, zlib errors
            raise NotDicomError(f"{path}: not a readable NRRD file ({exc})") from exc
    return reader, image


def load_nrrd(path: Path, modality: Modality | None = None) -> Volume:
    """Load a 3-D scalar NRRD image. ``modality`` is recorded as given (NRRD does not store it).

    Raises:
        NotDicomError: empty, truncated or not an NRRD file.
        UnsupportedObjectError: 4-D (several volumes), vector/RGB data, a 2-D image, NaN or
            infinite voxels.
        MissingGeometryError: no named patient space, or no space directions or origin.
        InconsistentGeometryError: a degenerate affine (an axis of zero length).
    """
    path = Path(path)
    if path.stat().st_size == 0:
        raise NotDicomError(f"{path}: empty file (0 bytes)")
    reader, image = _read(path)
    header = dict(image.header)
    spatial = _spatial_axes(path, header)
    to_lps = _space_to_lps(path, header)
    directions = np.asarray(header["space directions"], dtype=np.float64)
    origin = np.asarray(header["space origin"], dtype=np.float64)
    if directions.shape[1:] != (3,) or origin.shape != (3,):
        raise MissingGeometryError(
            f"{path}: space directions {directions.tolist()} / origin {origin.tolist()} are not "
            "3-D vectors: the file does not place its voxels in a 3-D patient space"
        )
    if len(spatial) < len(header["sizes"]):  # drop axes of one value (module doc)
        dropped = tuple(a for a in range(len(header["sizes"])) if a not in spatial)
        image.array = np.squeeze(image.array, axis=dropped)
        image.header = {
            **header,
            "dimension": 3,
            "sizes": np.asarray(header["sizes"])[spatial],
            "space directions": directions[spatial],
        }
        image.header.pop("kinds", None)
    try:
        data, meta = reader.get_data(image)
    except Exception as exc:
        raise NotDicomError(f"{path}: cannot read the voxel data ({exc}); truncated?") from exc
    affine_ijk = to_lps @ np.asarray(meta["affine"], dtype=np.float64)  # LPS over (i, j, k)
    try:
        geometry = Geometry.from_affine(affine_ijk[:, _IJK_TO_SRC])
    except ValueError as exc:
        raise InconsistentGeometryError(f"{path}: unusable space directions ({exc})") from exc
    voxels = np.ascontiguousarray(np.asarray(data, dtype=np.float32).transpose(2, 1, 0))
    if not np.all(np.isfinite(voxels)):
        raise UnsupportedObjectError(
            f"{path}: voxel data contains NaN or infinite values (often the outside of a "
            "resampled image); radcaliper does not invent values: replace them first"
        )
    digest = _file_digest(path)
    n = voxels.shape[0]
    return Volume(
        voxels=voxels,
        geometry=geometry,
        identifiers=Identifiers(
            study_instance_uid=_derived_uid(hashlib.sha256(b"study" + digest).digest()),
            series_instance_uid=_derived_uid(hashlib.sha256(b"series" + digest).digest()),
            sop_instance_uids=(None,) * n,
            frame_numbers=(None,) * n,
            series_description=str(header.get("content", "")).strip(),
            uids_derived=True,
        ),
        modality=modality,
        source_format=SourceFormat.NRRD,
        sources=(path,),
    )
