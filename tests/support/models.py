"""Tiny model configurations shared by model tests."""

from __future__ import annotations

from transformers import (
    Qwen2_5_VLConfig,
)

from model.backbone import tiny_qwen2_5_vl_kwargs

PAD, BOS, EOS, NUM = 0, 1, 2, 3  # text tokens are 10..279
IMAGE, VIDEO, VISION_START, VISION_END = 290, 291, 292, 293
VOCAB, HIDDEN = 300, 64
# sdpa (transformers' default) and eager both give incremental == full forward to ~1e-7 in float32
# on CPU; sdpa is pinned.
ATTN = "sdpa"


def tiny_vl_config() -> Qwen2_5_VLConfig:
    """Hidden 64, 2 layers, 4 heads (2 kv), vision depth 1 / hidden 32 / patch 14 / merge 2."""
    return Qwen2_5_VLConfig(
        **tiny_qwen2_5_vl_kwargs(
            hidden_size=HIDDEN,
            vocab_size=VOCAB,
            max_positions=512,
            special_ids={
                "bos": BOS,
                "eos": EOS,
                "pad": PAD,
                "image": IMAGE,
                "video": VIDEO,
                "vision_start": VISION_START,
                "vision_end": VISION_END,
            },
            attn_implementation=ATTN,
        )
    )
