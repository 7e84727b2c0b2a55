"""Circle-RoPE for Qwen2.5-VL: decoupled image positions (CIP) and alternating geometry (AGE).

``positions`` computes the ids (pure torch/NumPy); ``config`` and ``modeling`` extend transformers'
Qwen2.5-VL classes. Names are served lazily (PEP 562), so importing the package does not import
transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.circle_rope.config import AgeStrategy, CircleRopeQwen2_5_VLConfig, circle_layers
    from model.circle_rope.modeling import (
        CircleRopeQwen2_5_VLForConditionalGeneration,
        CircleRopeQwen2_5_VLModel,
        CircleRopeQwen2_5_VLTextModel,
        CircleRopeRotaryEmbedding,
        register_auto_classes,
        split_position_ids,
    )
    from model.circle_rope.positions import (
        MultimodalPositions,
        circle_coordinates,
        circle_rope_position_ids,
        mrope_position_ids,
        multimodal_position_ids,
        per_token_distance,
        resolve_radius,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.circle_rope.config": ("AgeStrategy", "CircleRopeQwen2_5_VLConfig", "circle_layers"),
    "model.circle_rope.modeling": (
        "CircleRopeQwen2_5_VLForConditionalGeneration",
        "CircleRopeQwen2_5_VLModel",
        "CircleRopeQwen2_5_VLTextModel",
        "CircleRopeRotaryEmbedding",
        "register_auto_classes",
        "split_position_ids",
    ),
    "model.circle_rope.positions": (
        "MultimodalPositions",
        "circle_coordinates",
        "circle_rope_position_ids",
        "mrope_position_ids",
        "multimodal_position_ids",
        "per_token_distance",
        "resolve_radius",
    ),
}
__all__ = [
    "AgeStrategy",
    "CircleRopeQwen2_5_VLConfig",
    "CircleRopeQwen2_5_VLForConditionalGeneration",
    "CircleRopeQwen2_5_VLModel",
    "CircleRopeQwen2_5_VLTextModel",
    "CircleRopeRotaryEmbedding",
    "MultimodalPositions",
    "circle_coordinates",
    "circle_layers",
    "circle_rope_position_ids",
    "mrope_position_ids",
    "multimodal_position_ids",
    "per_token_distance",
    "register_auto_classes",
    "resolve_radius",
    "split_position_ids",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
