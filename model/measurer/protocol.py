"""The small interface the app uses to measure: ``Measurer``.

``app/`` (CLI, UI, batch) depends on this protocol only, so it can be tested with the real tiny
model or, where a test is about something else, with a fake.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ingestion.volume import Volume
    from model.measurer.results import ModelInfo, StudyFinding, StudyResult

__all__ = ["Measurer"]


@runtime_checkable
class Measurer(Protocol):
    """Finds and measures lesions and vessels in one volume."""

    @property
    def info(self) -> ModelInfo:
        """Name, version and numeric mode of the model (every output carries it)."""
        ...

    @property
    def checkpoint_hash(self) -> str:
        """sha256 of the checkpoint's files: with ``info``, what a stored run names its model by
        (a result is stored once per model and input)."""
        ...

    def measure(self, volume: Volume, *, source: str) -> StudyResult:
        """All findings of ``volume`` with their measurements and calibrated ranges.

        ``source`` (the path the volume came from) is recorded in the result. A volume the model
        cannot handle raises ``ModelError`` with the reason, or yields findings whose
        measurements are "not measurable"; never invented numbers.
        """
        ...

    def measure_at(
        self, volume: Volume, point_lps_mm: tuple[float, float, float]
    ) -> StudyFinding | None:
        """The finding at a clicked point (LPS mm) with its kind and measurements, or None when
        the model sees nothing it can measure there."""
        ...
