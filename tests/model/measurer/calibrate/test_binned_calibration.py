"""Ranges per size bin (``fit_binned_calibration``): Mondrian split conformal."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from model.measurer.calibrate.calibration import (
    Calibration,
    fit_binned_calibration,
    fit_calibration,
)


def _pairs(rng: np.random.Generator, n: int) -> list[tuple[str, float, float]]:
    """Small findings measured well, large ones badly: one width cannot fit both."""
    out = []
    for true in rng.uniform(3.0, 40.0, n):
        spread = 0.2 if true < 10 else 4.0
        out.append(("long_axis", float(true + rng.normal(0.0, spread)), float(true)))
    return out


def _covered(calibration: Calibration, rows: list[tuple[float, float]]) -> float:
    inside = []
    for predicted, true in rows:
        interval = calibration.interval("long_axis", predicted)
        assert interval is not None
        inside.append(interval[0] <= true <= interval[1])
    return float(np.mean(inside))


def test_each_bin_covers_on_its_own() -> None:
    rng = np.random.default_rng(11)
    calibration = fit_binned_calibration(_pairs(rng, 600), (6.0, 10.0, 20.0))
    single = fit_calibration(_pairs(np.random.default_rng(11), 600))
    fresh = _pairs(np.random.default_rng(12), 4000)
    pooled_off = 0.0
    for low, high in ((0, 6), (6, 10), (10, 20), (20, math.inf)):
        rows = [(p, t) for _, p, t in fresh if low <= p < high]
        binned = _covered(calibration, rows)
        assert 0.86 <= binned <= 0.95, (low, binned)
        pooled_off = max(pooled_off, abs(_covered(single, rows) - 0.9))
    assert pooled_off >= 0.05  # one rule for every size misses some bin's coverage


def test_a_bin_is_the_split_conformal_quantile_of_its_pairs() -> None:
    rng = np.random.default_rng(3)
    pairs = _pairs(rng, 300)
    calibration = fit_binned_calibration(pairs, (10.0,))
    (small, large) = calibration.bins["long_axis"]
    assert (small.low_mm, small.high_mm, large.low_mm, large.high_mm) == (0.0, 10.0, 10.0, math.inf)
    rows = [(p, t) for _, p, t in pairs if p >= 10.0]
    n = len(rows)
    k = math.ceil((n + 1) * 0.9)
    absolute = sorted(abs(t - p) for p, t in rows)[k - 1]
    adaptive = sorted(abs(t - p) / max(p, 1.0) for p, t in rows)[k - 1]
    assert large.rule.n == n
    assert large.rule.quantile in (pytest.approx(absolute), pytest.approx(adaptive))


def test_small_bins_are_merged_into_a_neighbour() -> None:
    rng = np.random.default_rng(4)
    pairs = [("long_axis", float(p), float(p + rng.normal(0, 0.5))) for p in rng.uniform(3, 9, 40)]
    pairs += [("long_axis", 30.0 + i, 30.0 + i) for i in range(3)]  # 3 large: too few for 0.9
    calibration = fit_binned_calibration(pairs, (6.0, 10.0, 20.0))
    bins = calibration.bins["long_axis"]
    assert bins[-1].high_mm == math.inf
    assert all(b.rule.n >= 9 for b in bins)
    assert sum(b.rule.n for b in bins) == len(pairs)
    # contiguous, from 0 to infinity
    assert bins[0].low_mm == 0.0
    assert all(a.high_mm == b.low_mm for a, b in itertools.pairwise(bins))


def test_json_round_trip_and_older_files() -> None:
    calibration = fit_binned_calibration(_pairs(np.random.default_rng(5), 200), (6.0, 10.0, 20.0))
    assert Calibration.from_json(calibration.to_json()) == calibration
    plain = fit_calibration(_pairs(np.random.default_rng(5), 200))
    assert "_size_bins" not in plain.to_json()  # a checkpoint without bins is written as before
    assert Calibration.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("edges", [(10.0, 6.0), (0.0,), (-1.0,), (math.inf,), (6.0, 6.0)])
def test_bad_edges_are_refused(edges: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="edges_mm"):
        fit_binned_calibration(_pairs(np.random.default_rng(1), 100), edges)
