"""Task language: the prompt and answer texts of the find, measure, point and axes tasks, their
parsing, the answer grammars and the tokenizer.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.tasks.axes import (
        Segment,
        axes_prompt,
        parse_axes,
    )
    from model.measurer.tasks.text import (
        FoundFinding,
        ParsedMeasure,
        find_prompt,
        measure_prompt,
        parse_find,
        parse_measure,
        parse_point,
        point_prompt,
    )
    from model.measurer.tasks.tokenizer import (
        NUM,
        VOCAB,
        build_tokenizer,
        load_tokenizer,
        special_ids,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.tasks.axes": (
        "Segment",
        "axes_prompt",
        "parse_axes",
    ),
    "model.measurer.tasks.text": (
        "FoundFinding",
        "ParsedMeasure",
        "find_prompt",
        "measure_prompt",
        "parse_find",
        "parse_measure",
        "parse_point",
        "point_prompt",
    ),
    "model.measurer.tasks.tokenizer": (
        "NUM",
        "VOCAB",
        "build_tokenizer",
        "load_tokenizer",
        "special_ids",
    ),
}

__all__ = [
    "NUM",
    "VOCAB",
    "FoundFinding",
    "ParsedMeasure",
    "Segment",
    "axes_prompt",
    "build_tokenizer",
    "find_prompt",
    "load_tokenizer",
    "measure_prompt",
    "parse_axes",
    "parse_find",
    "parse_measure",
    "parse_point",
    "point_prompt",
    "special_ids",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
