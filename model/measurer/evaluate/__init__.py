"""Evaluation: scoring a measurer against the truth, agreement metrics, the comparison of
numeric and positional modes, and where a simulated reader clicks (the click task).

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.evaluate.clicks import (
        LUNG_HU,
        ClickPoints,
        lesion_clicks,
        negative_click,
    )
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
    "model.measurer.evaluate.clicks": ("LUNG_HU", "ClickPoints", "lesion_clicks", "negative_click"),
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
    "LUNG_HU",
    "ClickPoints",
    "Comparison",
    "Evaluation",
    "StudyOutcome",
    "compare",
    "evaluate",
    "lesion_clicks",
    "negative_click",
    "numeric_metrics",
    "score_study",
    "summarize",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
