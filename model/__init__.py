"""radcaliper ``model`` package: the measuring model and its parts.

- ``model.numeric``: RNED numbers in and out of a language model (codec, heads, generation).
- ``model.circle_rope``: Circle-RoPE / AGE positions and the Qwen2.5-VL variant that uses them.
- ``model.backbone``: tiny Qwen2.5-VL configurations for CPU tests, benchmarks and the default.

The most used names are re-exported here, lazily (importing ``model`` imports no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.backbone import tiny_qwen2_5_vl_kwargs
    from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.circle_rope.positions import circle_rope_position_ids
    from model.numeric.codec import RotaryNumberCodec
    from model.numeric.hf import NumericLM

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.backbone": ("tiny_qwen2_5_vl_kwargs",),
    "model.circle_rope.config": ("CircleRopeQwen2_5_VLConfig",),
    "model.circle_rope.modeling": ("CircleRopeQwen2_5_VLForConditionalGeneration",),
    "model.circle_rope.positions": ("circle_rope_position_ids",),
    "model.numeric.codec": ("RotaryNumberCodec",),
    "model.numeric.hf": ("NumericLM",),
}
__all__ = [
    "CircleRopeQwen2_5_VLConfig",
    "CircleRopeQwen2_5_VLForConditionalGeneration",
    "NumericLM",
    "RotaryNumberCodec",
    "circle_rope_position_ids",
    "tiny_qwen2_5_vl_kwargs",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
