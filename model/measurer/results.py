"""What a measurer returns: findings with measurements and calibrated ranges, and the model's name.

The JSON form (``StudyResult.to_json``) is the contract of ``radcaliper measure --json``
(``shared/design/architecture.md``)::

    {"study_instance_uid": ..., "series_instance_uid": ..., "patient_id": ..., "source": ...,
     "model": {"name", "version", "numeric_mode", "not_for_clinical_use"},
     "findings": [{"id", "kind", "center_lps_mm", "slice_index",
                   "measurements": [{"name", "value_mm", "range_mm", "coverage"}]}]}

A measurement the model could not make honestly has ``value_mm`` null and a ``qualifier`` ("not
measurable") with the reason: radcaliper never invents a number. Pure Python; no torch.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CALIPER_TOLERANCE_MM",
    "MEASUREMENTS_OF",
    "NOT_MEASURABLE",
    "FindingKind",
    "Measurement",
    "MeasurementName",
    "ModelInfo",
    "Segment3",
    "StudyFinding",
    "StudyResult",
    "renumber",
]

NOT_MEASURABLE = "not measurable"

#: how far a value may be from its end points' distance (half the 0.1 mm grid values are
#: written on): the measurement is the caliper (architecture.md, "Geometry and units")
CALIPER_TOLERANCE_MM = 0.05

Vector3 = tuple[float, float, float]


class FindingKind(enum.StrEnum):
    """What a finding is."""

    LESION = "lesion"
    VESSEL = "vessel"


class MeasurementName(enum.StrEnum):
    """RECIST-style axial measurements (architecture.md, "Geometry and units")."""

    LONG_AXIS = "long_axis"  # lesion: longest diameter on the axial slice
    SHORT_AXIS = "short_axis"  # lesion: longest diameter perpendicular to it
    DIAMETER = "diameter"  # vessel: diameter of the cross-section


#: measurement names each kind of finding carries, in output order
MEASUREMENTS_OF: dict[FindingKind, tuple[MeasurementName, ...]] = {
    FindingKind.LESION: (MeasurementName.LONG_AXIS, MeasurementName.SHORT_AXIS),
    FindingKind.VESSEL: (MeasurementName.DIAMETER,),
}


@dataclass(frozen=True)
class Measurement:
    """One value in mm with its calibrated range, or "not measurable" with the reason.

    Args:
        name: what was measured.
        value_mm: the value (finite, >= 0), or None when not measurable.
        range_mm: (low, high) containing ``value_mm``, or None when there is no calibration.
        coverage: nominal coverage of ``range_mm`` (0 < coverage < 1), given with the range.
        qualifier: ``NOT_MEASURABLE`` when ``value_mm`` is None, else None.
        reason: why it is not measurable (for people; not parsed).
    """

    name: MeasurementName
    value_mm: float | None
    range_mm: tuple[float, float] | None = None
    coverage: float | None = None
    qualifier: str | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", MeasurementName(self.name))
        if self.value_mm is None:
            if self.qualifier != NOT_MEASURABLE:
                raise ValueError(f"{self.name}: a missing value needs qualifier {NOT_MEASURABLE!r}")
            if self.range_mm is not None:
                raise ValueError(f"{self.name}: a range without a value")
            return
        if self.qualifier is not None:
            raise ValueError(f"{self.name}: qualifier {self.qualifier!r} given with a value")
        if not (math.isfinite(self.value_mm) and self.value_mm >= 0):
            raise ValueError(f"{self.name}: value_mm must be finite and >= 0, got {self.value_mm}")
        if (self.range_mm is None) != (self.coverage is None):
            raise ValueError(f"{self.name}: range_mm and coverage go together")
        if self.range_mm is not None:
            low, high = self.range_mm
            if not (math.isfinite(low) and math.isfinite(high) and low <= self.value_mm <= high):
                raise ValueError(
                    f"{self.name}: range_mm {self.range_mm} must be finite and contain the value "
                    f"{self.value_mm}"
                )
            assert self.coverage is not None
            if not 0 < self.coverage < 1:
                raise ValueError(f"{self.name}: coverage must be in (0, 1), got {self.coverage}")

    @classmethod
    def not_measurable(cls, name: MeasurementName, reason: str) -> Measurement:
        return cls(name, None, qualifier=NOT_MEASURABLE, reason=reason)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name.value,
            "value_mm": self.value_mm,
            "range_mm": None if self.range_mm is None else list(self.range_mm),
            "coverage": self.coverage,
        }
        if self.qualifier is not None:
            out["qualifier"] = self.qualifier
            out["reason"] = self.reason
        return out


Segment3 = tuple[Vector3, Vector3]


@dataclass(frozen=True)
class StudyFinding:
    """One finding of a study: kind, where (LPS mm and the source slice), its measurements and,
    when the model locates them, the measured axes as LPS end points (lesion: long, short;
    vessel: a diameter).

    The measurement is the caliper: each value is its segment's length (within
    ``CALIPER_TOLERANCE_MM``); a finding whose numbers and end points disagree cannot be made.
    A not-measurable value's segment carries no length to check."""

    id: int
    kind: FindingKind
    center_lps_mm: Vector3
    slice_index: int
    measurements: tuple[Measurement, ...]
    axes_lps_mm: tuple[Segment3, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FindingKind(self.kind))
        center = tuple(float(c) for c in self.center_lps_mm)
        if len(center) != 3 or not all(math.isfinite(c) for c in center):
            raise ValueError(f"finding {self.id}: center_lps_mm must be 3 finite numbers")
        object.__setattr__(self, "center_lps_mm", center)
        expected = MEASUREMENTS_OF[self.kind]
        names = tuple(m.name for m in self.measurements)
        if names != expected:
            raise ValueError(
                f"finding {self.id} ({self.kind}): measurements {names} must be {expected}"
            )
        if self.axes_lps_mm is not None:
            axes = tuple(
                tuple(tuple(float(v) for v in point) for point in segment)
                for segment in self.axes_lps_mm
            )
            if len(axes) != len(expected) or any(
                len(segment) != 2
                or any(len(p) != 3 or not all(map(math.isfinite, p)) for p in segment)
                for segment in axes
            ):
                raise ValueError(
                    f"finding {self.id} ({self.kind}): axes_lps_mm must be {len(expected)} "
                    "pairs of finite (x, y, z) points"
                )
            object.__setattr__(self, "axes_lps_mm", axes)
            for measurement, segment in zip(self.measurements, axes, strict=True):
                if measurement.value_mm is None:
                    continue
                drawn = math.dist(segment[0], segment[1])
                if abs(drawn - measurement.value_mm) > CALIPER_TOLERANCE_MM:
                    raise ValueError(
                        f"finding {self.id} ({self.kind}): {measurement.name} is "
                        f"{measurement.value_mm:.2f} mm but its end points are {drawn:.2f} mm "
                        "apart; a value is the distance between its end points"
                    )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "center_lps_mm": list(self.center_lps_mm),
            "slice_index": self.slice_index,
            "measurements": [m.to_json() for m in self.measurements],
            "axes_lps_mm": None
            if self.axes_lps_mm is None
            else [[list(p) for p in segment] for segment in self.axes_lps_mm],
        }


@dataclass(frozen=True)
class ModelInfo:
    """Which model said it: every output names it (clinical honesty)."""

    name: str
    version: str
    numeric_mode: str
    not_for_clinical_use: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "numeric_mode": self.numeric_mode,
            "not_for_clinical_use": self.not_for_clinical_use,
        }


@dataclass(frozen=True)
class StudyResult:
    """The measurer's answer for one series of one study."""

    study_instance_uid: str
    series_instance_uid: str
    patient_id: str
    source: str
    model: ModelInfo
    findings: tuple[StudyFinding, ...]
    warnings: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "study_instance_uid": self.study_instance_uid,
            "series_instance_uid": self.series_instance_uid,
            "patient_id": self.patient_id,
            "source": self.source,
            "model": self.model.to_json(),
            "findings": [f.to_json() for f in self.findings],
        }
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


def renumber(findings: Sequence[StudyFinding]) -> tuple[StudyFinding, ...]:
    """Findings with ids 1..n in the given order."""
    return tuple(dataclasses.replace(f, id=i) for i, f in enumerate(findings, start=1))
