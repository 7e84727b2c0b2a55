"""Training the measurer: the run's configuration, the loop and its resumable state, the validated
domain it records and memory estimates.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.train.clicks import (
        ClickTrainConfig,
        train_click_model,
    )
    from model.measurer.train.config import (
        BackboneSize,
        PoolSettings,
        Stage,
        StepReport,
        TrainConfig,
    )
    from model.measurer.train.domain import (
        domain_for_training,
    )
    from model.measurer.train.loop import (
        train,
    )
    from model.measurer.train.memory import (
        MemoryEstimate,
        estimate_training_memory,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.train.clicks": ("ClickTrainConfig", "train_click_model"),
    "model.measurer.train.config": (
        "BackboneSize",
        "PoolSettings",
        "Stage",
        "StepReport",
        "TrainConfig",
    ),
    "model.measurer.train.domain": ("domain_for_training",),
    "model.measurer.train.loop": ("train",),
    "model.measurer.train.memory": (
        "MemoryEstimate",
        "estimate_training_memory",
    ),
}

__all__ = [
    "BackboneSize",
    "ClickTrainConfig",
    "MemoryEstimate",
    "PoolSettings",
    "Stage",
    "StepReport",
    "TrainConfig",
    "domain_for_training",
    "estimate_training_memory",
    "train",
    "train_click_model",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
