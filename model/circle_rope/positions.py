"""Rope position ids for Qwen2.5-VL: M-RoPE (transformers' rule) and Circle-RoPE (CIP).

Both walk each sequence once. Text tokens count up by one on all three rows (t, h, w). An image
starts at ``p``, the position after its ``<|vision_start|>`` token, and is ``T x H x W`` merged
tokens in (t, h, w) row-major order (``H, W`` = ``image_grid_thw`` h, w // spatial_merge_size).

M-RoPE (``mrope_position_ids``)
    Token ``(f, i, j)`` sits at ``(p + f, p + i, p + j)``; the text after the image continues at
    ``p + max(H, W)``. This is transformers' ``Qwen2_5_VLModel.get_rope_index`` for images
    (5.x), equal to it exactly (integers, int64), including padding positions (0).

Circle-RoPE (``circle_rope_position_ids``; paper sec. 4.1, conventions of the authors' code in
``shared/design/circle-rope-notes.md``)
    1. Centre the frame's grid: ``x = j - (W-1)/2``, ``y = i - (H-1)/2`` (zeros made +0.0: the
       sign of a zero changes ``atan2``).
    2. Spatial angle ``SA = atan2(y, x)`` rescaled linearly onto ``[0, 2 pi]`` (both ends
       included; kept as is when all angles are equal); grid angle ``GA = 2 pi k / (H W)`` with
       ``k = i W + j``; ``theta = alpha SA + (1 - alpha) GA``; ``a = R cos theta``,
       ``b = R sin theta``.
    3. Put the circle in the plane orthogonal to the text axis ``[1, 1, 1]`` with
       ``u = (-1, 1, 0)/sqrt 2``, ``v = n x u = (-1, -1, 2)/sqrt 6`` in (w, h, t) order, centred at
       ``(c, c, c)`` on the text line: ``t = c + 2b/sqrt 6``, ``h = c + a/sqrt 2 - b/sqrt 6``,
       ``w = c - a/sqrt 2 - b/sqrt 6``. Every text position ``(q, q, q)`` is then at the same
       distance ``sqrt(3 (q - c)^2 + R^2)`` from every token of the circle: per-token distance 0.
    4. ``c = p`` for a single frame. Frame ``f`` of a multi-frame image (a CT volume given as
       one ``T > 1`` input) gets ``c = p + f * frame_stride`` (paper sec. 4.3; the reference
       implementation handles only ``T = 1``). Several images each get their own ``p``.
    5. The text after the image continues at ``max`` (over all three rows of the image) ``+ 1``,
       so later positions are fractional; ``rope_deltas = max + 1 - length`` per sequence.

    Radius: a number is ``R``; ``"auto"`` is ``max((W-1)/2, (H-1)/2)`` (the largest centred
    coordinate, not the corner distance); ``"auto-<s>"`` is ``s`` times that.

Positions are computed in float64 and returned as float32 (what the rotary embedding multiplies
by ``inv_freq``); rounding them to integers or bfloat16 would corrupt them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_FRAME_STRIDE",
    "DEFAULT_RADIUS",
    "MultimodalPositions",
    "Radius",
    "circle_coordinates",
    "circle_rope_position_ids",
    "mrope_position_ids",
    "multimodal_position_ids",
    "per_token_distance",
    "resolve_radius",
]

Radius = float | str

DEFAULT_ALPHA = 0.5  # the reference configuration's angle mix
DEFAULT_RADIUS = 10.0  # the reference configuration's fixed radius
DEFAULT_FRAME_STRIDE = 1.0  # paper sec. 4.3: Delta, the shift of each frame's centre along [1,1,1]

_SQRT2, _SQRT6 = math.sqrt(2.0), math.sqrt(6.0)
_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class MultimodalPositions:
    """Both geometries of one batch, from one walk over the sequences."""

    mrope: torch.Tensor  # (3, B, L) int64: transformers' M-RoPE ids (padding 0)
    circle: torch.Tensor  # (3, B, L) float32: Circle-RoPE ids (padding 0)
    mrope_deltas: torch.Tensor  # (B, 1) int64: max + 1 - length
    circle_deltas: torch.Tensor  # (B, 1) float32: max + 1 - length


def resolve_radius(radius: Radius, grid_h: int, grid_w: int) -> float:
    """The circle radius of a merged ``grid_h x grid_w`` frame (see the module doc).

    ``radius``: a finite number >= 0, ``"auto"`` or ``"auto-<s>"`` with a finite ``s > 0``.
    """
    if isinstance(radius, str):
        scale = 1.0
        if radius != "auto":
            head, _, tail = radius.partition("-")
            try:
                scale = float(tail) if head == "auto" else math.nan
            except ValueError:
                scale = math.nan
            if not (math.isfinite(scale) and scale > 0):
                raise ValueError(
                    f"radius {radius!r} is not understood; use a number, 'auto' or 'auto-<s>' "
                    "with a positive scale s, e.g. 'auto-2'"
                )
        return scale * max((grid_w - 1) / 2, (grid_h - 1) / 2)
    if isinstance(radius, bool) or not isinstance(radius, int | float):
        raise ValueError(f"radius must be a number, 'auto' or 'auto-<s>', got {radius!r}")
    if not (math.isfinite(radius) and radius >= 0):
        raise ValueError(f"radius must be a finite number >= 0, got {radius!r}")
    return float(radius)


def circle_coordinates(grid_h: int, grid_w: int, alpha: float, radius: Radius) -> _F64:
    """(H W, 2) float64 in-plane coordinates ``(a, b)`` of a merged frame's tokens, row-major.

    Steps 1-2 of the module doc; ``a = R cos theta``, ``b = R sin theta``.
    """
    _check_alpha(alpha)
    if grid_h < 1 or grid_w < 1:
        raise ValueError(f"grid must be at least 1 x 1, got {grid_h} x {grid_w}")
    r = resolve_radius(radius, grid_h, grid_w)
    return _circle(grid_h, grid_w, float(alpha), r).copy()


@lru_cache(maxsize=256)
def _circle(grid_h: int, grid_w: int, alpha: float, r: float) -> _F64:
    i, j = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")  # (H, W) each
    x = (j - (grid_w - 1) / 2).ravel() + 0.0  # (N,) centred, -0.0 -> +0.0
    y = (i - (grid_h - 1) / 2).ravel() + 0.0  # (N,)
    spatial = np.arctan2(y, x)  # (N,) in (-pi, pi]
    low, high = spatial.min(), spatial.max()
    if high > low:
        spatial = (spatial - low) / (high - low) * (2 * math.pi)
    n = grid_h * grid_w
    grid = np.arange(n) / n * (2 * math.pi)  # (N,)
    theta = alpha * spatial + (1 - alpha) * grid
    out = np.stack((r * np.cos(theta), r * np.sin(theta)), axis=1)  # (N, 2)
    out.flags.writeable = False
    return out


def _circle_image(ab: _F64, frames: int, start: float, stride: float) -> _F64:
    """(3, T N) float64 (t, h, w) positions of a T-frame image whose first centre is ``start``."""
    a, b = ab[:, 0], ab[:, 1]  # (N,) each
    offsets = np.stack((2 * b / _SQRT6, a / _SQRT2 - b / _SQRT6, -a / _SQRT2 - b / _SQRT6))
    centres = start + stride * np.arange(frames)  # (T,)
    out = centres[None, :, None] + offsets[:, None, :]  # (3, T, N)
    return out.reshape(3, -1)


def _mrope_image(frames: int, grid_h: int, grid_w: int, start: int) -> _I64:
    """(3, T H W) int64 M-RoPE positions of an image starting at ``start``."""
    t, h, w = np.meshgrid(np.arange(frames), np.arange(grid_h), np.arange(grid_w), indexing="ij")
    return np.stack((t.ravel(), h.ravel(), w.ravel())) + start


@dataclass(frozen=True)
class _Settings:
    merge: int
    image_token_id: int
    vision_start_token_id: int
    alpha: float
    radius: Radius
    frame_stride: float


def _grids(image_grid_thw: torch.Tensor | None, merge: int) -> list[tuple[int, int, int]]:
    """(I, 3) pre-merge grids -> merged (T, H, W) per image, checked."""
    if image_grid_thw is None:
        return []
    grid = torch.as_tensor(image_grid_thw)
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.is_floating_point():
        raise ValueError(
            f"image_grid_thw must be an integer (num_images, 3) tensor, got {tuple(grid.shape)} "
            f"{grid.dtype}"
        )
    out = []
    for k, (t, h, w) in enumerate(grid.tolist()):
        if t < 1 or h < merge or w < merge or h % merge or w % merge:
            raise ValueError(
                f"image_grid_thw[{k}] = {[t, h, w]}: t must be >= 1 and h, w positive multiples "
                f"of spatial_merge_size {merge}"
            )
        out.append((t, h // merge, w // merge))
    return out


def _walk_row(
    tokens: _I64, row: int, grids: Iterator[tuple[int, int, int]], s: _Settings
) -> tuple[_I64, _F64]:
    """One sequence's valid tokens -> (3, n) M-RoPE int64 and (3, n) Circle float64 positions."""
    n = tokens.shape[0]
    is_image = tokens == s.image_token_id
    starts = np.flatnonzero(tokens[:-1] == s.vision_start_token_id) + 1  # candidate image starts
    starts = starts[is_image[starts]]
    mrope = np.empty((3, n), dtype=np.int64)
    circle = np.empty((3, n), dtype=np.float64)
    m_pos, c_pos, done, covered = 0, 0.0, 0, 0  # next text positions, tokens placed, image tokens
    for start in starts.tolist():
        if start < done:
            continue  # a vision_start inside an image's own tokens cannot happen; be safe
        try:
            frames, grid_h, grid_w = next(grids)
        except StopIteration:
            raise ValueError(
                f"input_ids row {row} has more images than image_grid_thw has rows"
            ) from None
        size = frames * grid_h * grid_w
        end = start + size
        if end > n or not bool(is_image[start:end].all()):
            raise ValueError(
                f"input_ids row {row}: the image at token {start} should have {size} image tokens "
                f"(image_grid_thw {frames} x {grid_h * s.merge} x {grid_w * s.merge}, merge "
                f"{s.merge}) but has {int(np.argmin(np.append(is_image[start:end], False)))}"
            )
        text = start - done  # text tokens before the image
        mrope[:, done:start] = m_pos + np.arange(text)
        circle[:, done:start] = c_pos + np.arange(text)
        m_pos, c_pos = m_pos + text, c_pos + text
        mrope[:, start:end] = _mrope_image(frames, grid_h, grid_w, m_pos)
        ab = _circle(grid_h, grid_w, s.alpha, resolve_radius(s.radius, grid_h, grid_w))
        image = _circle_image(ab, frames, c_pos, s.frame_stride)
        circle[:, start:end] = image
        m_pos += max(grid_h, grid_w)
        c_pos = float(image.max()) + 1.0
        done, covered = end, covered + size
    if covered != int(is_image.sum()):
        raise ValueError(
            f"input_ids row {row} has {int(is_image.sum())} image tokens but {covered} belong to "
            "images opened by a vision_start token; every image must be "
            "<|vision_start|> followed by its image tokens"
        )
    text = n - done
    mrope[:, done:] = m_pos + np.arange(text)
    circle[:, done:] = c_pos + np.arange(text)
    return mrope, circle


def multimodal_position_ids(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
    *,
    spatial_merge_size: int = 2,
    image_token_id: int,
    vision_start_token_id: int,
    alpha: float = DEFAULT_ALPHA,
    radius: Radius = DEFAULT_RADIUS,
    frame_stride: float = DEFAULT_FRAME_STRIDE,
) -> MultimodalPositions:
    """M-RoPE and Circle-RoPE position ids of a batch in one walk (see the module doc).

    ``input_ids`` (B, L); ``image_grid_thw`` (I, 3) pre-merge, the images of all rows in order;
    ``attention_mask`` (B, L), 0 at padding (left or right). Raises ``ValueError`` for a
    malformed batch (image tokens that do not match the grids, bad settings).
    """
    _check_alpha(alpha)
    if not (isinstance(frame_stride, int | float) and math.isfinite(frame_stride)):
        raise ValueError(f"frame_stride must be a finite number, got {frame_stride!r}")
    if spatial_merge_size < 1:
        raise ValueError(f"spatial_merge_size must be >= 1, got {spatial_merge_size}")
    resolve_radius(radius, 1, 1)  # validate before any work
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} does not match input_ids "
            f"{tuple(input_ids.shape)}"
        )
    s = _Settings(
        spatial_merge_size,
        image_token_id,
        vision_start_token_id,
        float(alpha),
        radius,
        float(frame_stride),
    )
    grids = _grids(image_grid_thw, spatial_merge_size)
    remaining = iter(grids)
    ids = input_ids.detach().cpu().numpy()  # (B, L)
    valid = (
        np.ones(ids.shape, dtype=bool)
        if attention_mask is None
        else attention_mask.detach().cpu().numpy().astype(bool)
    )
    batch, length = ids.shape
    mrope = np.zeros((3, batch, length), dtype=np.int64)
    circle = np.zeros((3, batch, length), dtype=np.float64)
    m_deltas = np.zeros((batch, 1), dtype=np.int64)
    c_deltas = np.zeros((batch, 1), dtype=np.float64)
    for row in range(batch):
        keep = valid[row]
        n = int(keep.sum())
        if n == 0:
            continue
        m_row, c_row = _walk_row(ids[row][keep], row, remaining, s)
        mrope[:, row, keep] = m_row
        circle[:, row, keep] = c_row
        m_deltas[row, 0] = m_row.max() + 1 - n
        c_deltas[row, 0] = c_row.max() + 1 - n
    left = sum(1 for _ in remaining)
    if left:
        raise ValueError(
            f"image_grid_thw has {len(grids)} images but input_ids open only {len(grids) - left}"
        )
    device = input_ids.device
    return MultimodalPositions(
        mrope=torch.from_numpy(mrope).to(device),
        circle=torch.from_numpy(circle).to(device=device, dtype=torch.float32),
        mrope_deltas=torch.from_numpy(m_deltas).to(device),
        circle_deltas=torch.from_numpy(c_deltas).to(device=device, dtype=torch.float32),
    )


def circle_rope_position_ids(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
    *,
    spatial_merge_size: int = 2,
    image_token_id: int,
    vision_start_token_id: int,
    alpha: float = DEFAULT_ALPHA,
    radius: Radius = DEFAULT_RADIUS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Circle-RoPE position ids: -> ``position_ids`` (3, B, L) float32 in rows (t, h, w) and
    ``rope_deltas`` (B, 1) float32 (``max + 1 - length`` per sequence).

    ``image_grid_thw`` (I, 3) is pre-merge, as transformers passes it; ``attention_mask`` (B, L)
    marks padding (left padding supported; padded positions are 0). ``radius`` is a number,
    ``"auto"`` or ``"auto-<s>"``. A multi-frame image (``t > 1``) gets the paper's sec. 4.3
    ordering with a stride of ``DEFAULT_FRAME_STRIDE``. See the module doc for the geometry.
    """
    positions = multimodal_position_ids(
        input_ids,
        image_grid_thw,
        attention_mask,
        spatial_merge_size=spatial_merge_size,
        image_token_id=image_token_id,
        vision_start_token_id=vision_start_token_id,
        alpha=alpha,
        radius=radius,
    )
    return positions.circle, positions.circle_deltas


def mrope_position_ids(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
    *,
    spatial_merge_size: int = 2,
    image_token_id: int,
    vision_start_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-VL's own M-RoPE ids (int64 (3, B, L), deltas (B, 1)), equal to transformers'
    ``get_rope_index`` for images; the same arguments as ``circle_rope_position_ids``."""
    positions = multimodal_position_ids(
        input_ids,
        image_grid_thw,
        attention_mask,
        spatial_merge_size=spatial_merge_size,
        image_token_id=image_token_id,
        vision_start_token_id=vision_start_token_id,
    )
    return positions.mrope, positions.mrope_deltas


def per_token_distance(text_positions: torch.Tensor, image_positions: torch.Tensor) -> float:
    """The paper's per-token distance (eq. 1) between text and image token positions.

    ``text_positions`` (N_text, K) and ``image_positions`` (N_image, K) points (K = 3 for
    (t, h, w)): the mean over text tokens ``t`` and image tokens ``i`` of
    ``|d(t, i) - mean_i d(t, i)|`` with ``d`` the Euclidean distance, in float64. 0 means every
    text token is equally far from every image token.
    """
    if text_positions.dim() != 2 or image_positions.dim() != 2:
        raise ValueError("positions must be (tokens, coordinates) matrices")
    if text_positions.shape[0] == 0 or image_positions.shape[0] == 0:
        raise ValueError("per-token distance needs at least one text and one image token")
    d = torch.cdist(
        text_positions.double(),
        image_positions.double(),
        compute_mode="donot_use_mm_for_euclid_dist",
    )  # (N_text, N_image)
    return float((d - d.mean(dim=1, keepdim=True)).abs().mean())


def _check_alpha(alpha: float) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
