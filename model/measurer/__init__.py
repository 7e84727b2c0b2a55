"""The measurer: a vision-language model that finds and measures lesions and vessels on CT.

Its code is arranged by lifecycle; each subpackage names its own public surface:

- ``tasks``: the task language (prompt and answer texts, parsing, grammars, tokenizer);
- ``inputs``: model inputs shared by training and inference (input settings, images, crops,
  find planes, encoded examples);
- ``data``: training material (study sources, hybrid studies, the pool of examples);
- ``train``: training (configuration, loop, resumable state, validated domain, memory);
- ``infer``: inference (the checkpoint measurer and its named stages);
- ``calibrate``: calibrated ranges, decode checks, the operating point;
- ``evaluate``: scoring, metrics, comparison of modes;
- ``checkpoint``: settings, saving and loading, the Qwen2.5-VL backbone with LoRA, the domain.

This package exports what the app needs at the top level: the :class:`Measurer` protocol, the
checkpoint measurer and how it is loaded, and the result types.

Names are served lazily (PEP 562): ``import model.measurer`` imports neither torch nor
transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.checkpoint.settings import (
        MeasurerSettings,
        NumericMode,
        checkpoint_hash,
        default_checkpoint,
        read_settings,
    )
    from model.measurer.data.sources import (
        DatasetSource,
        PhantomSource,
    )
    from model.measurer.data.study import (
        StudySource,
    )
    from model.measurer.evaluate.scoring import (
        Evaluation,
    )
    from model.measurer.infer.pipeline import (
        CheckpointMeasurer,
    )
    from model.measurer.infer.state import (
        InferenceOptions,
        TraceEvent,
    )
    from model.measurer.protocol import (
        Measurer,
    )
    from model.measurer.results import (
        MEASUREMENTS_OF,
        NOT_MEASURABLE,
        FindingKind,
        Measurement,
        MeasurementName,
        ModelInfo,
        Segment3,
        StudyFinding,
        StudyResult,
        renumber,
    )
    from model.measurer.train.config import (
        TrainConfig,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.checkpoint.settings": (
        "MeasurerSettings",
        "NumericMode",
        "checkpoint_hash",
        "default_checkpoint",
        "read_settings",
    ),
    "model.measurer.data.sources": (
        "DatasetSource",
        "PhantomSource",
    ),
    "model.measurer.data.study": ("StudySource",),
    "model.measurer.evaluate.scoring": ("Evaluation",),
    "model.measurer.infer.pipeline": ("CheckpointMeasurer",),
    "model.measurer.infer.state": (
        "InferenceOptions",
        "TraceEvent",
    ),
    "model.measurer.protocol": ("Measurer",),
    "model.measurer.results": (
        "FindingKind",
        "MEASUREMENTS_OF",
        "Measurement",
        "MeasurementName",
        "ModelInfo",
        "NOT_MEASURABLE",
        "Segment3",
        "StudyFinding",
        "StudyResult",
        "renumber",
    ),
    "model.measurer.train.config": ("TrainConfig",),
}

__all__ = [
    "MEASUREMENTS_OF",
    "NOT_MEASURABLE",
    "CheckpointMeasurer",
    "DatasetSource",
    "Evaluation",
    "FindingKind",
    "InferenceOptions",
    "Measurement",
    "MeasurementName",
    "Measurer",
    "MeasurerSettings",
    "ModelInfo",
    "NumericMode",
    "PhantomSource",
    "Segment3",
    "StudyFinding",
    "StudyResult",
    "StudySource",
    "TraceEvent",
    "TrainConfig",
    "checkpoint_hash",
    "default_checkpoint",
    "read_settings",
    "renumber",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
