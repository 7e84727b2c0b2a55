"""DICOM internals of ingestion: reading a file's header (:mod:`ingestion.dicom.header`, with
the values it derives in :mod:`ingestion.dicom._header_values` and the truncation checks in
:mod:`ingestion.dicom._truncation`), ordering slices into stacks with exact geometry
(:mod:`ingestion.dicom.stack`) and reading their voxels (:mod:`ingestion.dicom.pixels`), with
pydicom's warnings gathered (:mod:`ingestion.dicom._pydicom`).

Callers load series through :mod:`ingestion.load` and :mod:`ingestion.scan`; the names below
are served lazily (PEP 562): importing this package loads neither numpy nor pydicom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from ingestion.dicom.header import SeriesInfo, SliceRef, read_dicom_header
    from ingestion.dicom.pixels import read_stack_voxels
    from ingestion.dicom.stack import SeriesRef, build_stack

_SOURCES: dict[str, tuple[str, ...]] = {
    "ingestion.dicom.header": ("SeriesInfo", "SliceRef", "read_dicom_header"),
    "ingestion.dicom.pixels": ("read_stack_voxels",),
    "ingestion.dicom.stack": ("SeriesRef", "build_stack"),
}
__all__ = [
    "SeriesInfo",
    "SeriesRef",
    "SliceRef",
    "build_stack",
    "read_dicom_header",
    "read_stack_voxels",
]

if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())
