"""What differs between the transformers releases radcaliper supports (5.17 to 5.24).

transformers 5.24 renamed the key-value cache from ``past_key_values`` to ``cache``: in model
forwards (the old name still works there, with a ``FutureWarning``), in output fields (the old
name is gone) and in ``compute_3d_position_ids`` (the old name raises). Code that hands a cache
to transformers or reads one back uses :data:`CACHE` as the name.

5.24 also renamed ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable`` (the
old name warns); :func:`enable_checkpointing` calls whichever the release has.
"""

from __future__ import annotations

from typing import Any

from transformers.modeling_outputs import BaseModelOutputWithPast

__all__ = ["CACHE", "enable_checkpointing"]

CACHE: str = (
    "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
)
"""The keyword and output field of the key-value cache in the installed transformers."""


def enable_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward pass (non-reentrant ``torch``
    checkpointing, which works with frozen inputs)."""
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
