"""Qwen2.5-VL configurations: tiny ones that run on a CPU, and the published 3B and 7B shapes.

Tests, benchmarks and the default model build their backbones here, so the shapes that must agree
(head dim, M-RoPE sections, token ids inside the vocabulary) are worked out once. The published
shapes (:data:`QWEN2_5_VL_SHAPES`, from the released ``config.json`` files) let a check build a
random-init model of a real checkpoint's size where no weights can be downloaded
(``benchmarks/gpu_check.sh``); ``narrow=True`` keeps everything but the widths and depths, for
the same check on a CPU.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "QWEN2_5_VL_SHAPES",
    "QWEN_SPECIAL_TOKENS",
    "published_qwen2_5_vl_kwargs",
    "tiny_qwen2_5_vl_kwargs",
]

QWEN2_5_VL_SHAPES: dict[str, dict[str, int | bool]] = {
    "3b": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "7b": {
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}
"""The language model of Qwen2.5-VL-3B and -7B (Instruct) as released; both share the vision
tower below (32 blocks of width 1280, windows of 112 pixels, full attention in blocks 7, 15, 23
and 31)."""

QWEN_SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
"""Qwen2.5-VL's special tokens at their released ids (the same in 3B and 7B)."""

_VISION_TOWER = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
}


def published_qwen2_5_vl_kwargs(
    shape: str, *, narrow: bool = False, attn_implementation: str = "sdpa"
) -> dict[str, Any]:
    """Keyword arguments of ``Qwen2_5_VLConfig`` for a published shape (``"3b"``, ``"7b"``).

    Token ids, vocabulary size, tied or untied output embeddings, M-RoPE sections and the vision
    tower's windows are the released model's. ``narrow``: the same except widths and depths (a
    2-layer language model of width 64, a 2-block vision tower of width 32 whose first block
    uses windows and whose last attends fully), which runs on a CPU.
    """
    if shape not in QWEN2_5_VL_SHAPES:
        known = sorted(QWEN2_5_VL_SHAPES)
        raise ValueError(f"unknown Qwen2.5-VL shape {shape!r}: use one of {known}")
    text: dict[str, Any] = dict(QWEN2_5_VL_SHAPES[shape])
    vision: dict[str, Any] = dict(_VISION_TOWER)
    if narrow:
        text.update(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        vision.update(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, fullatt_block_indexes=[1]
        )
    tied = bool(text.pop("tie_word_embeddings"))
    sections = [16, 24, 24]  # of the 64 frequencies per head of width 128
    if narrow:  # 8 frequencies per head of width 16
        sections = [2, 3, 3]
    ids = QWEN_SPECIAL_TOKENS
    text.update(
        max_position_embeddings=128000,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=tied,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": sections,
        },
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision["out_hidden_size"] = text["hidden_size"]
    return {
        "text_config": text,
        "vision_config": vision,
        "tie_word_embeddings": tied,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "attn_implementation": attn_implementation,
    }


def tiny_qwen2_5_vl_kwargs(
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 300,
    special_ids: dict[str, int] | None = None,
    max_positions: int = 4096,
    initializer_range: float = 0.1,
    vision_hidden: int = 32,
    attn_implementation: str = "sdpa",
) -> dict[str, Any]:
    """Keyword arguments of ``Qwen2_5_VLConfig`` (or a subclass) for a tiny model.

    ``special_ids`` maps ``bos``, ``eos``, ``pad``, ``image``, ``video``, ``vision_start`` and
    ``vision_end`` to token ids (defaults: 1, 2, 0 and the last four ids of the vocabulary). The
    head dim's frequencies are split over (t, h, w) as evenly as Qwen2.5-VL's [16, 24, 24]. The
    vision tower is one block of width ``vision_hidden`` with 14-pixel patches, merge 2, temporal
    patch 2, full attention. ``initializer_range`` 0.1 gives logits of order 1-10, so that
    comparisons at 1e-4 mean something.
    """
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise ValueError(f"hidden_size {hidden_size} must split into {num_heads} even-sized heads")
    ids = {
        "bos": 1,
        "eos": 2,
        "pad": 0,
        "image": vocab_size - 4,
        "video": vocab_size - 3,
        "vision_start": vocab_size - 2,
        "vision_end": vocab_size - 1,
    }
    ids.update(special_ids or {})
    bad = {k: v for k, v in ids.items() if not 0 <= v < vocab_size}
    if bad:
        raise ValueError(f"special token ids {bad} are outside the vocabulary of {vocab_size}")
    half = hidden_size // num_heads // 2  # frequencies per head
    third = half // 3
    return {
        "text_config": {
            "vocab_size": vocab_size,
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": max_positions,
            "initializer_range": initializer_range,
            "rope_parameters": {
                "rope_type": "default",
                "mrope_section": [half - 2 * third, third, third],
            },
            "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"],
            "pad_token_id": ids["pad"],
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": vision_hidden,
            "intermediate_size": 2 * vision_hidden,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden_size,
            "window_size": 56,
            "fullatt_block_indexes": [0],
        },
        "image_token_id": ids["image"],
        "video_token_id": ids["video"],
        "vision_start_token_id": ids["vision_start"],
        "vision_end_token_id": ids["vision_end"],
        "attn_implementation": attn_implementation,
    }
