"""Held-out evaluation (model.measurer.evaluate): the spec's matching rule and the metrics."""

from __future__ import annotations

import math

import pytest

from ingestion.phantoms import TruthFinding
from model.measurer.evaluate import (
    MatchedMeasurement,
    StudyOutcome,
    calibration_pairs,
    match_findings,
    summarize,
)
from model.measurer.results import (
    FindingKind,
    Measurement,
    MeasurementName,
    ModelInfo,
    StudyFinding,
    StudyResult,
)

LONG, SHORT, DIAMETER = (
    MeasurementName.LONG_AXIS,
    MeasurementName.SHORT_AXIS,
    MeasurementName.DIAMETER,
)


def lesion(x: float, long_mm: float = 30.0, z: float = 0.0) -> TruthFinding:
    return TruthFinding(
        kind="lesion",
        center_lps_mm=(x, 0.0, z),
        slice_index=0,
        long_axis_mm=long_mm,
        short_axis_mm=long_mm / 2,
        cc_extent_mm=long_mm / 2,
        rotation_deg=0.0,
        contrast_hu=50.0,
    )


def vessel(x: float, diameter: float = 20.0) -> TruthFinding:
    return TruthFinding(
        kind="vessel", center_lps_mm=(x, 0.0, 0.0), slice_index=0, diameter_mm=diameter, hu=200.0
    )


def reported(kind: str, x: float, *values: float | None, z: float = 0.0) -> StudyFinding:
    names = (LONG, SHORT) if kind == "lesion" else (DIAMETER,)
    measurements = tuple(
        Measurement(n, v, (v - 1.0, v + 1.0), 0.9)
        if v is not None
        else Measurement.not_measurable(n, "test")
        for n, v in zip(names, values, strict=True)
    )
    return StudyFinding(0, FindingKind(kind), (x, 0.0, z), 0, measurements)


def test_matching_uses_the_spec_radius_in_the_axial_plane_only() -> None:
    truth = [lesion(0.0, long_mm=40.0), lesion(100.0, long_mm=12.0), vessel(200.0)]
    found = [
        reported("lesion", 19.0, 40.0, 20.0, z=50.0),  # within half the long axis (20 mm)
        reported("lesion", 111.0, 12.0, 6.0),  # 11 mm > max(10, 6): missed
        reported("lesion", 200.0, 20.0, 10.0),  # a lesion where the vessel is: wrong kind
        reported("vessel", 205.0, 20.0),
    ]
    assert match_findings(truth, found) == [(2, 3), (0, 0)]


def test_each_finding_matches_once_nearest_first() -> None:
    truth = [lesion(0.0), lesion(8.0)]
    found = [reported("lesion", 7.0, 30.0, 15.0)]
    assert match_findings(truth, found) == [(1, 0)]


def test_lesions_stacked_along_z_pair_with_the_finding_at_their_own_level() -> None:
    # held-out seed 2043 study 177: a 9.3 mm lesion 23 mm below a 20 mm one at the same place in
    # the plane; the in-plane distance alone paired them crosswise (errors of 11 mm each)
    truth = [lesion(0.0, long_mm=9.3, z=-119.0), lesion(0.0, long_mm=20.0, z=-96.0)]
    found = [
        reported("lesion", 1.0, 9.5, 7.8, z=-118.0),
        reported("lesion", 0.5, 20.8, 15.6, z=-96.0),
    ]
    assert sorted(match_findings(truth, found)) == [(0, 0), (1, 1)]


def _outcome(truth: list[TruthFinding], found: list[StudyFinding]) -> StudyOutcome:
    result = StudyResult("1.2", "1.2.3", "P", "x", ModelInfo("m", "1", "rned_corr"), tuple(found))
    pairs = match_findings(truth, found)
    measured = []
    for i, j in pairs:
        t = truth[i]
        true = (
            {LONG: t.long_axis_mm, SHORT: t.short_axis_mm}
            if t.kind == "lesion"
            else {DIAMETER: t.diameter_mm}
        )
        for m in found[j].measurements:
            measured.append(MatchedMeasurement(m.name, true[m.name], m.value_mm, m.range_mm))
    return StudyOutcome("s", tuple(truth), result, None, tuple(pairs), tuple(measured), 1.0)


def test_summary_counts_recall_false_findings_errors_and_coverage() -> None:
    first = _outcome(
        [lesion(0.0, 30.0), lesion(100.0, 8.0), vessel(200.0, 20.0)],
        [
            reported("lesion", 1.0, 32.0, 15.5),  # long off by 2 (outside its range), short 0.5
            reported("vessel", 200.0, 20.5),
            reported("lesion", -150.0, 10.0, 5.0),  # false
        ],
    )
    second = _outcome(
        [lesion(0.0, 20.0), vessel(60.0, 30.0)],
        [reported("lesion", 0.0, 21.0, None)],  # short axis not measurable; vessel missed
    )
    refused = StudyOutcome("r", (lesion(0.0, 12.0),), None, "MR", (), (), 0.0)
    evaluation = summarize([first, second, refused])
    assert (evaluation.studies, evaluation.refused) == (3, 1)
    assert (evaluation.lesions_10mm, evaluation.lesions_10mm_found) == (3, 2)  # 8 mm not counted
    assert (evaluation.vessels, evaluation.vessels_found) == (2, 1)
    assert evaluation.false_findings == 1 and evaluation.false_per_study == pytest.approx(1 / 3)
    assert evaluation.mae_mm == {"diameter": 0.5, "long_axis": 1.5, "short_axis": 0.5}
    assert evaluation.counts == {"diameter": 1, "long_axis": 2, "short_axis": 1}
    assert evaluation.coverage["long_axis"] == 0.5 and evaluation.coverage["diameter"] == 1.0
    assert evaluation.not_measurable == 1
    assert evaluation.answers_parsed == pytest.approx(6 / 7)
    assert evaluation.seconds_median == 1.0
    assert sorted(calibration_pairs([first, second])) == sorted(
        [
            ("long_axis", 32.0, 30.0),
            ("short_axis", 15.5, 15.0),
            ("diameter", 20.5, 20.0),
            ("long_axis", 21.0, 20.0),
        ]
    )
    empty = summarize([])
    assert math.isnan(empty.lesion_recall) and math.isnan(empty.seconds_median)
