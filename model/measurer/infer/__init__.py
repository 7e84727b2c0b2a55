"""Inference: the checkpoint measurer, its named stages and what they share, and the steps they use
(answers, grouping in 3-D, planes, one report per object).

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.infer.click import (
        ClickCaliper,
    )
    from model.measurer.infer.pipeline import (
        CheckpointMeasurer,
    )
    from model.measurer.infer.stages import (
        ALL_STAGES,
        default_stages,
        stages_named,
    )
    from model.measurer.infer.state import (
        InferenceOptions,
        InferenceStage,
        StudyState,
        Trace,
        TraceEvent,
        run_stages,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.infer.click": ("ClickCaliper",),
    "model.measurer.infer.pipeline": ("CheckpointMeasurer",),
    "model.measurer.infer.stages": (
        "ALL_STAGES",
        "default_stages",
        "stages_named",
    ),
    "model.measurer.infer.state": (
        "InferenceOptions",
        "InferenceStage",
        "StudyState",
        "Trace",
        "TraceEvent",
        "run_stages",
    ),
}

__all__ = [
    "ALL_STAGES",
    "CheckpointMeasurer",
    "ClickCaliper",
    "InferenceOptions",
    "InferenceStage",
    "StudyState",
    "Trace",
    "TraceEvent",
    "default_stages",
    "run_stages",
    "stages_named",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
