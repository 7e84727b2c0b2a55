"""Numbers in and out of a language model: RNED codec, losses, text <-> [NUM], heads, generation.

Names are served lazily (PEP 562): ``model.numeric.text`` is pure Python and must not pay for
importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.numeric.codec import RotaryNumberCodec, rotary_frequencies, rotate_blocks
    from model.numeric.generation import NumericGeneration, generate_numeric
    from model.numeric.hf import NumericLM, NumericLMOutput
    from model.numeric.losses import (
        LambdaRamp,
        candidate_softmax_loss,
        rotation_cosine_loss,
        score_mse_loss,
    )
    from model.numeric.protocol import NumericHead
    from model.numeric.rned_head import RnedHead
    from model.numeric.text import (
        GLUED_UNITS,
        NUM_TOKEN,
        NumText,
        ParsedAnswer,
        answer_text,
        format_box,
        format_dual,
        format_single,
        from_num_text,
        parse_box,
        parse_dual,
        parse_single,
        parse_values,
        to_num_text,
    )
    from model.numeric.xval import XValHead

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.numeric.codec": ("RotaryNumberCodec", "rotary_frequencies", "rotate_blocks"),
    "model.numeric.generation": ("NumericGeneration", "generate_numeric"),
    "model.numeric.hf": ("NumericLM", "NumericLMOutput"),
    "model.numeric.losses": (
        "LambdaRamp",
        "candidate_softmax_loss",
        "rotation_cosine_loss",
        "score_mse_loss",
    ),
    "model.numeric.protocol": ("NumericHead",),
    "model.numeric.rned_head": ("RnedHead",),
    "model.numeric.xval": ("XValHead",),
    "model.numeric.text": (
        "GLUED_UNITS",
        "NUM_TOKEN",
        "NumText",
        "ParsedAnswer",
        "answer_text",
        "format_box",
        "format_dual",
        "format_single",
        "from_num_text",
        "parse_box",
        "parse_dual",
        "parse_single",
        "parse_values",
        "to_num_text",
    ),
}
__all__ = [
    "GLUED_UNITS",
    "NUM_TOKEN",
    "LambdaRamp",
    "NumText",
    "NumericGeneration",
    "NumericHead",
    "NumericLM",
    "NumericLMOutput",
    "ParsedAnswer",
    "RnedHead",
    "RotaryNumberCodec",
    "XValHead",
    "answer_text",
    "candidate_softmax_loss",
    "format_box",
    "format_dual",
    "format_single",
    "from_num_text",
    "generate_numeric",
    "parse_box",
    "parse_dual",
    "parse_single",
    "parse_values",
    "rotary_frequencies",
    "rotate_blocks",
    "rotation_cosine_loss",
    "score_mse_loss",
    "to_num_text",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
