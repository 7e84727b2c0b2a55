"""Held-out evaluation (model.measurer.evaluate.scoring): the spec's matching rule and the
metrics."""

from __future__ import annotations

import math

import pytest

from ingestion.phantoms import TruthFinding
from model.measurer.evaluate.scoring import (
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


def test_matching_uses_the_spec_radius_in_the_plane_and_the_lesion_z_extent() -> None:
    truth = [lesion(0.0, long_mm=40.0), lesion(100.0, long_mm=12.0), vessel(200.0)]
    found = [
        reported("lesion", 19.0, 40.0, 20.0, z=9.5),  # within half the long axis (20 mm)
        reported("lesion", 111.0, 12.0, 6.0),  # 11 mm > max(10, 6): missed
        reported("lesion", 200.0, 20.0, 10.0),  # a lesion where the vessel is: wrong kind
        reported("vessel", 205.0, 20.0, z=80.0),  # a vessel has no z extent here
    ]
    assert sorted(match_findings(truth, found)) == [(0, 0), (2, 3)]
    # the 40 mm lesion spans z -10..10 (cc extent 20 mm): a report at z = 10.5 is elsewhere
    beyond = [reported("lesion", 0.0, 40.0, 20.0, z=10.5)]
    assert match_findings(truth, beyond) == []


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
    # 8 mm not counted; the refused study's lesion is counted apart, not as missed
    assert (evaluation.lesions_10mm, evaluation.lesions_10mm_found) == (2, 2)
    assert evaluation.findings_in_refused == 1
    assert (evaluation.vessels, evaluation.vessels_found) == (2, 1)
    # per measured study: the refused one reported nothing
    assert evaluation.false_findings == 1 and evaluation.false_per_study == pytest.approx(1 / 2)
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


def test_unmatched_reports_are_false_only_where_their_kind_was_annotated_or_rejected() -> None:
    truth = [lesion(0.0, 30.0)]
    found = [
        reported("lesion", 0.0, 30.0, 15.0),
        reported("lesion", 100.0, 20.0, 10.0),  # a lesion nobody annotated: lesions annotated
        reported("vessel", 200.0, 20.0),  # vessels not annotated, no negative: unjudged
        reported("vessel", -200.0, 25.0),  # 4 mm from a rejected vessel: false
    ]
    result = StudyResult("1.2", "1.2.3", "P", "x", ModelInfo("m", "1", "rned_corr"), tuple(found))
    negative = vessel(-204.0)
    outcome = StudyOutcome(
        "s",
        tuple(truth),
        result,
        None,
        tuple(match_findings(truth, found)),
        (),
        1.0,
        annotated=("lesion",),
        negatives=(negative,),
    )
    assert outcome.false_and_unjudged() == (2, 1)
    evaluation = summarize([outcome])
    assert (evaluation.false_findings, evaluation.unjudged_findings) == (2, 1)
    assert evaluation.to_json()["unjudged_findings"] == 1


def test_recall_by_size_bin_and_bland_altman() -> None:
    outcome = _outcome(
        [lesion(0.0, 8.0), lesion(100.0, 15.0), lesion(200.0, 50.0), vessel(300.0, 25.0)],
        [
            reported("lesion", 100.0, 17.0, 7.5),
            reported("lesion", 200.0, 48.0, 25.0),
            reported("vessel", 300.0, 26.0),
        ],
    )
    evaluation = summarize([outcome])
    assert evaluation.recall_by_size == {
        "lesion": {"< 10 mm": (0, 1), "10-20 mm": (1, 1), ">= 40 mm": (1, 1)},
        "vessel": {"20-30 mm": (1, 1)},
    }
    agreement = evaluation.agreement["long_axis"]
    assert (agreement.n, agreement.bias_mm) == (2, 0.0)  # +2 and -2
    assert agreement.sd_mm == pytest.approx(math.sqrt(8.0))
    assert agreement.limits_mm == pytest.approx((-1.96 * math.sqrt(8.0), 1.96 * math.sqrt(8.0)))
    assert evaluation.agreement["diameter"].n == 1
    assert math.isnan(evaluation.agreement["diameter"].sd_mm)
    table = evaluation.to_json()
    assert table["recall_by_size"]["lesion"]["10-20 mm"] == {"found": 1, "total": 1, "recall": 1.0}
    assert table["bland_altman"]["long_axis"]["n"] == 2
