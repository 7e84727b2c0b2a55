"""Held-out evaluation of a measurer against the truth of phantoms (the issue's metrics).

Truth is any :class:`~ingestion.dataset.TrueFinding`: a phantom's or a dataset row's.

Matching (phantom-spec.md, "Ground truth"; the same rule for phantoms and real datasets): a true
finding is found when a reported finding of the same kind has its centre within ``max(10 mm,
half the true long axis)`` (a vessel: half its diameter) of the true centre in the axial plane,
and, where the truth has a z extent (a lesion), within that extent along z; each reported
finding matches at most one true finding (nearest pairs first).

A reported finding that matches nothing is a false finding when its kind is annotated
exhaustively in the study (``TrainingStudy.annotated``: phantoms and label maps) or when it lies
where a reviewer rejected a finding (a negative example, within 10 mm in the plane); else it is
unjudged (an SR or a review lists some findings, not all), and counted as such.

Metrics (:class:`Evaluation`): recall of lesions >= 10 mm long and of vessels, and per kind and
size bin, over the studies the model measured (the findings of refused studies are counted
apart); false findings per measured study; MAE and Bland-Altman (bias, 95 % limits) of long axis,
short axis and diameter on matched findings that were measured; coverage and mean width of the
calibrated ranges; the share of answers that parsed; the time per study.
:func:`calibration_pairs` gives the ``(name, predicted, true)`` pairs that ``fit_calibration``
needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ingestion.dataset.format import TrueFinding
from model.measurer.data.study import TrainingStudy
from model.measurer.protocol import Measurer
from model.measurer.results import MeasurementName, StudyFinding, StudyResult

__all__ = [
    "SIZE_BINS",
    "Agreement",
    "Evaluation",
    "MatchedMeasurement",
    "StudyOutcome",
    "calibration_pairs",
    "evaluate",
    "match_findings",
    "score_study",
    "size_bin",
    "size_bin_name",
    "summarize",
]

RECALL_MIN_LONG_AXIS_MM = 10.0
NEGATIVE_RADIUS_MM = 10.0
# size bins of the recall table, by long axis (lesion) or diameter (vessel), mm: [low, high)
SIZE_BINS: dict[str, tuple[float, ...]] = {
    "lesion": (0.0, 10.0, 20.0, 40.0, math.inf),
    "vessel": (0.0, 20.0, 30.0, math.inf),
}


def _true_values(finding: TrueFinding) -> dict[MeasurementName, float]:
    if finding.kind == "lesion":
        assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
        return {
            MeasurementName.LONG_AXIS: finding.long_axis_mm,
            MeasurementName.SHORT_AXIS: finding.short_axis_mm,
        }
    assert finding.diameter_mm is not None
    return {MeasurementName.DIAMETER: finding.diameter_mm}


def _size(finding: TrueFinding) -> float:
    size = finding.long_axis_mm if finding.kind == "lesion" else finding.diameter_mm
    assert size is not None
    return size


def _radius(finding: TrueFinding) -> float:
    return max(10.0, _size(finding) / 2.0)


def _within_z(finding: TrueFinding, z: float) -> bool:
    z_range = finding.z_range_lps_mm
    return z_range is None or z_range[0] - 1e-6 <= z <= z_range[1] + 1e-6


def size_bin_name(kind: str, index: int) -> str:
    """The name of size bin ``index`` of ``kind`` (``SIZE_BINS``): "10-20 mm", ">= 40 mm"."""
    low, high = SIZE_BINS[kind][index], SIZE_BINS[kind][index + 1]
    if math.isinf(high):
        return f">= {low:g} mm"
    return f"< {high:g} mm" if low == 0 else f"{low:g}-{high:g} mm"


def size_bin(finding: TrueFinding) -> str:
    """The finding's size bin (``SIZE_BINS``)."""
    edges = SIZE_BINS[finding.kind]
    size = _size(finding)
    for index in range(len(edges) - 1):
        if edges[index] <= size < edges[index + 1]:
            return size_bin_name(finding.kind, index)
    raise AssertionError(size)


def match_findings(
    truth: Sequence[TrueFinding], reported: Sequence[StudyFinding]
) -> list[tuple[int, int]]:
    """(truth index, reported index) pairs: same kind, within the match radius in the axial
    plane and within the truth's z extent (the module's rule), each finding used once, nearest
    pairs in 3-D first: two lesions stacked along z at the same place in the plane are each
    paired with the finding at their own level, not crosswise."""
    candidates = []
    for i, t in enumerate(truth):
        for j, r in enumerate(reported):
            if r.kind.value != t.kind:
                continue
            dx, dy, dz = (r.center_lps_mm[k] - t.center_lps_mm[k] for k in range(3))
            if math.hypot(dx, dy) <= _radius(t) and _within_z(t, r.center_lps_mm[2]):
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
    """What one study gave.

    ``annotated``: the kinds annotated exhaustively in the study (an unmatched report of one of
    them is false); ``negatives``: places a reviewer said hold no finding.
    """

    name: str
    truth: tuple[TrueFinding, ...]
    result: StudyResult | None  # None: the measurer refused the study
    error: str | None
    matches: tuple[tuple[int, int], ...]
    measurements: tuple[MatchedMeasurement, ...]
    seconds: float
    annotated: tuple[str, ...] = ("lesion", "vessel")
    negatives: tuple[TrueFinding, ...] = ()

    def false_and_unjudged(self) -> tuple[int, int]:
        """(false findings, unjudged findings) among the reports that matched no truth."""
        if self.result is None:
            return 0, 0
        matched = {j for _, j in self.matches}
        false = unjudged = 0
        for j, report in enumerate(self.result.findings):
            if j in matched:
                continue
            kind = report.kind.value
            if kind in self.annotated or any(
                n.kind == kind
                and math.hypot(
                    report.center_lps_mm[0] - n.center_lps_mm[0],
                    report.center_lps_mm[1] - n.center_lps_mm[1],
                )
                <= NEGATIVE_RADIUS_MM
                and _within_z(n, report.center_lps_mm[2])
                for n in self.negatives
            ):
                false += 1
            else:
                unjudged += 1
        return false, unjudged

    def to_json(self) -> dict[str, Any]:
        """Per-study summary: truth found, false and unjudged reports, time, refusal."""
        false, unjudged = self.false_and_unjudged()
        return {
            "name": self.name,
            "refused": self.result is None,
            "error": self.error,
            "true_findings": len(self.truth),
            "found": len(self.matches),
            "reported": 0 if self.result is None else len(self.result.findings),
            "false_findings": false,
            "unjudged_findings": unjudged,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class Agreement:
    """Bland-Altman agreement of one measurement with its truth (predicted - true, mm)."""

    n: int
    bias_mm: float
    sd_mm: float

    @property
    def limits_mm(self) -> tuple[float, float]:
        """95 % limits of agreement."""
        return (self.bias_mm - 1.96 * self.sd_mm, self.bias_mm + 1.96 * self.sd_mm)

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "bias_mm": self.bias_mm,
            "sd_mm": self.sd_mm,
            "limits_mm": list(self.limits_mm),
        }


@dataclass(frozen=True)
class Evaluation:
    """The metrics over a set of held-out studies (module doc)."""

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
    recall_by_size: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    agreement: dict[str, Agreement] = field(default_factory=dict)
    unjudged_findings: int = 0
    seconds_mean: float = math.nan
    findings_in_refused: int = 0  # true findings of refused studies (not in the recalls)

    @property
    def lesion_recall(self) -> float:
        return self.lesions_10mm_found / self.lesions_10mm if self.lesions_10mm else math.nan

    @property
    def vessel_recall(self) -> float:
        return self.vessels_found / self.vessels if self.vessels else math.nan

    @property
    def false_per_study(self) -> float:
        measured = self.studies - self.refused
        return self.false_findings / measured if measured else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "studies": self.studies,
            "refused": self.refused,
            "lesion_recall_10mm": self.lesion_recall,
            "lesions_10mm": self.lesions_10mm,
            "vessel_recall": self.vessel_recall,
            "vessels": self.vessels,
            "recall_by_size": {
                kind: {
                    name: {"found": found, "total": total, "recall": found / total}
                    for name, (found, total) in bins.items()
                }
                for kind, bins in self.recall_by_size.items()
            },
            "false_findings_per_study": self.false_per_study,
            "false_findings": self.false_findings,
            "unjudged_findings": self.unjudged_findings,
            "findings_in_refused_studies": self.findings_in_refused,
            "mae_mm": self.mae_mm,
            "counts": self.counts,
            "bland_altman": {k: v.to_json() for k, v in self.agreement.items()},
            "not_measurable": self.not_measurable,
            "coverage": self.coverage,
            "mean_width_mm": self.mean_width_mm,
            "answers_parsed": self.answers_parsed,
            "malformed_find_answers": self.malformed_find_answers,
            "seconds_median": self.seconds_median,
            "seconds_mean": self.seconds_mean,
        }


def score_study(study: TrainingStudy, measurer: Measurer) -> StudyOutcome:
    """Measure one study and match its report to its truth (a refusal is an outcome too)."""
    from ingestion.errors import ModelError

    began = time.perf_counter()
    try:
        result = measurer.measure(study.volume, source=study.name)
    except ModelError as error:
        return StudyOutcome(
            study.name,
            study.findings,
            None,
            str(error),
            (),
            (),
            0.0,
            annotated=study.annotated,
            negatives=study.negatives,
        )
    seconds = time.perf_counter() - began
    pairs = match_findings(study.findings, result.findings)
    measured = []
    for i, j in pairs:
        truth = _true_values(study.findings[i])
        for m in result.findings[j].measurements:
            if m.name in truth:
                measured.append(MatchedMeasurement(m.name, truth[m.name], m.value_mm, m.range_mm))
    return StudyOutcome(
        study.name,
        study.findings,
        result,
        None,
        tuple(pairs),
        tuple(measured),
        seconds,
        annotated=study.annotated,
        negatives=study.negatives,
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
        outcome = score_study(study, measurer)
        outcomes.append(outcome)
        if on_study is not None:
            on_study(outcome)
    return summarize(outcomes)


def _agreement(differences: Sequence[float]) -> Agreement:
    values = np.asarray(differences, dtype=np.float64)
    sd = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return Agreement(len(values), float(values.mean()), sd)


def summarize(outcomes: Sequence[StudyOutcome]) -> Evaluation:
    """The metrics of already measured studies."""
    lesions = lesions_found = vessels = vessels_found = false = unjudged = 0
    errors: dict[str, list[float]] = {}
    differences: dict[str, list[float]] = {}
    inside: dict[str, list[bool]] = {}
    widths: dict[str, list[float]] = {}
    by_size: dict[str, dict[str, list[int]]] = {}
    missing = total = malformed_find = in_refused = 0
    for outcome in outcomes:
        if outcome.result is None:  # refused: its findings are counted apart, not as missed
            in_refused += len(outcome.truth)
            continue
        matched_truth = {i for i, _ in outcome.matches}
        for i, t in enumerate(outcome.truth):
            counts = by_size.setdefault(t.kind, {}).setdefault(size_bin(t), [0, 0])
            counts[0] += i in matched_truth
            counts[1] += 1
            if t.kind == "vessel":
                vessels += 1
                vessels_found += i in matched_truth
            elif t.long_axis_mm is not None and t.long_axis_mm >= RECALL_MIN_LONG_AXIS_MM:
                lesions += 1
                lesions_found += i in matched_truth
        study_false, study_unjudged = outcome.false_and_unjudged()
        false += study_false
        unjudged += study_unjudged
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
            differences.setdefault(m.name.value, []).append(m.value_mm - m.true_mm)
            if m.range_mm is not None:
                low, high = m.range_mm
                inside.setdefault(m.name.value, []).append(low <= m.true_mm <= high)
                widths.setdefault(m.name.value, []).append(high - low)
    times = [o.seconds for o in outcomes if o.result is not None]
    edges = {
        kind: [size_bin_name(kind, i) for i in range(len(SIZE_BINS[kind]) - 1)]
        for kind in SIZE_BINS
    }
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
        recall_by_size={
            kind: {
                name: (by_size[kind][name][0], by_size[kind][name][1])
                for name in edges[kind]
                if name in by_size[kind]
            }
            for kind in sorted(by_size)
        },
        agreement={k: _agreement(v) for k, v in sorted(differences.items())},
        unjudged_findings=unjudged,
        seconds_mean=float(np.mean(times)) if times else math.nan,
        findings_in_refused=in_refused,
    )


def calibration_pairs(outcomes: Sequence[StudyOutcome]) -> list[tuple[str, float, float]]:
    """``(name, predicted_mm, true_mm)`` of every measured, matched finding."""
    return [
        (m.name.value, m.value_mm, m.true_mm)
        for outcome in outcomes
        for m in outcome.measurements
        if m.value_mm is not None
    ]
