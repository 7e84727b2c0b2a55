"""Turn a :class:`~ingestion.volume.Volume` into model images at a fixed mm per pixel.

Pipeline stage ``prepare``: one MONAI ``Compose`` of dictionary transforms on ``"image"`` that
training and inference share (:func:`build_preparation`), fed by :func:`volume_to_dict`, and the
one-call :func:`prepare_volume` that returns a :class:`PreparedVolume` whose affine maps every
prepared voxel back to DICOM patient space (LPS, mm). :func:`crop_volume` resamples a volume onto
any small grid in patient space (the measurer's crops) the same way: trilinear through the full
affine, air outside, with MONAI's ``Resample`` (see ``ingestion/_prepare/crop.py``).

Coordinate conventions (read before touching the transforms)
-------------------------------------------------------------
- radcaliper: ``Geometry.affine`` maps ``(slice, row, column)`` indices to **LPS** mm.
- MONAI: ``MetaTensor.affine`` maps the spatial indices of a channel-first array to a world
  whose orientation letters (``Orientationd`` axcodes, ``Spacingd(diagonal=True)``) follow
  nibabel, i.e. **RAS** unless the tensor's ``meta["space"]`` says ``"LPS"``.
- :func:`volume_to_dict` converts explicitly: ``affine_ras = LPS_TO_RAS @ geometry.affine``
  (``diag(-1, -1, 1, 1)``, its own inverse), keeps the array axes as they are (MONAI's affine is
  over whatever axes the array has) and records ``meta["space"] = "RAS"``.
- The prepared volume is in the canonical axial radiological orientation, MONAI axcodes
  ``"SPL"``: slice index grows inferior -> superior, row index anterior -> posterior, column
  index patient right -> left (the image's left edge is the patient's right). In LPS the prepared
  direction matrix is ``[[0, 0, 1], [0, 1, 0], [1, 0, 0]]`` (columns: slice -> +z, row -> +y,
  column -> +x): standard axial DICOM, ImageOrientationPatient ``[1, 0, 0, 0, 1, 0]``.
  :attr:`PreparedVolume.affine_lps` is that LPS affine, converted back from MONAI's RAS.

The transforms (``build_preparation``), in order
------------------------------------------------
1. ``EnsureChannelFirstd`` / ``EnsureTyped``: (1, S, R, C) float32 ``MetaTensor`` (a no-op for
   :func:`volume_to_dict` output; also accepts MONAI ``LoadImaged`` output).
2. ``Orientationd("RAS")``: flips/permutes only, so that the axis nearest the patient's z comes
   last (its spacing is the "native slice spacing" used when ``slice_mm`` is ``None``).
3. ``Spacingd(diagonal=True)``, bilinear, between two ``ShiftIntensityd``: resamples onto a grid
   aligned with the patient axes at (pixel_mm, pixel_mm, slice_mm or native). This handles oblique
   acquisitions and **gantry tilt (shear)** exactly: MONAI samples the source through its full
   affine (``inv(source) @ target``), shear included, and the output grid is orthogonal. The
   shift makes MONAI's zero padding equal :attr:`PrepareConfig.pad_value` HU (air).
   An axis-aligned volume already at the target spacing is not interpolated at all.
4. ``Orientationd("SPL")``: flips/permutes the axis-aligned grid into the canonical orientation.
5. ``augmentations`` passed to :func:`build_preparation` (none by default; training adds random
   transforms here, in HU on the prepared grid; MONAI's spatial ones update the affine).
6. :class:`SelectSlicesd`: ``PrepareConfig.slices`` / ``slice_stride`` on the resampled slices.
7. ``ResizeWithPadOrCropd``: in-plane pad (with ``pad_value`` HU) or crop around the centre.
8. ``ScaleIntensityRanged`` per window, clipped to [0, 1] (several windows: ``CopyItemsd``, one
   ``ScaleIntensityRanged`` per copy, ``ConcatItemsd`` into channels, ``DeleteItemsd``).

Windowing comes last so that interpolation happens on HU values (edges stay where they are)
and several windows cost one resampling. The pipeline is deterministic.

Known limits: MONAI sizes the resampled grid as ``round(extent / spacing) + 1``, so the outermost
prepared slices (and rows/columns) may lie up to half a target voxel beyond the source and are
blended with air there. An oblique volume is resampled over its whole axis-aligned bounding box
(then cropped to ``size`` in-plane), which costs memory for large, strongly rotated series.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

# Imported from the defining modules: MONAI's package __init__ files do not re-export explicitly.
from monai.data.meta_tensor import MetaTensor
from monai.transforms.compose import Compose
from monai.transforms.croppad.dictionary import ResizeWithPadOrCropd
from monai.transforms.intensity.dictionary import ScaleIntensityRanged, ShiftIntensityd
from monai.transforms.spatial.dictionary import Orientationd, Spacingd
from monai.transforms.utility.dictionary import (
    ConcatItemsd,
    CopyItemsd,
    DeleteItemsd,
    EnsureChannelFirstd,
    EnsureTyped,
)
from monai.utils.enums import MetaKeys, SpaceKeys

from ingestion._prepare.config import (
    BONE_WINDOW,
    LUNG_WINDOW,
    SOFT_TISSUE_WINDOW,
    PrepareConfig,
    Window,
)
from ingestion._prepare.crop import crop_volume
from ingestion._prepare.slices import SelectSlicesd, resolve_slice_indices, select_slices
from ingestion.errors import PreparationError
from ingestion.geometry import Geometry
from ingestion.volume import Volume

__all__ = [
    "BONE_WINDOW",
    "CANONICAL_AXCODES",
    "IMAGE_KEY",
    "LPS_TO_RAS",
    "LUNG_WINDOW",
    "SOFT_TISSUE_WINDOW",
    "SOURCE_AFFINE_KEY",
    "SOURCE_SHAPE_KEY",
    "PrepareConfig",
    "PreparedVolume",
    "SelectSlicesd",
    "Window",
    "build_preparation",
    "crop_volume",
    "prepare_volume",
    "resolve_slice_indices",
    "select_slices",
    "volume_to_dict",
]

logger = logging.getLogger(__name__)

IMAGE_KEY = "image"
"""Dictionary key of the image: (1, S, R, C) from :func:`volume_to_dict`, (C, S', R', C') after."""
SOURCE_AFFINE_KEY = "source_affine_lps"
"""Dictionary key of the source volume's 4x4 LPS affine over (slice, row, column)."""
SOURCE_SHAPE_KEY = "source_shape"
"""Dictionary key of the source volume's (slices, rows, columns)."""

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
"""Flips x and y: LPS <-> RAS world coordinates (the matrix is its own inverse)."""
CANONICAL_AXCODES = "SPL"
"""MONAI/nibabel axcodes of the prepared (slice, row, column) axes: toward S, P and L."""

# Orientation letters for the intermediate, patient-axis-aligned grid (see step 2 above).
_RESAMPLING_AXCODES = "RAS"
# A single slice can only be prepared when it lies in one axial plane: the z of its corners may
# differ by at most this much (mm); more would blend the slice with padding when resampled.
_FLAT_SLICE_TOLERANCE_MM = 0.05


# -- dictionaries -------------------------------------------------------------------------------
def volume_to_dict(volume: Volume) -> dict[str, Any]:
    """The dictionary :func:`build_preparation` expects, made from ``volume`` (not mutated).

    Returns:
        ``{"image": MetaTensor (1, S, R, C) float32 with RAS affine over (slice, row, column),
        "source_affine_lps": (4, 4) float64, "source_shape": (3,) int64}``. The voxels are copied,
        so transforms can never write into ``volume``. The image's ``meta`` also holds
        ``space="RAS"``, ``original_affine`` (RAS), ``original_channel_dim=0`` and
        ``filename_or_obj`` (the first source file).
    """
    affine_lps = np.array(volume.affine, dtype=np.float64)  # (4, 4)
    affine_ras = torch.as_tensor(LPS_TO_RAS @ affine_lps, dtype=torch.float64)
    voxels = torch.from_numpy(np.array(volume.voxels, dtype=np.float32, copy=True))  # (S, R, C)
    image = MetaTensor(
        voxels[None],  # (1, S, R, C)
        affine=affine_ras,
        meta={
            MetaKeys.SPACE: SpaceKeys.RAS.value,
            MetaKeys.ORIGINAL_AFFINE: affine_ras.clone(),
            MetaKeys.ORIGINAL_CHANNEL_DIM: 0,
            MetaKeys.SPATIAL_SHAPE: np.asarray(volume.shape),
            "filename_or_obj": str(volume.sources[0]),
        },
    )
    return {
        IMAGE_KEY: image,
        SOURCE_AFFINE_KEY: affine_lps,
        SOURCE_SHAPE_KEY: np.asarray(volume.shape, dtype=np.int64),
    }


def _window_transforms(config: PrepareConfig) -> list[Callable[..., Any]]:
    """Map each (level, width) window to [0, 1], clipped; several windows become channels."""

    def scale(key: str, window: Window) -> ScaleIntensityRanged:
        level, width = window
        return ScaleIntensityRanged(
            keys=key,
            a_min=level - width / 2.0,
            a_max=level + width / 2.0,
            b_min=0.0,
            b_max=1.0,
            clip=True,
            dtype=np.float32,
        )

    windows = config.channel_windows
    if len(windows) == 1:
        return [scale(IMAGE_KEY, windows[0])]
    names = [f"{IMAGE_KEY}_window{i}" for i in range(len(windows))]
    return [
        CopyItemsd(keys=IMAGE_KEY, times=len(windows), names=names),
        *(scale(name, window) for name, window in zip(names, windows, strict=True)),
        ConcatItemsd(keys=names, name=IMAGE_KEY, dim=0),  # (C, S', R', C')
        DeleteItemsd(keys=names),
    ]


def build_preparation(
    config: PrepareConfig, *, augmentations: Sequence[Callable[..., Any]] = ()
) -> Compose:
    """The shared MONAI pipeline: ``{"image": (1, S, R, C)}`` -> ``{"image": (C, S', R', C')}``.

    The input image must be a ``MetaTensor`` whose affine maps its spatial indices to RAS mm
    (or LPS with ``meta["space"] == "LPS"``), as :func:`volume_to_dict` and MONAI's
    ``LoadImaged`` make. Other keys pass through untouched. See the module docstring for the
    steps and conventions.

    Args:
        config: spacing, size, windows and slice selection.
        augmentations: dictionary transforms (e.g. MONAI ``Rand*d``) run on the resampled,
            canonically oriented HU image before slice selection, pad/crop and windowing.
            Training passes them; inference passes none, so that preparation is deterministic.

    Returns:
        A ``Compose``; calling it on a dictionary returns a new dictionary (the input is not
        mutated). A missing key raises ``KeyError`` naming the key and the transform (wrapped
        by ``Compose`` in a ``RuntimeError``).
    """
    keys = IMAGE_KEY
    pad = config.pad_value
    pixdim = (config.pixel_mm, config.pixel_mm, config.slice_mm or 0.0)  # RAS order; 0 = keep
    return Compose(
        [
            EnsureChannelFirstd(keys=keys, strict_check=True),
            EnsureTyped(keys=keys, data_type="tensor", dtype=torch.float32, track_meta=True),
            Orientationd(keys=keys, axcodes=_RESAMPLING_AXCODES, labels=None),
            ShiftIntensityd(keys=keys, offset=-pad),  # padding value 0 <-> `pad` HU
            Spacingd(
                keys=keys,
                pixdim=pixdim,
                diagonal=True,
                mode="bilinear",
                padding_mode="zeros",
                align_corners=False,
                dtype=np.float32,
            ),
            ShiftIntensityd(keys=keys, offset=pad),
            Orientationd(keys=keys, axcodes=CANONICAL_AXCODES, labels=None),  # (1, S', R', C')
            *augmentations,
            SelectSlicesd(keys=keys, slices=config.slices, stride=config.slice_stride),
            ResizeWithPadOrCropd(
                keys=keys, spatial_size=(-1, *config.size), mode="constant", value=pad
            ),
            *_window_transforms(config),  # (C, S', R', C') in [0, 1]
        ],
        lazy=False,
    )


# -- the prepared volume ------------------------------------------------------------------------
def _affine_lps(image: MetaTensor) -> npt.NDArray[np.float64]:
    """The LPS affine of a ``MetaTensor`` whose affine is RAS unless ``meta["space"]`` is LPS."""
    affine = np.asarray(image.affine.detach().cpu().numpy(), dtype=np.float64)
    space = image.meta.get(MetaKeys.SPACE, SpaceKeys.RAS.value)
    if SpaceKeys(space) == SpaceKeys.LPS:
        return affine
    return np.asarray(LPS_TO_RAS @ affine, dtype=np.float64)


def _nearest_source_slices(
    affine_lps: npt.NDArray[np.float64],
    shape: tuple[int, int, int],
    source_affine_lps: npt.NDArray[np.float64],
    source_slices: int,
) -> tuple[int, ...]:
    """For each prepared slice, the source slice nearest to its in-plane centre."""
    n, rows, columns = shape
    centres = np.stack(
        [np.arange(n, dtype=np.float64), np.full(n, (rows - 1) / 2), np.full(n, (columns - 1) / 2)],
        axis=1,
    )  # (S', 3) prepared indices
    lps = centres @ affine_lps[:3, :3].T + affine_lps[:3, 3]  # (S', 3)
    source = (lps - source_affine_lps[:3, 3]) @ np.linalg.inv(source_affine_lps[:3, :3]).T
    nearest = np.clip(np.floor(source[:, 0] + 0.5), 0, source_slices - 1).astype(np.int64)
    return tuple(int(i) for i in nearest)


def _required(data: Mapping[Any, Any], key: str) -> Any:
    if key not in data:
        raise KeyError(
            f"Key `{key}` of PreparedVolume.from_dict was missing in the data; pass the "
            "dictionary that volume_to_dict made, after build_preparation"
        )
    return data[key]


@dataclass(frozen=True, eq=False)
class PreparedVolume:
    """Model images of one volume, with the exact way back to patient space.

    Args:
        image: float32 (C, S', R', C') in [0, 1]; one channel per window, slices in canonical
            axial orientation (see :mod:`ingestion.prepare`).
        affine_lps: (4, 4): prepared ``(slice, row, column)`` index -> LPS mm.
        source_slice_indices: for each prepared slice, the index of the source slice nearest to
            its in-plane centre (clipped to the source), to name a SOP instance via
            ``volume.identifiers.sop_instance_uids``.
        config: the configuration it was prepared with.
    """

    image: torch.Tensor
    affine_lps: npt.NDArray[np.float64]
    source_slice_indices: tuple[int, ...]
    config: PrepareConfig
    _geometry: Geometry = field(init=False, repr=False)

    def __post_init__(self) -> None:
        image = self.image
        if not isinstance(image, torch.Tensor) or image.ndim != 4:
            shape = tuple(getattr(image, "shape", ()))
            raise ValueError(f"image must be a 4-D tensor (C, S, R, C), got shape {shape}")
        if image.dtype != torch.float32:
            raise ValueError(f"image must be float32, got {image.dtype}")
        if image.shape[0] != self.config.channels:
            raise ValueError(
                f"image has {image.shape[0]} channels but config has {self.config.channels} windows"
            )
        affine = np.array(self.affine_lps, dtype=np.float64)
        if affine.shape != (4, 4) or not np.all(np.isfinite(affine)):
            raise ValueError(f"affine_lps must be a finite 4x4 matrix, got shape {affine.shape}")
        affine.setflags(write=False)
        object.__setattr__(self, "affine_lps", affine)
        object.__setattr__(self, "_geometry", Geometry.from_affine(affine))
        indices = tuple(int(i) for i in self.source_slice_indices)
        if len(indices) != image.shape[1]:
            raise ValueError(
                f"source_slice_indices has {len(indices)} entries for {image.shape[1]} slices"
            )
        object.__setattr__(self, "source_slice_indices", indices)

    @classmethod
    def from_dict(cls, data: Mapping[Any, Any], config: PrepareConfig) -> PreparedVolume:
        """Collect the output of ``build_preparation(config)`` applied to ``volume_to_dict(v)``."""
        image = _required(data, IMAGE_KEY)
        if not isinstance(image, MetaTensor) or image.ndim != 4:
            raise TypeError(
                f"data[{IMAGE_KEY!r}] must be a (C, S, R, C) MetaTensor, got "
                f"{type(image).__name__} of shape {tuple(getattr(image, 'shape', ()))}"
            )
        source_affine = np.asarray(_required(data, SOURCE_AFFINE_KEY), dtype=np.float64)
        source_shape = np.asarray(_required(data, SOURCE_SHAPE_KEY)).reshape(-1)
        affine_lps = _affine_lps(image)
        spatial = (int(image.shape[1]), int(image.shape[2]), int(image.shape[3]))
        indices = _nearest_source_slices(affine_lps, spatial, source_affine, int(source_shape[0]))
        tensor = image.as_tensor().to(torch.float32).contiguous()  # (C, S', R', C')
        return cls(image=tensor, affine_lps=affine_lps, source_slice_indices=indices, config=config)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(slices, rows, columns) of the prepared image."""
        return (int(self.image.shape[1]), int(self.image.shape[2]), int(self.image.shape[3]))

    @property
    def geometry(self) -> Geometry:
        """The prepared grid as a :class:`~ingestion.geometry.Geometry` (spacing, directions)."""
        return self._geometry

    def index_to_lps(self, index: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Map ``(..., 3)`` prepared (slice, row, column) indices (fractional allowed) to LPS mm."""
        return self._geometry.index_to_lps(index)

    def lps_to_index(self, points: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Map ``(..., 3)`` LPS points (mm) to fractional prepared (slice, row, column) indices."""
        return self._geometry.lps_to_index(points)


# -- one call -----------------------------------------------------------------------------------
def _describe(volume: Volume) -> str:
    return f"series {volume.identifiers.series_instance_uid} ({volume.sources[0]})"


def _check_preparable(volume: Volume, config: PrepareConfig) -> None:
    """Raise :class:`PreparationError` for volumes the pipeline cannot turn into model images."""
    if not np.all(np.isfinite(volume.voxels)):
        raise PreparationError(
            f"{_describe(volume)}: voxels contain NaN or infinite values; fix or drop the series"
        )
    n_slices, rows, columns = volume.shape
    if n_slices > 1:
        return
    if config.slice_mm is not None:
        raise PreparationError(
            f"{_describe(volume)}: the volume has a single slice, so there is nothing to "
            f"resample between slices at slice_mm={config.slice_mm}; use slice_mm=None"
        )
    corners = np.array(
        [[0, r, c] for r in (0, rows - 1) for c in (0, columns - 1)], dtype=np.float64
    )  # (4, 3)
    z_spread = float(np.ptp(volume.geometry.index_to_lps(corners)[:, 2]))
    if z_spread > _FLAT_SLICE_TOLERANCE_MM:
        raise PreparationError(
            f"{_describe(volume)}: a single {volume.geometry.plane} slice (tilted {z_spread:.2f} "
            "mm in z across the image) cannot be reformatted into axial slices; "
            "load the whole series"
        )


def _root_cause(exc: BaseException) -> BaseException:
    """The exception MONAI's ``Compose`` wrapped (it re-raises as ``RuntimeError`` from it)."""
    while isinstance(exc, RuntimeError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def prepare_volume(volume: Volume, config: PrepareConfig) -> PreparedVolume:
    """Run :func:`build_preparation` on ``volume`` (not mutated) and collect the result.

    Raises:
        PreparationError: non-finite voxels; a single slice when ``slice_mm`` is set or when it
            is not an axial plane; a slice selection the resampled volume cannot satisfy (index
            out of range, unevenly spaced after resolving negatives); any other value MONAI
            rejects while preparing.
    """
    _check_preparable(volume, config)
    data = volume_to_dict(volume)
    try:
        out = build_preparation(config)(data)
    except (RuntimeError, ValueError) as exc:
        cause = _root_cause(exc)
        if isinstance(cause, ValueError):
            raise PreparationError(f"{_describe(volume)}: cannot prepare: {cause}") from exc
        raise
    prepared = PreparedVolume.from_dict(out, config)
    logger.debug(
        "prepared %s: %s at %s mm -> %s at %s mm, %d channel(s)",
        _describe(volume),
        volume.shape,
        tuple(round(s, 3) for s in volume.geometry.spacing),
        prepared.shape,
        tuple(round(s, 3) for s in prepared.geometry.spacing),
        config.channels,
    )
    return prepared
