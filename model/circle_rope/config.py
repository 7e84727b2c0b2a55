"""Configuration of the Circle-RoPE Qwen2.5-VL variant: Qwen2.5-VL's config plus four keys.

``circle_rope_alpha``        angle mix (SA weight), in [0, 1]; default 0.5
``circle_rope_radius``       a number, "auto" or "auto-<s>"; default 10
``circle_rope_strategy``     which layers use Circle-RoPE (AGE, paper sec. 4.2; ``AgeStrategy``);
                             default "alternate" (layer 0 Circle, layer 1 M-RoPE, ...)
``circle_rope_frame_stride`` shift of each frame's circle centre along [1, 1, 1] for multi-frame
                             images (paper sec. 4.3); default 1

The keys live at the top level of ``config.json`` next to Qwen2.5-VL's own, with the model type
``circle_rope_qwen2_5_vl``, so a saved model cannot be mistaken for (and silently loaded as) a
plain Qwen2.5-VL.
"""

from __future__ import annotations

import enum
import math
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import Qwen2_5_VLConfig

from model.circle_rope.positions import (
    DEFAULT_ALPHA,
    DEFAULT_FRAME_STRIDE,
    DEFAULT_RADIUS,
    resolve_radius,
)

__all__ = ["AgeStrategy", "CircleRopeQwen2_5_VLConfig", "circle_layers"]


class AgeStrategy(enum.StrEnum):
    """Which decoder layers use Circle-RoPE; the others use M-RoPE (0-based layer l of n)."""

    ALTERNATE = "alternate"  # l even (the reference default)
    ALL = "all"  # every layer
    FIRST_HALF = "first_half"  # l < n // 2
    SECOND_HALF = "second_half"  # l >= n // 2
    OFF = "off"  # none: exactly Qwen2.5-VL


def circle_layers(strategy: AgeStrategy | str, num_layers: int) -> tuple[bool, ...]:
    """-> per layer, True where it uses Circle-RoPE."""
    s = _strategy(strategy)
    half = num_layers // 2
    rule = {
        AgeStrategy.ALTERNATE: lambda layer: layer % 2 == 0,
        AgeStrategy.ALL: lambda layer: True,
        AgeStrategy.FIRST_HALF: lambda layer: layer < half,
        AgeStrategy.SECOND_HALF: lambda layer: layer >= half,
        AgeStrategy.OFF: lambda layer: False,
    }[s]
    return tuple(rule(layer) for layer in range(num_layers))


def _strategy(value: AgeStrategy | str) -> AgeStrategy:
    try:
        return AgeStrategy(value)
    except ValueError:
        choices = ", ".join(s.value for s in AgeStrategy)
        raise ValueError(f"circle_rope_strategy {value!r} is not one of: {choices}") from None


@strict
class CircleRopeQwen2_5_VLConfig(Qwen2_5_VLConfig):
    """Qwen2.5-VL config with Circle-RoPE keys (module doc). Invalid values raise ValueError."""

    model_type = "circle_rope_qwen2_5_vl"

    circle_rope_alpha: float | int = DEFAULT_ALPHA
    circle_rope_radius: float | int | str = DEFAULT_RADIUS
    circle_rope_strategy: str = AgeStrategy.ALTERNATE.value
    circle_rope_frame_stride: float | int = DEFAULT_FRAME_STRIDE

    def __post_init__(self, **kwargs: Any) -> None:
        kwargs.pop("model_type", None)  # loading a plain Qwen2.5-VL directory converts it
        super().__post_init__(**kwargs)
        self.model_type = type(self).model_type  # type: ignore[misc]
        alpha = self.circle_rope_alpha
        if isinstance(alpha, bool) or not 0 <= alpha <= 1:
            raise ValueError(f"circle_rope_alpha must be in [0, 1], got {alpha!r}")
        resolve_radius(self.circle_rope_radius, 1, 1)  # raises with the accepted forms
        self.circle_rope_strategy = _strategy(self.circle_rope_strategy).value
        if not math.isfinite(self.circle_rope_frame_stride):
            raise ValueError(
                f"circle_rope_frame_stride must be finite, got {self.circle_rope_frame_stride!r}"
            )

    def circle_layers(self) -> tuple[bool, ...]:
        """Per decoder layer, True where it uses Circle-RoPE."""
        text: Any = self.text_config
        return circle_layers(self.circle_rope_strategy, text.num_hidden_layers)

    @classmethod
    def from_qwen2_5_vl_config(
        cls, config: Qwen2_5_VLConfig, **circle_rope: Any
    ) -> CircleRopeQwen2_5_VLConfig:
        """A plain Qwen2.5-VL config plus Circle-RoPE keys (``circle_rope_alpha=...`` etc.)."""
        unknown = sorted(k for k in circle_rope if not k.startswith("circle_rope_"))
        if unknown:
            raise ValueError(f"not Circle-RoPE settings: {unknown}; use circle_rope_* keys")
        values = config.to_dict()
        values.pop("model_type", None)
        values.pop("transformers_version", None)
        values.update(circle_rope)
        return cls(**values)
