"""Qwen2.5-VL's patch projection as the matrix product it is, for inference.

The vision tower embeds each patch with a ``Conv3d`` whose kernel is its stride and the whole
patch (channels x 2 frames x 14 x 14): one output position per patch, so the convolution is
``patches @ weight.T`` over the 1,176 flattened inputs. torch's CPU convolution runs it at a
fifth of the matrix product's speed (on the demo's real-CT inference the projection was 14 % of
the time, benchmarks/RESULTS.md). :class:`LinearPatchProjection` holds the convolution's own
weight (same parameter, same shape: state dicts and checkpoints do not change) and computes the
product; the outputs agree to float32 rounding (the sums run in another order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LinearPatchProjection", "is_patch_projection", "linear_patch_projections"]


class LinearPatchProjection(nn.Module):
    """A patch ``Conv3d`` (kernel = stride = the input's size, no padding, one group) as a
    matrix product: (N, C, T, P, P) -> (N, D, 1, 1, 1), as the convolution gives."""

    def __init__(self, conv: nn.Conv3d) -> None:
        super().__init__()
        if not is_patch_projection(conv):
            raise ValueError(f"not a patch projection (kernel = stride, no padding): {conv}")
        self.weight = conv.weight
        self.bias = conv.bias

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        if patches.dim() != 5 or patches.shape[1:] != self.weight.shape[1:]:
            raise ValueError(
                f"patches of shape {tuple(patches.shape)} do not match the projection's "
                f"kernel {tuple(self.weight.shape[1:])}"
            )
        flat = patches.reshape(patches.shape[0], -1)
        out = F.linear(flat, self.weight.reshape(self.weight.shape[0], -1), self.bias)
        return out.view(patches.shape[0], -1, 1, 1, 1)


def is_patch_projection(module: nn.Module) -> bool:
    """Whether ``module`` is a ``Conv3d`` that sees each patch once, whole."""
    if not isinstance(module, nn.Conv3d) or isinstance(module.padding, str):
        return False
    return (
        tuple(module.kernel_size) == tuple(module.stride)
        and all(p == 0 for p in module.padding)
        and tuple(module.dilation) == (1, 1, 1)
        and module.groups == 1
    )


def linear_patch_projections(model: nn.Module) -> int:
    """Replace every vision patch projection of ``model`` (a ``proj`` ``Conv3d`` of a module
    named ``patch_embed``) with :class:`LinearPatchProjection`; returns how many."""
    swapped = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "patch_embed":
            continue
        conv = getattr(module, "proj", None)
        if isinstance(conv, nn.Conv3d) and is_patch_projection(conv):
            module.proj = LinearPatchProjection(conv)
            swapped += 1
    return swapped
