"""``model.numeric.patch_embed``: Qwen2.5-VL's patch projection as a matrix product."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from model.backbone import tiny_qwen2_5_vl_kwargs
from model.numeric.patch_embed import (
    LinearPatchProjection,
    is_patch_projection,
    linear_patch_projections,
)


def _tower_input(model: Qwen2_5_VLForConditionalGeneration, grid: list[int]) -> torch.Tensor:
    config = model.config.vision_config
    size = config.in_channels * config.temporal_patch_size * config.patch_size**2
    generator = torch.Generator().manual_seed(5)
    return torch.randn(grid[0] * grid[1] * grid[2], size, generator=generator)


def test_the_vision_tower_gives_what_the_convolution_gives_with_the_same_weights() -> None:
    torch.manual_seed(3)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**tiny_qwen2_5_vl_kwargs())).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grid = torch.tensor([[1, 8, 12], [1, 4, 4]])
    pixels = torch.cat([_tower_input(model, g) for g in grid.tolist()])
    with torch.no_grad():
        expected = model.model.get_image_features(pixels, grid)
        assert linear_patch_projections(model) == 1
        got = model.model.get_image_features(pixels, grid)
    assert isinstance(model.model.visual.patch_embed.proj, LinearPatchProjection)
    for a, b in zip(_features(expected), _features(got), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    after = model.state_dict()  # the same keys, shapes and values: checkpoints do not change
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert linear_patch_projections(model) == 0  # nothing left to replace


def _features(output: object) -> list[torch.Tensor]:
    """The per-image features, whichever form this transformers version returns."""
    features = getattr(output, "pooler_output", output)
    return list(features) if isinstance(features, (list, tuple)) else [features]


def test_only_a_convolution_that_sees_each_patch_whole_is_a_projection() -> None:
    assert is_patch_projection(nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4)))
    assert not is_patch_projection(nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(1, 4, 4)))
    padded = nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), padding=1)
    assert not is_patch_projection(padded)
    assert not is_patch_projection(nn.Conv2d(3, 8, kernel_size=4, stride=4))
    with pytest.raises(ValueError, match="not a patch projection"):
        LinearPatchProjection(padded)
    projection = LinearPatchProjection(nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4)))
    with pytest.raises(ValueError, match=r"do not match the projection's kernel \(3, 2, 4, 4\)"):
        projection(torch.zeros(5, 3, 2, 4, 5))


def test_the_output_is_the_convolutions_with_a_bias() -> None:
    torch.manual_seed(4)
    conv = nn.Conv3d(3, 16, kernel_size=(2, 14, 14), stride=(2, 14, 14), bias=True)
    patches = torch.randn(37, 3, 2, 14, 14)
    with torch.no_grad():
        torch.testing.assert_close(LinearPatchProjection(conv)(patches), conv(patches))
