"""Tiny Qwen2.5-VL configurations: transformers' own classes at a size that runs on a CPU.

Tests, benchmarks and the default model build their backbones here, so the shapes that must agree
(head dim, M-RoPE sections, token ids inside the vocabulary) are worked out once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tiny_qwen2_5_vl_kwargs"]


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
