"""The detection operating point: how sure the model must be that something is there before a
finding is reported.

The ``verify`` stage asks the point task at every candidate's centre and records its
*presence*: the probability the model did not open its answer with ``none`` (``Candidate.
presence``). Reporting every candidate the greedy answer names trades many false findings for
recall; a site (and the issue's target: recall at <= 1 false finding per study) wants a chosen
point on that trade. ``radcaliper calibrate`` measures held-out studies without the threshold,
computes the detection curve (:func:`detection_curve`: for each presence threshold, the true
findings still found and the false findings left, every threshold re-matched with the
evaluation's rule) and stores the lowest threshold whose false findings per study are within
the budget (:func:`fit_detection_threshold`, a ``calibration.DetectionThreshold`` in
``radcaliper.json``). The ``calibrate`` stage then leaves out findings below it.

This is the standard FROC operating point of a detector, chosen on studies the model was not
trained on; it reads nothing but the model's own probabilities.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from model.measurer.calibrate.calibration import DetectionThreshold
from model.measurer.evaluate.scoring import StudyOutcome, match_findings

__all__ = [
    "DEFAULT_FALSE_PER_STUDY",
    "OperatingPoint",
    "detection_curve",
    "fit_detection_threshold",
]

DEFAULT_FALSE_PER_STUDY = 1.0
_MAX_THRESHOLDS = 400  # distinct presences tried; more are thinned to quantiles
_RECALL_MIN_LONG_MM = 10.0  # lesions below this are not counted in the recall (the targets')


@dataclass(frozen=True)
class OperatingPoint:
    """The detection figures at one presence threshold."""

    threshold: float
    studies: int  # measured studies (refused ones are not counted)
    lesions: int  # true lesions >= 10 mm
    lesions_found: int
    vessels: int
    vessels_found: int
    false: int  # reports of an annotated kind that match no truth

    @property
    def lesion_recall(self) -> float:
        return self.lesions_found / self.lesions if self.lesions else math.nan

    @property
    def false_per_study(self) -> float:
        return self.false / self.studies if self.studies else 0.0


def detection_curve(
    outcomes: Sequence[StudyOutcome],
    presences: Sequence[Sequence[float | None]],
    thresholds: Sequence[float] | None = None,
) -> list[OperatingPoint]:
    """The operating point at each threshold (ascending), from outcomes measured without one.

    ``presences[s][j]`` is the presence of ``outcomes[s].result.findings[j]`` (None: not
    verified, always kept); a refused study has no findings. ``thresholds`` default to the
    distinct presences seen (thinned to quantiles past a few hundred), with 0 first. Each
    threshold re-matches the kept findings to the truth with the evaluation's rule, so a truth
    whose nearest report is dropped may still be found by another.
    """
    if len(outcomes) != len(presences):
        raise ValueError(f"{len(outcomes)} outcomes but {len(presences)} presence lists")
    for outcome, values in zip(outcomes, presences, strict=True):
        count = 0 if outcome.result is None else len(outcome.result.findings)
        if len(values) != count:
            raise ValueError(f"{outcome.name}: {count} findings but {len(values)} presences")
    if thresholds is None:
        thresholds = _thresholds([p for values in presences for p in values if p is not None])
    return [_point(outcomes, presences, t) for t in sorted(thresholds)]


def fit_detection_threshold(
    curve: Sequence[OperatingPoint], false_per_study: float = DEFAULT_FALSE_PER_STUDY
) -> DetectionThreshold | None:
    """The lowest threshold of ``curve`` within ``false_per_study`` (the highest-recall point
    within the budget); where none is, the one with the fewest false findings. None for an
    empty curve or one without measured studies."""
    if not (math.isfinite(false_per_study) and false_per_study >= 0):
        raise ValueError(f"false_per_study must be a finite number >= 0, got {false_per_study}")
    measured = [p for p in curve if p.studies]
    if not measured:
        return None
    within = [p for p in measured if p.false_per_study <= false_per_study]
    if within:
        chosen = min(within, key=lambda p: p.threshold)
    else:
        chosen = min(measured, key=lambda p: (p.false_per_study, p.threshold))
    return DetectionThreshold(
        chosen.threshold,
        false_per_study,
        chosen.false_per_study,
        chosen.lesion_recall,
        chosen.studies,
    )


def _thresholds(values: Sequence[float]) -> list[float]:
    distinct = sorted(set(values))
    if len(distinct) > _MAX_THRESHOLDS:
        step = (len(distinct) - 1) / (_MAX_THRESHOLDS - 1)
        distinct = [distinct[round(i * step)] for i in range(_MAX_THRESHOLDS)]
    return sorted({0.0, *distinct})


def _point(
    outcomes: Sequence[StudyOutcome],
    presences: Sequence[Sequence[float | None]],
    threshold: float,
) -> OperatingPoint:
    studies = lesions = lesions_found = vessels = vessels_found = false = 0
    for outcome, values in zip(outcomes, presences, strict=True):
        if outcome.result is None:
            continue
        studies += 1
        kept = [
            finding
            for finding, presence in zip(outcome.result.findings, values, strict=True)
            if presence is None or presence >= threshold
        ]
        pairs = match_findings(outcome.truth, kept)
        filtered = dataclasses.replace(
            outcome,
            result=dataclasses.replace(outcome.result, findings=tuple(kept)),
            matches=tuple(pairs),
        )
        false += filtered.false_and_unjudged()[0]
        found = {i for i, _ in pairs}
        for i, truth in enumerate(outcome.truth):
            if truth.kind == "lesion" and (truth.long_axis_mm or 0.0) >= _RECALL_MIN_LONG_MM:
                lesions += 1
                lesions_found += i in found
            elif truth.kind == "vessel":
                vessels += 1
                vessels_found += i in found
    return OperatingPoint(threshold, studies, lesions, lesions_found, vessels, vessels_found, false)
