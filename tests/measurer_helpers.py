"""A tiny training configuration for tests: the real classes and code at a size that trains a
few steps in seconds on a CPU (``TrainConfig.tiny``)."""

from __future__ import annotations

from typing import Any

from model.measurer.train import TrainConfig

TINY = TrainConfig.tiny()


def tiny_config(**changes: Any) -> TrainConfig:
    """:data:`TINY` with some fields changed."""
    return TrainConfig.tiny(**changes)
