"""Training material: sources of studies with their truth, hybrid studies (real backgrounds with
inserted lesions) and the rolling pool of examples training draws from.

Names are served lazily (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from model.measurer.data.hybrid import (
        HybridSource,
        write_hybrid_dataset,
    )
    from model.measurer.data.pool import (
        StudyPool,
    )
    from model.measurer.data.reads import (
        ReadsClicks,
        hybrid_lesions,
        lesion_from_reads,
    )
    from model.measurer.data.sources import (
        DatasetSource,
        FolderSource,
        MixedSource,
        PhantomSource,
        parse_sources,
    )
    from model.measurer.data.study import (
        StudySource,
        TrainingStudy,
    )

_SOURCES: dict[str, tuple[str, ...]] = {
    "model.measurer.data.reads": ("ReadsClicks", "hybrid_lesions", "lesion_from_reads"),
    "model.measurer.data.hybrid": (
        "HybridSource",
        "write_hybrid_dataset",
    ),
    "model.measurer.data.pool": ("StudyPool",),
    "model.measurer.data.sources": (
        "DatasetSource",
        "FolderSource",
        "MixedSource",
        "PhantomSource",
        "parse_sources",
    ),
    "model.measurer.data.study": (
        "StudySource",
        "TrainingStudy",
    ),
}

__all__ = [
    "DatasetSource",
    "FolderSource",
    "HybridSource",
    "MixedSource",
    "PhantomSource",
    "ReadsClicks",
    "StudyPool",
    "StudySource",
    "TrainingStudy",
    "hybrid_lesions",
    "lesion_from_reads",
    "parse_sources",
    "write_hybrid_dataset",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
