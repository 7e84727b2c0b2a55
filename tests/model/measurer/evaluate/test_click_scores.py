"""The click scoreboard's figures on hand-made cases whose answers are known."""

from __future__ import annotations

import math

import pytest

from model.measurer.evaluate.click_scores import (
    ClickAnswer,
    ClickCase,
    binomial_interval,
    score_clicks,
    size_bin_of,
)
from model.measurer.results import FindingKind, Measurement, MeasurementName, StudyFinding


def _answer(long: float | None, short: float | None = None, spread: float = 1.0) -> ClickAnswer:
    if long is None:
        return ClickAnswer(None, None, None, None, 0.2)
    short = long / 2 if short is None else short
    return ClickAnswer(
        long, short, (long - spread, long + spread), (short - spread, short + spread), 0.4, "lesion"
    )


def _case(
    name: str, reads: list[tuple[float, float]], answer: ClickAnswer, **kw: object
) -> ClickCase:
    longs, shorts = zip(*reads, strict=True)
    return ClickCase(
        name,
        f"P-{name}",
        float(sorted(longs)[len(longs) // 2] if len(longs) % 2 else sum(sorted(longs)[1:3]) / 2),
        float(
            sorted(shorts)[len(shorts) // 2] if len(shorts) % 2 else sum(sorted(shorts)[1:3]) / 2
        ),
        tuple(reads),
        answer,
        **kw,  # type: ignore[arg-type]
    )


def test_mae_bias_and_the_readers_left_out_in_turn() -> None:
    # three readers 10, 11, 12 (median 11); the measurer says 13
    case = _case("a", [(10.0, 6.0), (11.0, 7.0), (12.0, 8.0)], _answer(13.0, 7.0))
    scores = score_clicks([case])
    long = scores.overall.long
    assert long.n == 1 and long.mae_mm == pytest.approx(2.0) and long.bias_mm == pytest.approx(2.0)
    # left out in turn: references median(11,12)=11.5, median(10,12)=11, median(10,11)=10.5
    assert long.loo_mae_mm == pytest.approx((1.5 + 2.0 + 2.5) / 3)
    assert long.readers_loo_mae_mm == pytest.approx((1.5 + 0.0 + 1.5) / 3)
    assert scores.overall.short.mae_mm == pytest.approx(0.0)


def test_size_bins_coverage_and_share_measured() -> None:
    cases = [
        _case("small", [(4.0, 3.0)] * 3, _answer(4.5, 3.0, spread=1.0)),  # covered
        _case("mid", [(8.0, 5.0)] * 3, _answer(11.0, 5.0, spread=1.0)),  # not covered
        _case("big", [(25.0, 15.0)] * 3, _answer(None)),  # not measured
        _case("vessel", [(15.0, 9.0)] * 3, ClickAnswer(14.0, None, None, None, 0.3, "vessel")),
    ]
    scores = score_clicks(cases)
    assert scores.overall.n == 4 and scores.overall.measured == 2
    assert scores.bins["< 6 mm"].n == 1 and scores.bins["< 6 mm"].long.mae_mm == pytest.approx(0.5)
    assert scores.bins[">= 20 mm"].measured == 0 and math.isnan(scores.bins[">= 20 mm"].long.mae_mm)
    assert scores.bins["10-20 mm"].n == 1 and scores.bins["10-20 mm"].measured == 0  # a vessel
    long = scores.overall.long
    assert (long.coverage, long.coverage_n) == (0.5, 2)
    assert long.coverage_interval == pytest.approx(binomial_interval(1, 2))


def test_nothing_here_three_clicks_and_seconds() -> None:
    case = _case(
        "a",
        [(10.0, 6.0)] * 3,
        _answer(10.0),
        extra=(_answer(12.0), _answer(None)),
        outside=_answer(3.0),  # measured where nothing is: counted against it
    )
    quiet = _case("b", [(10.0, 6.0)] * 3, _answer(10.0), extra=(_answer(11.0), _answer(13.0)),
                  outside=_answer(None))  # fmt: skip
    scores = score_clicks([case, quiet])
    assert (scores.outside_n, scores.outside_measured) == (2, 1)
    # a: one pair (10, 12) -> 2; b: pairs 1, 3, 2 -> 2
    assert scores.three_click_n == 2 and scores.three_click_mad_mm == pytest.approx(2.0)
    assert scores.clicks == 8 and scores.seconds_median == pytest.approx(0.4)
    assert set(scores.to_json()) == {
        "overall", "size_bins", "nothing_here", "three_click", "seconds_per_click"
    }  # fmt: skip


def test_the_binomial_interval_and_bins() -> None:
    low, high = binomial_interval(90, 100)
    assert 0.82 < low < 0.84 and 0.94 < high < 0.96  # Clopper-Pearson for 90/100
    assert binomial_interval(0, 10)[0] == 0.0 and binomial_interval(10, 10)[1] == 1.0
    assert all(math.isnan(v) for v in binomial_interval(0, 0))
    assert [size_bin_of(v) for v in (5.99, 6.0, 10.0, 19.9, 20.0)] == [
        "< 6 mm", "6-10 mm", "10-20 mm", "10-20 mm", ">= 20 mm"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="size bin"):
        size_bin_of(-1.0)


def test_an_answer_from_a_finding() -> None:
    finding = StudyFinding(
        1, FindingKind.LESION, (0.0, 0.0, 0.0), 0,
        (Measurement(MeasurementName.LONG_AXIS, 9.0, (8.0, 10.0), 0.9),
         Measurement.not_measurable(MeasurementName.SHORT_AXIS, "weak")),
    )  # fmt: skip
    answer = ClickAnswer.of(finding, 0.25)
    assert answer.measured and answer.short_mm is None and answer.long_range_mm == (8.0, 10.0)
    assert not ClickAnswer.of(None, 0.1).measured
