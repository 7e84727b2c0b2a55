"""A training study (a volume and its true findings) and a source of numbered studies: what the
study sources, the hybrid generator, the pool and evaluation share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ingestion.dataset.format import TrueFinding
from ingestion.volume import Volume

__all__ = [
    "StudySource",
    "TrainingStudy",
]


@dataclass(frozen=True, eq=False)
class TrainingStudy:
    """A volume and its true findings.

    Args:
        volume: the image.
        findings: the true findings (``negatives`` excluded).
        name: for reports (a path or "phantom 12").
        negatives: places a reviewer said hold no finding (evaluation counts a report there as
            false; training does not use them yet).
        annotated: the kinds annotated exhaustively (a report of another kind is unjudged).
    """

    volume: Volume
    findings: tuple[TrueFinding, ...]
    name: str
    negatives: tuple[TrueFinding, ...] = ()
    annotated: tuple[str, ...] = ("lesion", "vessel")


class StudySource(Protocol):
    """Numbered training studies (index >= 0; a finite source repeats itself)."""

    def study(self, index: int) -> TrainingStudy: ...

    def describe(self) -> dict[str, object]:
        """Provenance for the checkpoint's model card."""
        ...
