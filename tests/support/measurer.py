"""Tiny training configurations for tests: the real classes and code at a size that trains a
few steps in seconds on a CPU (``TrainConfig.tiny``; :func:`small_base_config` for a local
Qwen2.5-VL directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model.measurer.inputs.data import MeasureInputs
from model.measurer.inputs.find import FindInputs
from model.measurer.train.config import PoolSettings, TrainConfig

TINY = TrainConfig.tiny()


def tiny_config(**changes: Any) -> TrainConfig:
    """:data:`TINY` with some fields changed."""
    return TrainConfig.tiny(**changes)


def small_base_config(base: str | Path, **changes: Any) -> TrainConfig:
    """``TrainConfig.for_base_model(base)`` with small crops, batches, pool and LoRA rank."""
    values: dict[str, Any] = {
        "measure_batch": 2,
        "find_batch": 1,
        "point_batch": 1,
        "measure_inputs": MeasureInputs(
            pixel_mm=1.5, size=56, window=(40.0, 160.0), contrast=False, jitter_mm=2.0
        ),
        "find_inputs": FindInputs(pixel_mm=3.0, size=112, coordinates=False),
        "pool": PoolSettings(size=2, initial=2, studies_per_step=0.0, planes_per_study=1),
        "lora_rank": 4,
        "lora_alpha": 8,
        "threads": 1,
    }
    values.update(changes)
    return TrainConfig.for_base_model(str(base), **values)
