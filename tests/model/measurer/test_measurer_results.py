"""Result types (JSON contract of ``measure --json``) and split-conformal calibration."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from model.measurer.calibrate.calibration import (
    Calibration,
    DecodeCheck,
    ScoreKind,
    fit_calibration,
    fit_decode_check,
)
from model.measurer.results import (
    NOT_MEASURABLE,
    FindingKind,
    Measurement,
    MeasurementName,
    ModelInfo,
    StudyFinding,
    StudyResult,
)

MODEL = ModelInfo("radcaliper-demo", "0.1.0", "rned_corr")


def lesion(id_: int = 1) -> StudyFinding:
    return StudyFinding(
        id_,
        FindingKind.LESION,
        (1.0, -2.5, 30.0),
        12,
        (
            Measurement(MeasurementName.LONG_AXIS, 23.4, (21.0, 25.9), 0.9),
            Measurement(MeasurementName.SHORT_AXIS, 15.1, (13.2, 17.0), 0.9),
        ),
    )


def test_json_follows_the_architecture_contract() -> None:
    vessel = StudyFinding(
        2,
        "vessel",  # type: ignore[arg-type]
        (0, 0, 0),  # type: ignore[arg-type]
        9,
        (Measurement.not_measurable(MeasurementName.DIAMETER, "outside the field of view"),),
    )
    result = StudyResult("1.2.3", "1.2.3.4", "PHANTOM-1", "/data/x", MODEL, (lesion(), vessel))
    data = json.loads(json.dumps(result.to_json()))
    assert set(data) == {
        "study_instance_uid",
        "series_instance_uid",
        "patient_id",
        "source",
        "model",
        "findings",
    }
    assert data["model"] == {
        "name": "radcaliper-demo",
        "version": "0.1.0",
        "numeric_mode": "rned_corr",
        "not_for_clinical_use": True,
    }
    first, second = data["findings"]
    assert first["kind"] == "lesion" and first["slice_index"] == 12
    assert first["measurements"][0] == {
        "name": "long_axis",
        "value_mm": 23.4,
        "range_mm": [21.0, 25.9],
        "coverage": 0.9,
    }
    assert second["measurements"][0]["value_mm"] is None
    assert second["measurements"][0]["qualifier"] == NOT_MEASURABLE
    assert second["center_lps_mm"] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"value_mm": -1.0}, ">= 0"),
        ({"value_mm": math.nan}, "finite"),
        ({"value_mm": 10.0, "range_mm": (11.0, 12.0), "coverage": 0.9}, "contain the value"),
        ({"value_mm": 10.0, "range_mm": (9.0, 12.0)}, "go together"),
        ({"value_mm": 10.0, "range_mm": (9.0, 12.0), "coverage": 1.0}, r"\(0, 1\)"),
        ({"value_mm": None}, "needs qualifier"),
        ({"value_mm": 10.0, "qualifier": NOT_MEASURABLE}, "given with a value"),
    ],
)
def test_invalid_measurements_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Measurement(MeasurementName.DIAMETER, **kwargs)


def test_finding_needs_the_measurements_of_its_kind() -> None:
    with pytest.raises(ValueError, match="must be"):
        StudyFinding(1, FindingKind.VESSEL, (0.0, 0.0, 0.0), 0, lesion().measurements)
    with pytest.raises(ValueError, match="3 finite"):
        StudyFinding(1, FindingKind.LESION, (0.0, math.inf, 0.0), 0, lesion().measurements)


def test_conformal_coverage_on_fresh_data() -> None:
    """Fitted on one sample, the 90 % ranges cover ~90 % of a fresh sample of the same kind."""
    rng = np.random.default_rng(0)

    def sample(n: int) -> list[tuple[str, float, float]]:
        true = rng.uniform(8, 60, n)
        predicted = true + rng.normal(0, 0.04 * true)  # errors grow with size
        return [("long_axis", float(p), float(t)) for p, t in zip(predicted, true, strict=True)]

    calibration = fit_calibration(sample(2000), 0.9)
    rule = calibration.rules["long_axis"]
    assert rule.kind == ScoreKind.ADAPTIVE  # narrower for size-proportional errors
    assert 0.89 <= rule.empirical_coverage <= 0.91
    fresh = sample(4000)
    inside = 0
    for name, p, t in fresh:
        interval = calibration.interval(name, p)
        assert interval is not None
        inside += interval[0] <= t <= interval[1]
    assert 0.88 <= inside / len(fresh) <= 0.92
    assert calibration.interval("diameter", 10.0) is None
    assert Calibration.from_json(json.loads(json.dumps(calibration.to_json()))) == calibration


def test_absolute_scores_win_for_constant_errors() -> None:
    rng = np.random.default_rng(1)
    true = rng.uniform(15, 45, 500)
    errors = rng.normal(0, 1, 500)
    pairs = [("diameter", float(t + e), float(t)) for t, e in zip(true, errors, strict=True)]
    rule = fit_calibration(pairs).rules["diameter"]
    assert rule.kind == ScoreKind.ABSOLUTE
    assert rule.quantile == pytest.approx(1.645, abs=0.25)
    assert rule.mae_mm == pytest.approx(0.8, abs=0.1)
    low, _ = rule.interval(0.5)
    assert low == 0.0  # clipped


def test_too_few_pairs_and_bad_input() -> None:
    with pytest.raises(ValueError, match="too few"):
        fit_calibration([("diameter", 1.0, 1.0)] * 5, 0.9)
    with pytest.raises(ValueError, match="coverage"):
        fit_calibration([], 1.5)
    with pytest.raises(ValueError, match="non-finite"):
        fit_calibration([("diameter", math.nan, 1.0)])


def test_the_decode_check_is_a_conformal_lower_bound() -> None:
    """Fitted at level q on n confidences, the threshold is the floor(q (n + 1))-th smallest;
    about q of a fresh sample of the same kind falls below it; a weaker answer is refused."""
    rng = np.random.default_rng(5)
    confidences = [float(c) for c in rng.beta(8, 2, 999)]
    check = fit_decode_check([*confidences, None, math.nan], 0.02)
    assert check is not None and check.n == 999 and check.quantile == 0.02
    assert check.min_confidence == sorted(confidences)[19]  # floor(0.02 * 1000) = 20th
    fresh = rng.beta(8, 2, 20000)
    assert 0.015 <= float(np.mean(fresh < check.min_confidence)) <= 0.025
    assert check.accepts(check.min_confidence) and not check.accepts(check.min_confidence - 1e-9)
    assert check.accepts(None) and check.accepts(math.nan)  # no measure: not judged
    assert "0.100 is below" in check.reason(0.1) and "999 decodes" in check.reason(0.1)
    assert DecodeCheck.from_json(json.loads(json.dumps(check.to_json()))) == check
    assert fit_decode_check(confidences[:98], 0.01) is None  # too few to refuse anything
    assert fit_decode_check(confidences[:99], 0.01) == DecodeCheck(min(confidences[:99]), 0.01, 99)
    with pytest.raises(ValueError, match="quantile"):
        fit_decode_check(confidences, 0.5)
