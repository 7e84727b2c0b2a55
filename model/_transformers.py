"""What differs between the transformers releases radcaliper supports (5.17 to 5.24).

transformers 5.24 renamed the key-value cache from ``past_key_values`` to ``cache``: in model
forwards (the old name still works there, with a ``FutureWarning``), in output fields (the old
name is gone) and in ``compute_3d_position_ids`` (the old name raises). Code that hands a cache
to transformers or reads one back uses :data:`CACHE` as the name.
"""

from __future__ import annotations

from transformers.modeling_outputs import BaseModelOutputWithPast

__all__ = ["CACHE"]

CACHE: str = (
    "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
)
"""The keyword and output field of the key-value cache in the installed transformers."""
