"""Model image inputs for Qwen2.5-VL: patches, find images and measure crops.

- :func:`patchify` / :func:`patchify_frames`: images in [0, 1] -> ``pixel_values`` and
  ``image_grid_thw``, exactly as transformers' ``Qwen2VLImageProcessor`` (``do_resize=False``,
  ``do_rescale=False``, OpenAI CLIP mean/std, patch 14, temporal patch 2, merge 2) lays them out.
- :func:`image_token_count`: how many ``<|image_pad|>`` tokens those images take.
- :func:`find_images`: ``K`` evenly spread slices of a :class:`~ingestion.prepare.PreparedVolume`
  with the way from their pixels to LPS and back (:class:`FindImages`).
- :func:`crop_around`: an axial crop at a chosen mm per pixel around an LPS point, resampled
  from the HU volume through its full geometry by ``ingestion.prepare.crop_volume`` (MONAI),
  then windowed (:class:`Crop`).

Conventions
-----------
- Pixel coordinates are voxel-centre indices: pixel ``(row, column)`` covers
  ``[row - 0.5, row + 0.5] x [column - 0.5, column + 0.5]``; fractional values are allowed.
- Find images and crops are in ``ingestion.prepare``'s canonical axial orientation: rows run
  anterior -> posterior (+y), columns patient right -> left (+x), frames/slices inferior ->
  superior (+z). The LPS affines map ``(frame or slice, row, column)`` to mm.
- Normalisation: ``(x - IMAGE_MEAN) / IMAGE_STD`` per channel, OpenAI CLIP's values, which are
  Qwen2.5-VL's own (its ``preprocessor_config.json``): a pretrained vision tower sees what it
  was trained on, and the stock processor given our [0, 1] images gives identical inputs.
- Channels: the patch embedding takes 3; a one-window image is repeated to 3 channels (as an
  RGB conversion of a grey image would), a three-window image is used as is.
  :func:`contrast_channels` is the other choice, for vision towers trained from scratch (the
  default model): ``(w, 1 - w, 0.5)``. Qwen2.5-VL's patch embedding has no bias and every block
  starts with an RMSNorm, so a uniform grey patch ``p = a 1`` embeds to ``a W 1``, which
  normalises to the same vector for every ``a > 0``; after CLIP's mean/std only the small
  differences between the three channels' constants tell grey levels apart (levels 0.55 and 0.9
  reach the first block with cosine similarity ~0.98). The absolute brightness of flat regions
  (a vessel's lumen, a lesion's interior) is then nearly invisible to the first block. With the
  inverted and the constant channel the direction of ``W p`` moves with ``a`` (similarity
  ~0.6). On phantom crops (unnormalised grey vs these channels) this was the difference between
  a tiny model that did not learn vessel diameters in 800 steps and one at 0.8 mm mean error
  after 300.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from ingestion.geometry import Geometry
from model.measurer.inputs.settings import MERGE, PATCH, SIDE_MULTIPLE, _finite, hu_window

if TYPE_CHECKING:
    # Types only: importing ingestion.prepare at run time would import MONAI (seconds).
    from ingestion.prepare import PreparedVolume, Window
    from ingestion.volume import Volume

__all__ = [
    "AIR_HU",
    "CHANNELS",
    "IMAGE_MEAN",
    "IMAGE_STD",
    "MERGE",
    "PATCH",
    "SIDE_MULTIPLE",
    "TEMPORAL_PATCH",
    "Crop",
    "FindImages",
    "contrast_channels",
    "crop_around",
    "find_images",
    "find_slice_indices",
    "hu_window",
    "image_token_count",
    "native_slice_mm",
    "patchify",
    "patchify_frames",
    "two_window_channels",
]

TEMPORAL_PATCH = 2
"""Frames per patch; a still image is repeated over it."""
CHANNELS = 3
"""Channels the patch embedding expects."""
IMAGE_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
"""Per-channel mean subtracted from [0, 1] images (OpenAI CLIP, Qwen2.5-VL's processor)."""
IMAGE_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
"""Per-channel standard deviation images are divided by (OpenAI CLIP)."""
AIR_HU = -1000.0
"""HU given to crop pixels outside the volume."""

_F64 = npt.NDArray[np.float64]


# -- checks -------------------------------------------------------------------------------------
def _positive(name: str, value: object) -> float:
    if not _finite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if number <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return number


def _count(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return number


def _check_side(name: str, value: int) -> None:
    if value < SIDE_MULTIPLE or value % SIDE_MULTIPLE:
        below = max(SIDE_MULTIPLE, value // SIDE_MULTIPLE * SIDE_MULTIPLE)
        above = max(SIDE_MULTIPLE, (value // SIDE_MULTIPLE + 1) * SIDE_MULTIPLE)
        hint = f"{below}" if below == above else f"{below} or {above}"
        raise ValueError(
            f"{name} must be a positive multiple of {SIDE_MULTIPLE} (PATCH * MERGE) so that the "
            f"image splits into whole merged patches, got {value}; use {hint}"
        )


def _point(name: str, value: object) -> tuple[float, float, float]:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be three finite numbers (LPS mm), got {value!r}") from None
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be three finite numbers (LPS mm), got {value!r}")
    return (float(arr[0]), float(arr[1]), float(arr[2]))


def _windows(value: object) -> tuple[tuple[float, float], ...]:
    """One (level, width) window, or a non-empty sequence of them, as a tuple of windows."""
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        if all(isinstance(v, Sequence) and not isinstance(v, str) for v in value):
            return tuple(hu_window(f"window[{i}]", v) for i, v in enumerate(value))
        return (hu_window("window", value),)
    raise ValueError(f"window must be (level, width) or a sequence of them, got {value!r}")


def _check_pixels(name: str, images: object, ndim: int, layout: str) -> torch.Tensor:
    """A float32 tensor with ``ndim`` dims, 1 or 3 channels at dim -3, sides multiples of 28,
    values in [0, 1]."""
    if not isinstance(images, torch.Tensor) or images.ndim != ndim:
        shape = tuple(getattr(images, "shape", ()))
        raise ValueError(f"{name} must be a {ndim}-D tensor {layout}, got shape {shape}")
    if images.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {images.dtype}; use .float()")
    channels, height, width = (int(n) for n in images.shape[-3:])
    if channels not in (1, CHANNELS):
        raise ValueError(
            f"{name} must have 1 or {CHANNELS} channels (one window, or three), got {channels}"
        )
    _check_side(f"{name} height", height)
    _check_side(f"{name} width", width)
    if images.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(images.shape)}")
    low, high = torch.aminmax(images)
    if not (bool(low >= 0.0) and bool(high <= 1.0)):
        raise ValueError(
            f"{name} must hold values in [0, 1] (windowed images), got min {float(low):g} and "
            f"max {float(high):g}; window or rescale them first"
        )
    return images


def contrast_channels(images: torch.Tensor) -> torch.Tensor:
    """(..., 1, H, W) one-window images in [0, 1] -> (..., 3, H, W) ``(w, 1 - w, 0.5)``.

    See the module doc ("Channels") for why a tower trained from scratch needs this.
    """
    if not isinstance(images, torch.Tensor) or images.ndim < 3 or images.shape[-3] != 1:
        shape = tuple(getattr(images, "shape", ()))
        raise ValueError(f"images must be (..., 1, H, W) one-window images, got shape {shape}")
    return torch.cat((images, 1.0 - images, torch.full_like(images, 0.5)), dim=-3)


def two_window_channels(images: torch.Tensor) -> torch.Tensor:
    """(..., 2, H, W) two-window images in [0, 1] -> (..., 3, H, W) ``(w, 1 - w, w2)``: the
    first window as :func:`contrast_channels` encodes it, the second in the third channel
    (the find image's and the two-window measure crop's encoding)."""
    if not isinstance(images, torch.Tensor) or images.ndim < 3 or images.shape[-3] != 2:
        shape = tuple(getattr(images, "shape", ()))
        raise ValueError(f"images must be (..., 2, H, W) two-window images, got shape {shape}")
    first, second = images.unbind(dim=-3)
    return torch.stack((first, 1.0 - first, second), dim=-3)


# -- patches ------------------------------------------------------------------------------------
def _patchify_batch(frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, F, C, H, W) checked frames -> pixel_values (N T gh gw, 3 T' P P), grid (N, 3).

    Channel repetition, the temporal repeat of a still image and the patch reshuffle are views;
    the normalisation ``(x - IMAGE_MEAN) / IMAGE_STD`` writes the one contiguous copy.
    """
    n, f, _, height, width = (int(s) for s in frames.shape)
    x = frames.expand(n, f, CHANNELS, height, width)  # (N, F, 3, H, W); a view
    pad = -f % TEMPORAL_PATCH
    if f == 1:
        x = x.expand(n, TEMPORAL_PATCH, CHANNELS, height, width)  # a still image: a view
    elif pad:  # repeat the last frame, as the video processor does
        x = torch.cat((x, x[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
    t, gh, gw = (f + pad) // TEMPORAL_PATCH, height // PATCH, width // PATCH
    x = x.reshape(
        n, t, TEMPORAL_PATCH, CHANNELS, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH
    )
    x = x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)  # (N, t, gh/M, gw/M, M, M, 3, T', P, P)
    dtype, device = frames.dtype, frames.device
    mean = torch.tensor(IMAGE_MEAN, dtype=dtype, device=device).view(CHANNELS, 1, 1, 1)
    std = torch.tensor(IMAGE_STD, dtype=dtype, device=device).view(CHANNELS, 1, 1, 1)
    out = torch.empty(x.shape, dtype=dtype, device=device)
    torch.sub(x, mean, out=out).div_(std)
    pixel_values = out.view(n * t * gh * gw, CHANNELS * TEMPORAL_PATCH * PATCH * PATCH)
    grid_thw = torch.tensor([[t, gh, gw]], dtype=torch.int64).repeat(n, 1)  # (N, 3)
    return pixel_values, grid_thw


def patchify(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Still images -> Qwen2.5-VL ``(pixel_values, image_grid_thw)``.

    Args:
        images: float32 (N, C, H, W) in [0, 1], C = 1 (repeated to 3) or 3; H and W multiples
            of :data:`SIDE_MULTIPLE`. Each image is repeated over the temporal patch, as
            ``Qwen2VLImageProcessor`` does for a still image.

    Returns:
        ``pixel_values`` float32 (sum of gh * gw over images, 3 * 2 * 14 * 14) with
        gh, gw = H / 14, W / 14, rows in the processor's order (image, merged block row, merged
        block column, row in block, column in block); ``image_grid_thw`` int64 (N, 3), rows
        ``(1, gh, gw)``.

    Raises:
        ValueError: wrong rank, dtype, channel count or side, or values outside [0, 1].
    """
    checked = _check_pixels("images", images, 4, "(N, C, H, W)")
    return _patchify_batch(checked[:, None])  # (N, 1, C, H, W)


def patchify_frames(frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-frame images (e.g. neighbouring slices of a :class:`Crop`) -> pixel values and grid.

    Frames are grouped in pairs along the temporal patch: an image of F frames has
    ``t = ceil(F / 2)``; an odd F is padded by repeating the last frame (Qwen2VLVideoProcessor's
    rule). The layout is that processor's: for each image, rows ordered (t, merged block row,
    merged block column, row in block, column in block), each row (channel, frame in pair,
    patch row, patch column). A single frame gives exactly :func:`patchify`'s output.

    Args:
        frames: float32 (F, C, H, W) for one image or (N, F, C, H, W) for N images of F frames,
            in [0, 1], C = 1 or 3, H and W multiples of :data:`SIDE_MULTIPLE`.

    Returns:
        ``pixel_values`` (N t gh gw, 1176) float32 and ``image_grid_thw`` (N, 3) int64, rows
        ``(t, gh, gw)``.
    """
    if isinstance(frames, torch.Tensor) and frames.ndim == 4:
        frames = frames[None]  # (1, F, C, H, W)
    checked = _check_pixels("frames", frames, 5, "(F, C, H, W) or (N, F, C, H, W)")
    return _patchify_batch(checked)


def image_token_count(grid_thw: torch.Tensor | Sequence[int] | Sequence[Sequence[int]]) -> int:
    """Number of ``<|image_pad|>`` tokens: ``t * h * w // MERGE**2`` summed over the rows.

    Args:
        grid_thw: one image's ``(t, h, w)`` or an ``(N, 3)`` ``image_grid_thw``.
    """
    grid = torch.as_tensor(grid_thw)
    if grid.ndim == 1:
        grid = grid[None]
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.is_floating_point() or grid.numel() == 0:
        raise ValueError(
            f"grid_thw must be (t, h, w) or an integer (N, 3) tensor, got {grid_thw!r}"
        )
    t, h, w = grid[:, 0], grid[:, 1], grid[:, 2]
    if bool((t < 1).any() | (h < MERGE).any() | (w < MERGE).any()) or bool(
        ((h % MERGE) | (w % MERGE)).any()
    ):
        raise ValueError(
            f"grid_thw rows must have t >= 1 and h, w positive multiples of {MERGE}, "
            f"got {grid.tolist()}"
        )
    return int((t * h * w).sum()) // MERGE**2


# -- find images --------------------------------------------------------------------------------
def find_slice_indices(n_slices: int, num_slices: int) -> tuple[int, ...]:
    """Which of ``n_slices`` slices a find prompt shows when it may show ``num_slices``.

    Rule: all slices when ``n_slices <= num_slices``; otherwise cut the stack (slice ``i``
    spanning ``[i, i + 1)``) into ``num_slices`` equal parts and take the slice that holds the
    centre of each part: ``floor((2k + 1) n_slices / (2 num_slices))`` for
    ``k = 0 .. num_slices - 1``. The result is strictly increasing; once there are more than
    ``2 * num_slices`` slices it avoids the outermost ones (which resampling may blend with
    air).
    """
    n = _count("n_slices", n_slices)
    k = min(_count("num_slices", num_slices), n)
    return tuple((2 * i + 1) * n // (2 * k) for i in range(k))


@dataclass(frozen=True, eq=False)
class FindImages:
    """The slice images of a find prompt, with the way back to patient space.

    Args:
        images: float32 (K, C, H, W) in [0, 1], image ``k`` is prepared slice
            ``slice_indices[k]``; ready for :func:`patchify`.
        slice_indices: the prepared slice of each image, strictly increasing.
        source_slice_indices: the source volume slice nearest each image (for its SOP instance).
        geometry: the prepared volume's geometry (``PreparedVolume.geometry``).
    """

    images: torch.Tensor
    slice_indices: tuple[int, ...]
    source_slice_indices: tuple[int, ...]
    geometry: Geometry

    def __post_init__(self) -> None:
        images = self.images
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            shape = tuple(getattr(images, "shape", ()))
            raise ValueError(f"images must be a 4-D tensor (K, C, H, W), got shape {shape}")
        k = int(images.shape[0])
        if len(self.slice_indices) != k or len(self.source_slice_indices) != k:
            raise ValueError(
                f"slice_indices ({len(self.slice_indices)}) and source_slice_indices "
                f"({len(self.source_slice_indices)}) must have one entry per image ({k})"
            )
        indices = self.slice_indices
        if any(i < 0 for i in indices) or any(b <= a for a, b in itertools.pairwise(indices)):
            raise ValueError(f"slice_indices must be increasing and >= 0, got {indices}")

    @property
    def affine_lps(self) -> _F64:
        """(4, 4): prepared (slice, row, column) index -> LPS mm."""
        return self.geometry.affine

    def pixel_to_lps(self, pixels: npt.ArrayLike) -> _F64:
        """Map ``(..., 3)`` (image index, row, column) to LPS mm.

        The image index must be a whole number in ``[0, K)``; rows and columns may be
        fractional.
        """
        pix = np.asarray(pixels, dtype=np.float64)
        if pix.shape[-1:] != (3,):
            raise ValueError(f"pixels must have a last axis of size 3, got shape {pix.shape}")
        image = pix[..., 0]
        k = len(self.slice_indices)
        if not np.all((image == np.round(image)) & (image >= 0) & (image < k)):
            raise ValueError(
                f"image indices must be whole numbers in [0, {k}), got {np.unique(image)}"
            )
        slices = np.asarray(self.slice_indices, dtype=np.float64)[image.astype(np.int64)]
        return self.geometry.index_to_lps(np.stack([slices, pix[..., 1], pix[..., 2]], axis=-1))

    def lps_to_pixel(self, points: npt.ArrayLike) -> _F64:
        """Map ``(..., 3)`` LPS points (mm) to (nearest image index, row, column).

        The image index is that of the image whose slice is nearest the point (ties: the lower
        one), as a whole float; row and column are fractional, in that image. Use
        ``geometry.lps_to_index`` for the fractional prepared slice.
        """
        index = self.geometry.lps_to_index(points)  # (..., 3)
        slices = np.asarray(self.slice_indices, dtype=np.float64)  # (K,)
        nearest = np.abs(index[..., :1] - slices).argmin(axis=-1)  # (...,)
        return np.stack([nearest.astype(np.float64), index[..., 1], index[..., 2]], axis=-1)


def find_images(prepared: PreparedVolume, num_slices: int) -> FindImages:
    """The images of a find prompt: ``num_slices`` slices of ``prepared`` spread evenly.

    Slices are chosen by :func:`find_slice_indices` (all of them when there are fewer).

    Raises:
        ValueError: ``num_slices`` < 1; rows or columns not a multiple of 28 (set
            ``PrepareConfig.size`` so); a channel count other than 1 or 3.
    """
    indices = find_slice_indices(prepared.shape[0], num_slices)
    channels, _, rows, columns = (int(n) for n in prepared.image.shape)
    _check_side("prepared rows (PrepareConfig.size[0])", rows)
    _check_side("prepared columns (PrepareConfig.size[1])", columns)
    if channels not in (1, CHANNELS):
        raise ValueError(
            f"the prepared volume has {channels} channels; the model takes 1 or {CHANNELS} "
            "windows: prepare it with one window or three"
        )
    index = torch.tensor(indices, dtype=torch.long)
    images = prepared.image[:, index].permute(1, 0, 2, 3).contiguous()  # (K, C, H, W)
    sources = tuple(prepared.source_slice_indices[i] for i in indices)
    return FindImages(
        images=images,
        slice_indices=indices,
        source_slice_indices=sources,
        geometry=prepared.geometry,
    )


# -- measure crops ------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Crop:
    """An axial crop around a point: F frames of size x size pixels, one channel per window.

    Args:
        image: float32 (F, C, size, size) in [0, 1]; frame ``f`` lies
            ``(f - (F - 1) / 2) * slice_mm`` above the centre along +z.
        geometry: (frame, row, column) -> LPS: rows along +y, columns along +x, frames along
            +z, spacing (slice_mm, pixel_mm, pixel_mm).
        center_lps_mm: the point the crop is centred on; pixel ``((F-1)/2, (size-1)/2,
            (size-1)/2)`` (between pixels when a count is even) maps to it.
        windows: the (level, width) window of each channel.
    """

    image: torch.Tensor
    geometry: Geometry
    center_lps_mm: tuple[float, float, float]
    windows: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        image = self.image
        if not isinstance(image, torch.Tensor) or image.ndim != 4:
            shape = tuple(getattr(image, "shape", ()))
            raise ValueError(f"image must be a 4-D tensor (F, C, size, size), got shape {shape}")
        if image.dtype != torch.float32:
            raise ValueError(f"image must be float32, got {image.dtype}")
        if image.shape[1] != len(self.windows):
            raise ValueError(
                f"image has {image.shape[1]} channels but there are {len(self.windows)} windows"
            )

    @property
    def affine_lps(self) -> _F64:
        """(4, 4): crop (frame, row, column) index -> LPS mm."""
        return self.geometry.affine

    @property
    def pixel_mm(self) -> float:
        """In-plane spacing (mm) of rows and columns."""
        return self.geometry.row_spacing

    @property
    def slice_mm(self) -> float:
        """Distance (mm) between frames."""
        return self.geometry.slice_spacing

    @property
    def center_pixel(self) -> tuple[float, float, float]:
        """Fractional (frame, row, column) of :attr:`center_lps_mm`."""
        frames, _, rows, columns = (int(n) for n in self.image.shape)
        return ((frames - 1) / 2, (rows - 1) / 2, (columns - 1) / 2)

    def pixel_to_lps(self, pixels: npt.ArrayLike) -> _F64:
        """Map ``(..., 3)`` fractional (frame, row, column) to LPS mm."""
        return self.geometry.index_to_lps(pixels)

    def lps_to_pixel(self, points: npt.ArrayLike) -> _F64:
        """Map ``(..., 3)`` LPS points (mm) to fractional (frame, row, column)."""
        return self.geometry.lps_to_index(points)


def native_slice_mm(geometry: Geometry) -> float:
    """The spacing of the volume axis nearest the patient's z (ingestion.prepare's native)."""
    axis = int(np.argmax(np.abs(geometry.direction[2])))
    return float(geometry.spacing[axis])


def _crop_geometry(
    centre: tuple[float, float, float], pixel_mm: float, size: int, frames: int, slice_mm: float
) -> Geometry:
    half = (size - 1) / 2 * pixel_mm
    return Geometry(
        origin=(centre[0] - half, centre[1] - half, centre[2] - (frames - 1) / 2 * slice_mm),
        row_direction=(1.0, 0.0, 0.0),  # column index -> +x (patient left)
        column_direction=(0.0, 1.0, 0.0),  # row index -> +y (posterior)
        slice_direction=(0.0, 0.0, 1.0),  # frame index -> +z (superior)
        spacing=(slice_mm, pixel_mm, pixel_mm),
    )


def _apply_windows(hu: torch.Tensor, windows: tuple[tuple[float, float], ...]) -> torch.Tensor:
    """(F, H, W) HU -> (F, C, H, W) in [0, 1]: level - width/2 -> 0, level + width/2 -> 1."""
    low = torch.tensor([lv - w / 2 for lv, w in windows], dtype=torch.float32).view(-1, 1, 1)
    width = torch.tensor([w for _, w in windows], dtype=torch.float32).view(-1, 1, 1)
    return ((hu[:, None] - low) / width).clamp_(0.0, 1.0)


def crop_around(
    volume: Volume,
    center_lps_mm: npt.ArrayLike,
    *,
    pixel_mm: float,
    size: int,
    window: Window | Sequence[Window],
    slices: int = 1,
    slice_mm: float | None = None,
) -> Crop:
    """An axial crop of ``volume`` centred on an LPS point, for a measure prompt.

    The crop grid is laid in patient space along the LPS axes (canonical orientation, see the
    module docstring), whatever the volume's orientation, obliquity or gantry tilt, and the HU
    volume is sampled on it trilinearly through its full geometry; outside the volume is air
    (:data:`AIR_HU`). Windowing comes after interpolation, as in ``ingestion.prepare``.

    Args:
        volume: the source volume (HU).
        center_lps_mm: (x, y, z) LPS mm, the crop's centre.
        pixel_mm: mm per pixel along rows and columns, > 0.
        size: rows = columns, a multiple of 28.
        window: (level, width) in HU, or a sequence of them (one channel each).
        slices: frames (axial planes) to sample, >= 1, spread symmetrically about the centre.
        slice_mm: distance between frames (mm); ``None`` takes the spacing of the volume axis
            nearest the patient's z (ingestion.prepare's native slice spacing).

    Returns:
        A :class:`Crop` with image (slices, C, size, size) float32 in [0, 1].

    Raises:
        ValueError: a non-finite centre, ``pixel_mm`` or ``slice_mm`` <= 0, ``size`` not a
            multiple of 28, ``slices`` < 1, or a bad window; each message names the value.
    """
    centre = _point("center_lps_mm", center_lps_mm)
    pixel = _positive("pixel_mm", pixel_mm)
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise ValueError(f"size must be an integer number of pixels, got {size!r}")
    _check_side("size", int(size))
    frames = _count("slices", slices)
    step = native_slice_mm(volume.geometry) if slice_mm is None else _positive("slice_mm", slice_mm)
    windows = _windows(window)
    geometry = _crop_geometry(centre, pixel, int(size), frames, step)
    # Imported here: ingestion.prepare imports MONAI (seconds), which importing this module
    # should not cost.
    from ingestion.prepare import crop_volume

    hu = crop_volume(volume, geometry, (frames, int(size), int(size)), pad_value=AIR_HU)
    return Crop(
        image=_apply_windows(hu, windows),  # (F, C, size, size)
        geometry=geometry,
        center_lps_mm=centre,
        windows=windows,
    )
