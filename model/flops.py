"""The arithmetic floor of a Qwen2.5-VL inference: its multiply-adds, from the model's shapes
and the prompts it answered.

A generate call answers a batch of rows; each row is a prompt (its real tokens, its images as
``(t, h, w)`` patch grids) and an answer of ``n`` new tokens. The floor counts what any
implementation has to compute for that, and nothing that an implementation chooses to:

- **vision**: the patch embedding (``C * t_patch * p * p`` inputs per patch), every block's
  qkv, projection and gated MLP per patch, its attention (full within an image, or within
  ``window_size`` windows), and the patch merger's MLP per merged token;
- **prefill**: every prompt token through every decoder layer (q, k, v, o projections and the
  gated MLP), causal attention over the tokens before it, and the ``lm_head`` once, at the
  last prompt position (the first new token's logits);
- **decode**: each new token but the last is fed back: one token through every layer, with
  attention over the prompt and the tokens before it, and the ``lm_head``.

Padding, finished rows kept in a batch, norms, activations, rotary tables and the numeric head
are not counted: the floor is a lower bound, and the time of an inference divided by the time
these operations take at the machine's matrix-multiply speed is how far above it the
implementation runs. One multiply-add is 2 operations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

__all__ = [
    "AnsweredRow",
    "Flops",
    "TextShape",
    "VisionShape",
    "answered_rows",
    "generation_flops",
]


class _TextConfig(Protocol):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int


class _VisionConfig(Protocol):
    depth: int
    hidden_size: int
    intermediate_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    window_size: int
    fullatt_block_indexes: Sequence[int]


@dataclass(frozen=True)
class TextShape:
    """The decoder's shapes (Qwen2.5-VL's ``text_config``)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config: _TextConfig) -> TextShape:
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        return cls(
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            int(head_dim),
            config.vocab_size,
        )

    def token(self, context: int) -> int:
        """Operations of one token through every layer, attending to ``context`` tokens
        (itself included)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        projections = (
            self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate
        )
        attention = 2 * q * context  # scores and the weighted sum
        return 2 * self.layers * (projections + attention)

    def prompt(self, tokens: int) -> int:
        """Operations of a causal pass over ``tokens`` tokens (the n-th attends to n)."""
        q = self.heads * self.head_dim
        per_token = self.token(0)
        attention = 2 * self.layers * 2 * q * tokens * (tokens + 1) // 2
        return tokens * per_token + attention

    def logits(self) -> int:
        return 2 * self.hidden * self.vocab


@dataclass(frozen=True)
class VisionShape:
    """The vision tower's shapes (Qwen2.5-VL's ``vision_config``)."""

    hidden: int
    intermediate: int
    depth: int
    patch_inputs: int  # C * t_patch * p * p
    merge: int  # spatial merge size
    out_hidden: int
    window: int  # patches per window side
    full_blocks: frozenset[int]

    @classmethod
    def of(cls, config: _VisionConfig) -> VisionShape:
        return cls(
            config.hidden_size,
            config.intermediate_size,
            config.depth,
            config.in_channels * config.temporal_patch_size * config.patch_size**2,
            config.spatial_merge_size,
            config.out_hidden_size,
            max(1, config.window_size // config.patch_size),
            frozenset(config.fullatt_block_indexes),
        )

    def image(self, grid: tuple[int, int, int]) -> int:
        """Operations of the tower on one image of ``(t, h, w)`` patches."""
        t, h, w = grid
        patches = t * h * w
        h_ = self.hidden
        total = 2 * patches * self.patch_inputs * h_
        per_patch = 2 * (4 * h_ * h_ + 3 * h_ * self.intermediate)
        windows = self._window_lengths(t, h, w)
        for block in range(self.depth):
            total += patches * per_patch
            lengths = [patches] if block in self.full_blocks else windows
            total += sum(2 * 2 * h_ * n * n for n in lengths)
        merged = patches // self.merge**2
        wide = h_ * self.merge**2
        total += 2 * merged * (wide * wide + wide * self.out_hidden)
        return total

    def _window_lengths(self, t: int, h: int, w: int) -> list[int]:
        side = self.window
        rows = [min(side, h - r) for r in range(0, h, side)]
        columns = [min(side, w - c) for c in range(0, w, side)]
        return [r * c for _ in range(t) for r in rows for c in columns]


@dataclass(frozen=True)
class AnsweredRow:
    """One answered prompt: its real tokens (image tokens included), the ``(t, h, w)`` patch
    grids of its images and how many tokens its answer has (the end token included)."""

    prompt_tokens: int
    new_tokens: int
    images: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.new_tokens < 0:
            raise ValueError(
                f"a row needs >= 1 prompt token and >= 0 new tokens, got {self.prompt_tokens} "
                f"and {self.new_tokens}"
            )


@dataclass(frozen=True)
class Flops:
    """Operations of an inference by part (module doc)."""

    vision: int = 0
    prefill: int = 0
    decode: int = 0

    @property
    def total(self) -> int:
        return self.vision + self.prefill + self.decode

    def __add__(self, other: Flops) -> Flops:
        return Flops(
            self.vision + other.vision, self.prefill + other.prefill, self.decode + other.decode
        )

    def seconds(self, operations_per_second: float) -> float:
        """The floor's time at a matrix-multiply speed (operations per second)."""
        if not (math.isfinite(operations_per_second) and operations_per_second > 0):
            raise ValueError(f"speed must be > 0 operations/s, got {operations_per_second!r}")
        return self.total / operations_per_second


def generation_flops(
    text: TextShape, vision: VisionShape | None, rows: Iterable[AnsweredRow]
) -> Flops:
    """The floor of answering ``rows`` (module doc); ``vision`` None for text-only rows
    (ValueError for a row with images)."""
    out = Flops()
    for row in rows:
        if row.images and vision is None:
            raise ValueError("a row has images but no vision shape was given")
        seen = sum(vision.image(grid) for grid in row.images) if vision is not None else 0
        prefill = text.prompt(row.prompt_tokens) + (text.logits() if row.new_tokens else 0)
        fed = max(0, row.new_tokens - 1)  # the last new token is not fed back
        contexts = fed * row.prompt_tokens + fed * (fed + 1) // 2  # sum of P + k, k = 1..fed
        decode = fed * (text.token(0) + text.logits()) + (text.token(1) - text.token(0)) * contexts
        out = out + Flops(seen, prefill, decode)
    return out


def answered_rows(
    attention_mask: torch.Tensor,
    new_mask: torch.Tensor,
    image_tokens: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    merge: int,
) -> list[AnsweredRow]:
    """The rows of one generate call: ``attention_mask`` (B, P) of the prompts, ``new_mask``
    (B, T) 1 on each row's new tokens (its end token included), ``image_tokens`` (B, P) True on
    image placeholders, and the images' (N, 3) patch grids in row order (each image has
    ``t * h * w / merge**2`` placeholders)."""
    grids = [] if image_grid_thw is None else [tuple(g) for g in image_grid_thw.tolist()]
    per_row = image_tokens.sum(dim=1).tolist()
    rows, taken = [], 0
    for prompt, new, placeholders in zip(
        attention_mask.sum(dim=1).tolist(), new_mask.sum(dim=1).tolist(), per_row, strict=True
    ):
        images: list[tuple[int, int, int]] = []
        while placeholders > 0:
            if taken >= len(grids):
                raise ValueError("the prompts hold more image placeholders than the grids give")
            t, h, w = (int(v) for v in grids[taken])
            images.append((t, h, w))
            placeholders -= t * h * w // merge**2
            taken += 1
        if placeholders < 0:
            raise ValueError("a row's image placeholders do not match its images' grids")
        rows.append(AnsweredRow(int(prompt), int(new), tuple(images)))
    if taken != len(grids):
        raise ValueError(f"{len(grids) - taken} image grid(s) left over after the last row")
    return rows
