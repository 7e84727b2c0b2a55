"""The arithmetic floor (``model.flops``) against what torch counts on real Qwen2.5-VL modules.

``torch.utils.flop_counter`` counts the matrix products and convolutions that a module runs (not
CPU attention kernels), so each check adds the attention by hand: 4 * width * keys per query.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2_5_VLForConditionalGeneration

from model.flops import AnsweredRow, Flops, TextShape, VisionShape, answered_rows, generation_flops

from tests.support.models import tiny_vl_config


@pytest.fixture(scope="module")
def tiny() -> Qwen2_5_VLForConditionalGeneration:
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(tiny_vl_config()).eval()


def counted(run: object) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        run()  # type: ignore[operator]
    return int(counter.get_total_flops())


def test_a_prompt_is_what_torch_counts_plus_causal_attention(
    tiny: Qwen2_5_VLForConditionalGeneration,
) -> None:
    text = TextShape.of(tiny.config.get_text_config())
    tokens = 7
    embeds = torch.randn(1, tokens, text.hidden, generator=torch.Generator().manual_seed(0))
    total = counted(
        lambda: tiny(
            inputs_embeds=embeds,
            attention_mask=torch.ones(1, tokens, dtype=torch.long),
            position_ids=torch.arange(tokens)[None],
            logits_to_keep=1,
        )
    )
    width = text.heads * text.head_dim
    attention = text.layers * 4 * width * sum(range(1, tokens + 1))  # the n-th sees n
    assert text.prompt(tokens) + text.logits() == total + attention


def test_an_image_is_what_torch_counts_plus_attention(
    tiny: Qwen2_5_VLForConditionalGeneration,
) -> None:
    vision = VisionShape.of(tiny.config.vision_config)
    grid = (1, 8, 12)
    patches = 8 * 12
    pixels = torch.randn(patches, vision.patch_inputs, generator=torch.Generator().manual_seed(0))
    total = counted(lambda: tiny.model.visual(pixels, grid_thw=torch.tensor([grid])))
    windows = [16] * 6  # 4 x 4 patch windows (56 px of 14 px patches) on 8 x 12 patches
    attention = sum(
        4 * vision.hidden * sum(n * n for n in ([patches] if b in vision.full_blocks else windows))
        for b in range(vision.depth)
    )
    assert vision.image(grid) == total + attention


def test_decode_counts_each_fed_back_token_with_its_context() -> None:
    text = TextShape(hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=10)
    row = AnsweredRow(prompt_tokens=5, new_tokens=4)
    flops = generation_flops(text, None, [row])
    # new tokens 1..4: the prefill gives the first; tokens 1..3 are fed back at contexts 6, 7, 8
    assert flops.decode == sum(text.token(5 + k) + text.logits() for k in (1, 2, 3))
    assert flops.prefill == text.prompt(5) + text.logits()
    assert flops.vision == 0
    assert generation_flops(text, None, [AnsweredRow(5, 0)]).total == text.prompt(5)
    two = generation_flops(text, None, [row, row])
    assert two == flops + flops and two.total == 2 * flops.total
    assert flops.seconds(1e9) == pytest.approx(flops.total / 1e9)
    with pytest.raises(ValueError, match="> 0"):
        flops.seconds(0.0)
    with pytest.raises(ValueError, match="images but no vision"):
        generation_flops(text, None, [AnsweredRow(5, 1, ((1, 2, 2),))])
    with pytest.raises(ValueError, match="prompt token"):
        AnsweredRow(0, 1)


def test_rows_of_a_call_take_their_images_in_order() -> None:
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    image = torch.tensor([[0, 0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 1, 0, 0]], dtype=torch.bool)
    new = torch.tensor([[1, 1, 0], [1, 1, 1]])
    grids = torch.tensor([[1, 2, 2], [1, 2, 2], [1, 2, 2]])  # one token each after a 2 x 2 merge
    rows = answered_rows(mask, new, image, grids, merge=2)
    assert rows == [
        AnsweredRow(6, 2, ((1, 2, 2),)),
        AnsweredRow(7, 3, ((1, 2, 2), (1, 2, 2))),
    ]
    with pytest.raises(ValueError, match="left over"):
        answered_rows(mask, new, image, torch.cat([grids, grids[:1]]), merge=2)
    with pytest.raises(ValueError, match="more image placeholders"):
        answered_rows(mask, new, image, grids[:2], merge=2)
    assert Flops(1, 2, 3).total == 6
