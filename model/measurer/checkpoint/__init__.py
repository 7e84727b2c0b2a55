"""Checkpoints: settings and identity (``radcaliper.json``), saving, loading and export, the
Qwen2.5-VL backbone with LoRA, and the validated domain.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.checkpoint.base import (
        load_base_model,
    )
    from model.measurer.checkpoint.domain import (
        Domain,
    )
    from model.measurer.checkpoint.settings import (
        MeasurerSettings,
        NumericMode,
        checkpoint_hash,
        default_checkpoint,
        read_settings,
        write_settings,
    )
    from model.measurer.checkpoint.weights import (
        LoadedMeasurer,
        export_checkpoint,
        load_checkpoint,
        save_checkpoint,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.checkpoint.base": ("load_base_model",),
    "model.measurer.checkpoint.domain": ("Domain",),
    "model.measurer.checkpoint.settings": (
        "MeasurerSettings",
        "NumericMode",
        "checkpoint_hash",
        "default_checkpoint",
        "read_settings",
        "write_settings",
    ),
    "model.measurer.checkpoint.weights": (
        "LoadedMeasurer",
        "export_checkpoint",
        "load_checkpoint",
        "save_checkpoint",
    ),
}

__all__ = [
    "Domain",
    "LoadedMeasurer",
    "MeasurerSettings",
    "NumericMode",
    "checkpoint_hash",
    "default_checkpoint",
    "export_checkpoint",
    "load_base_model",
    "load_checkpoint",
    "read_settings",
    "save_checkpoint",
    "write_settings",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
