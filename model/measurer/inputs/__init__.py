"""Model inputs shared by training and inference: the input settings, images and crops, find planes
(tiles and shifted passes) and the encoded examples of each task.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.inputs.data import (
        Batch,
        MeasureExample,
        collate,
        encode_example,
        measure_example,
    )
    from model.measurer.inputs.find import (
        FindExample,
        find_planes,
        prepare_find_field,
    )
    from model.measurer.inputs.images import (
        crop_around,
        find_images,
    )
    from model.measurer.inputs.settings import (
        FindInputs,
        FindVoting,
        MeasureInputs,
    )
    from model.measurer.inputs.view import (
        LesionView,
        view_crop,
        view_images,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.inputs.view": ("LesionView", "view_crop", "view_images"),
    "model.measurer.inputs.data": (
        "Batch",
        "MeasureExample",
        "collate",
        "encode_example",
        "measure_example",
    ),
    "model.measurer.inputs.find": (
        "FindExample",
        "find_planes",
        "prepare_find_field",
    ),
    "model.measurer.inputs.images": (
        "crop_around",
        "find_images",
    ),
    "model.measurer.inputs.settings": (
        "FindInputs",
        "FindVoting",
        "MeasureInputs",
    ),
}

__all__ = [
    "Batch",
    "FindExample",
    "FindInputs",
    "FindVoting",
    "LesionView",
    "MeasureExample",
    "MeasureInputs",
    "collate",
    "crop_around",
    "encode_example",
    "find_images",
    "find_planes",
    "measure_example",
    "prepare_find_field",
    "view_crop",
    "view_images",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
