"""Held-out evaluation of a measurer against the truth of phantoms (the issue's metrics).

Matching (phantom-spec.md, "Ground truth"): a true finding is found when a reported finding of
the same kind has its centre within ``max(10 mm, half the true long axis)`` of the true centre
in the axial plane; each reported finding matches at most one true finding (nearest pairs
first). A reported finding that matches nothing is a false finding.

Metrics (:class:`Evaluation`): recall of lesions >= 10 mm long and of vessels, false findings
per study, MAE of long axis, short axis and diameter on matched findings that were measured,
coverage and mean width of the calibrated ranges, the share of answers that parsed, and the
time per study. :func:`calibration_pairs` gives the ``(name, predicted, true)`` pairs that
``fit_calibration`` needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ingestion.phantoms import TruthFinding
from model.measurer.pool import TrainingStudy
from model.measurer.protocol import Measurer
from model.measurer.results import MeasurementName, StudyFinding, StudyResult

__all__ = [
    "Evaluation",
    "MatchedMeasurement",
    "StudyOutcome",
    "calibration_pairs",
    "evaluate",
    "match_findings",
    "summarize",
]

RECALL_MIN_LONG_AXIS_MM = 10.0


def _true_values(finding: TruthFinding) -> dict[MeasurementName, float]:
    if finding.kind == "lesion":
        assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
        return {
            MeasurementName.LONG_AXIS: finding.long_axis_mm,
            MeasurementName.SHORT_AXIS: finding.short_axis_mm,
        }
    assert finding.diameter_mm is not None
    return {MeasurementName.DIAMETER: finding.diameter_mm}


def _radius(finding: TruthFinding) -> float:
    size = finding.long_axis_mm if finding.kind == "lesion" else finding.diameter_mm
    assert size is not None
    return max(10.0, size / 2.0)


def match_findings(
    truth: Sequence[TruthFinding], reported: Sequence[StudyFinding]
) -> list[tuple[int, int]]:
    """(truth index, reported index) pairs: same kind, within the match radius in the axial
    plane (the spec's rule), each finding used once, nearest pairs in 3-D first: two lesions
    stacked along z at the same place in the plane are each paired with the finding at their
    own level, not crosswise."""
    candidates = []
    for i, t in enumerate(truth):
        for j, r in enumerate(reported):
            if r.kind.value != t.kind:
                continue
            dx, dy, dz = (r.center_lps_mm[k] - t.center_lps_mm[k] for k in range(3))
            if math.hypot(dx, dy) <= _radius(t):
                candidates.append((math.hypot(dx, dy, dz), i, j))
    used_truth: set[int] = set()
    used_reported: set[int] = set()
    pairs = []
    for _, i, j in sorted(candidates):
        if i in used_truth or j in used_reported:
            continue
        used_truth.add(i)
        used_reported.add(j)
        pairs.append((i, j))
    return pairs


@dataclass(frozen=True)
class MatchedMeasurement:
    """One measurement of a matched finding with its truth."""

    name: MeasurementName
    true_mm: float
    value_mm: float | None  # None: not measurable
    range_mm: tuple[float, float] | None


@dataclass(frozen=True)
class StudyOutcome:
    """What one study gave."""

    name: str
    truth: tuple[TruthFinding, ...]
    result: StudyResult | None  # None: the measurer refused the study
    error: str | None
    matches: tuple[tuple[int, int], ...]
    measurements: tuple[MatchedMeasurement, ...]
    seconds: float


@dataclass(frozen=True)
class Evaluation:
    """The issue's metrics over a set of held-out studies."""

    studies: int
    refused: int
    lesions_10mm: int
    lesions_10mm_found: int
    vessels: int
    vessels_found: int
    false_findings: int
    mae_mm: dict[str, float]
    counts: dict[str, int]
    not_measurable: int
    coverage: dict[str, float]
    mean_width_mm: dict[str, float]
    answers_parsed: float  # share of measurements that were not "not measurable"
    malformed_find_answers: int
    seconds_median: float
    outcomes: tuple[StudyOutcome, ...] = field(repr=False, default=())

    @property
    def lesion_recall(self) -> float:
        return self.lesions_10mm_found / self.lesions_10mm if self.lesions_10mm else math.nan

    @property
    def vessel_recall(self) -> float:
        return self.vessels_found / self.vessels if self.vessels else math.nan

    @property
    def false_per_study(self) -> float:
        return self.false_findings / self.studies if self.studies else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "studies": self.studies,
            "refused": self.refused,
            "lesion_recall_10mm": self.lesion_recall,
            "lesions_10mm": self.lesions_10mm,
            "vessel_recall": self.vessel_recall,
            "vessels": self.vessels,
            "false_findings_per_study": self.false_per_study,
            "mae_mm": self.mae_mm,
            "counts": self.counts,
            "not_measurable": self.not_measurable,
            "coverage": self.coverage,
            "mean_width_mm": self.mean_width_mm,
            "answers_parsed": self.answers_parsed,
            "malformed_find_answers": self.malformed_find_answers,
            "seconds_median": self.seconds_median,
        }


def _outcome(study: TrainingStudy, measurer: Measurer) -> StudyOutcome:
    from ingestion.errors import ModelError

    began = time.perf_counter()
    try:
        result = measurer.measure(study.volume, source=study.name)
    except ModelError as error:
        return StudyOutcome(study.name, study.findings, None, str(error), (), (), 0.0)
    seconds = time.perf_counter() - began
    pairs = match_findings(study.findings, result.findings)
    measured = []
    for i, j in pairs:
        truth = _true_values(study.findings[i])
        for m in result.findings[j].measurements:
            measured.append(MatchedMeasurement(m.name, truth[m.name], m.value_mm, m.range_mm))
    return StudyOutcome(
        study.name, study.findings, result, None, tuple(pairs), tuple(measured), seconds
    )


def evaluate(
    measurer: Measurer,
    studies: Iterable[TrainingStudy],
    *,
    on_study: Callable[[StudyOutcome], None] | None = None,
) -> Evaluation:
    """Measure every study and score the results against its truth."""
    outcomes = []
    for study in studies:
        outcome = _outcome(study, measurer)
        outcomes.append(outcome)
        if on_study is not None:
            on_study(outcome)
    return summarize(outcomes)


def summarize(outcomes: Sequence[StudyOutcome]) -> Evaluation:
    """The metrics of already measured studies."""
    lesions = lesions_found = vessels = vessels_found = false = 0
    errors: dict[str, list[float]] = {}
    inside: dict[str, list[bool]] = {}
    widths: dict[str, list[float]] = {}
    missing = total = malformed_find = 0
    for outcome in outcomes:
        matched_truth = {i for i, _ in outcome.matches}
        for i, t in enumerate(outcome.truth):
            if t.kind == "vessel":
                vessels += 1
                vessels_found += i in matched_truth
            elif t.long_axis_mm is not None and t.long_axis_mm >= RECALL_MIN_LONG_AXIS_MM:
                lesions += 1
                lesions_found += i in matched_truth
        if outcome.result is None:
            continue
        false += len(outcome.result.findings) - len(outcome.matches)
        for warning in outcome.result.warnings:
            if "find answers were malformed" in warning:
                malformed_find += int(warning.split()[0])
        for finding in outcome.result.findings:
            total += len(finding.measurements)
            missing += sum(m.value_mm is None for m in finding.measurements)
        for m in outcome.measurements:
            if m.value_mm is None:
                continue
            errors.setdefault(m.name.value, []).append(abs(m.value_mm - m.true_mm))
            if m.range_mm is not None:
                low, high = m.range_mm
                inside.setdefault(m.name.value, []).append(low <= m.true_mm <= high)
                widths.setdefault(m.name.value, []).append(high - low)
    times = [o.seconds for o in outcomes if o.result is not None]
    return Evaluation(
        studies=len(outcomes),
        refused=sum(o.result is None for o in outcomes),
        lesions_10mm=lesions,
        lesions_10mm_found=lesions_found,
        vessels=vessels,
        vessels_found=vessels_found,
        false_findings=false,
        mae_mm={k: float(np.mean(v)) for k, v in sorted(errors.items())},
        counts={k: len(v) for k, v in sorted(errors.items())},
        not_measurable=missing,
        coverage={k: float(np.mean(v)) for k, v in sorted(inside.items())},
        mean_width_mm={k: float(np.mean(v)) for k, v in sorted(widths.items())},
        answers_parsed=(total - missing) / total if total else math.nan,
        malformed_find_answers=malformed_find,
        seconds_median=float(np.median(times)) if times else math.nan,
        outcomes=tuple(outcomes),
    )


def calibration_pairs(outcomes: Sequence[StudyOutcome]) -> list[tuple[str, float, float]]:
    """``(name, predicted_mm, true_mm)`` of every measured, matched finding."""
    return [
        (m.name.value, m.value_mm, m.true_mm)
        for outcome in outcomes
        for m in outcome.measurements
        if m.value_mm is not None
    ]
