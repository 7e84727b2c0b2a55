"""The detection operating point (model.measurer.calibrate.operating): the detection curve over
presence thresholds, re-matched at each, and the threshold fitted for a budget of false findings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ingestion.phantoms import TruthFinding
from model.measurer.calibrate.calibration import DetectionThreshold
from model.measurer.calibrate.operating import (
    OperatingPoint,
    detection_curve,
    fit_detection_threshold,
)
from model.measurer.evaluate.scoring import StudyOutcome, match_findings
from model.measurer.results import (
    FindingKind,
    Measurement,
    MeasurementName,
    ModelInfo,
    StudyFinding,
    StudyResult,
)


def _lesion(x: float, long_mm: float = 30.0) -> TruthFinding:
    return TruthFinding(
        kind="lesion",
        center_lps_mm=(x, 0.0, 0.0),
        slice_index=0,
        long_axis_mm=long_mm,
        short_axis_mm=long_mm / 2,
        cc_extent_mm=long_mm / 2,
        rotation_deg=0.0,
        contrast_hu=50.0,
    )


def _report(x: float, kind: str = "lesion") -> StudyFinding:
    names = (
        (MeasurementName.LONG_AXIS, MeasurementName.SHORT_AXIS)
        if kind == "lesion"
        else (MeasurementName.DIAMETER,)
    )
    measurements = tuple(Measurement(n, 10.0) for n in names)
    return StudyFinding(0, FindingKind(kind), (x, 0.0, 0.0), 0, measurements)


def _outcome(truth: list[TruthFinding], found: list[StudyFinding] | None) -> StudyOutcome:
    if found is None:  # refused
        return StudyOutcome("refused", tuple(truth), None, "MR", (), (), 0.0)
    result = StudyResult("1.2", "1.2.3", "", "x", ModelInfo("m", "1", "rned_corr"), tuple(found))
    return StudyOutcome(
        "s", tuple(truth), result, None, tuple(match_findings(truth, found)), (), 1.0
    )


def test_each_threshold_rematches_what_is_left() -> None:
    """Two reports near one lesion: dropping the nearer (less sure) one leaves the other to
    find it, so recall holds while the false finding goes."""
    truth = [_lesion(0.0, 40.0), _lesion(200.0, 8.0)]  # the 8 mm lesion is not in the recall
    found = [_report(2.0), _report(12.0), _report(100.0), _report(200.0)]
    curve = detection_curve([_outcome(truth, found)], [[0.3, 0.9, 0.5, 0.95]])
    assert [p.threshold for p in curve] == [0.0, 0.3, 0.5, 0.9, 0.95]
    at = {p.threshold: p for p in curve}
    # everything: the nearer report finds the 40 mm lesion, the one at 12 mm and at 100 are false
    assert (at[0.0].lesions_found, at[0.0].lesions, at[0.0].false) == (1, 1, 2)
    # 0.5: the nearer one is gone, the report at 12 mm (within 20 mm) finds it instead
    assert (at[0.5].lesions_found, at[0.5].false) == (1, 1)
    assert (at[0.9].lesions_found, at[0.9].false) == (1, 0)
    assert (at[0.95].lesions_found, at[0.95].false) == (0, 0)
    assert at[0.95].lesion_recall == 0.0 and at[0.0].false_per_study == 2.0


def test_not_verified_reports_are_always_kept_and_refused_studies_not_counted() -> None:
    truth = [_lesion(0.0)]
    outcomes = [_outcome(truth, [_report(50.0)]), _outcome(truth, None)]
    curve = detection_curve(outcomes, [[None], []], thresholds=[0.0, 0.99])
    assert [(p.studies, p.false, p.lesions) for p in curve] == [(1, 1, 1), (1, 1, 1)]


def test_presences_must_line_up_with_the_reports() -> None:
    with pytest.raises(ValueError, match="1 findings but 2 presences"):
        detection_curve([_outcome([_lesion(0.0)], [_report(0.0)])], [[0.5, 0.6]])
    with pytest.raises(ValueError, match="1 outcomes but 0 presence lists"):
        detection_curve([_outcome([], [_report(0.0)])], [])


def test_the_fitted_threshold_is_the_lowest_within_the_budget() -> None:
    """Seeded random studies: the fitted threshold meets the budget, and the next lower
    threshold of the curve does not (it is the highest-recall point within it)."""
    rng = np.random.default_rng(11)
    outcomes, presences = [], []
    for _ in range(12):
        truth = [_lesion(float(x)) for x in rng.uniform(-200, 200, 2)]
        found = [_report(t.center_lps_mm[0] + float(rng.normal(0, 3))) for t in truth]
        found += [_report(float(x)) for x in rng.uniform(300, 600, 5)]
        outcomes.append(_outcome(truth, found))
        presences.append(
            [float(p) for p in rng.uniform(0.5, 1.0, 2)]
            + [float(p) for p in rng.uniform(0.0, 0.9, 5)]
        )
    curve = detection_curve(outcomes, presences)
    fitted = fit_detection_threshold(curve, 1.0)
    assert fitted is not None and fitted.studies == 12
    assert fitted.fitted_false_per_study <= 1.0
    lower = [p for p in curve if p.threshold < fitted.min_presence]
    assert lower and lower[-1].false_per_study > 1.0
    chosen = next(p for p in curve if p.threshold == fitted.min_presence)
    assert fitted.fitted_recall == chosen.lesion_recall > curve[-1].lesion_recall
    # a stricter budget never lowers the threshold
    strict = fit_detection_threshold(curve, 0.25)
    assert strict is not None and strict.min_presence >= fitted.min_presence
    # round trip through radcaliper.json
    assert DetectionThreshold.from_json(json.loads(json.dumps(fitted.to_json()))) == fitted


def test_an_unreachable_budget_takes_the_fewest_false_findings() -> None:
    points = [
        OperatingPoint(0.0, 2, 4, 4, 0, 0, 9),
        OperatingPoint(0.5, 2, 4, 3, 0, 0, 5),
        OperatingPoint(0.8, 2, 4, 1, 0, 0, 5),
    ]
    fitted = fit_detection_threshold(points, 1.0)
    assert fitted is not None
    assert (fitted.min_presence, fitted.fitted_false_per_study) == (0.5, 2.5)
    assert fit_detection_threshold([], 1.0) is None
    with pytest.raises(ValueError, match="false_per_study"):
        fit_detection_threshold(points, math.inf)
    empty = DetectionThreshold(0.5, 1.0, 0.0, math.nan, 3)
    assert math.isnan(DetectionThreshold.from_json(empty.to_json()).fitted_recall)
