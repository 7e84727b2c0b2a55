"""Evaluation: scoring a measurer against the truth, agreement metrics, and the comparison of
numeric and positional modes.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.evaluate.comparison import (
        Comparison,
        compare,
    )
    from model.measurer.evaluate.metrics import (
        numeric_metrics,
    )
    from model.measurer.evaluate.scoring import (
        Evaluation,
        StudyOutcome,
        evaluate,
        score_study,
        summarize,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.evaluate.comparison": (
        "Comparison",
        "compare",
    ),
    "model.measurer.evaluate.metrics": ("numeric_metrics",),
    "model.measurer.evaluate.scoring": (
        "Evaluation",
        "StudyOutcome",
        "evaluate",
        "score_study",
        "summarize",
    ),
}

__all__ = [
    "Comparison",
    "Evaluation",
    "StudyOutcome",
    "compare",
    "evaluate",
    "numeric_metrics",
    "score_study",
    "summarize",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
