"""Numbers in and out of a language model: RNED codec, losses, text <-> [NUM], heads, generation.

Names are served lazily (PEP 562): ``model.numeric.text`` is pure Python and must not pay for
importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model.numeric.protocol import NumericHead
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

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.numeric.protocol": ("NumericHead",),
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
_LAZY = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = [
    "GLUED_UNITS",
    "NUM_TOKEN",
    "NumText",
    "NumericHead",
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
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'model.numeric' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
