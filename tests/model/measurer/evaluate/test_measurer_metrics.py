"""The paper's metrics (model.measurer.evaluate.metrics) on hand-made items."""

from __future__ import annotations

import math

import pytest

from model.measurer.evaluate.metrics import (
    NumericItem,
    bootstrap_intervals,
    common_items,
    numeric_metrics,
    r_squared,
)


def items(offset: float, failed: tuple[str, ...] = ()) -> list[NumericItem]:
    out = []
    for k, (truth) in enumerate([(20.0,), (30.0,), (40.0,)]):
        item_id = f"v{k}"
        predicted = None if item_id in failed else (truth[0] + offset,)
        out.append(NumericItem(item_id, "vessel", truth, predicted))
    for k, truth in enumerate([(30.0, 10.0), (50.0, 20.0)]):
        item_id = f"l{k}"
        predicted = None if item_id in failed else (truth[0] + offset, truth[1] - offset)
        out.append(NumericItem(item_id, "lesion", truth, predicted))
    return out


def test_metrics_of_a_constant_offset() -> None:
    m = numeric_metrics(items(1.0))
    assert m["success"] == 1.0 and m["items"] == 5
    assert m["single_mae"] == pytest.approx(1.0)
    assert m["long_mae"] == m["short_mae"] == pytest.approx(1.0)
    # products: 31 * 9 = 279 vs 300, 51 * 19 = 969 vs 1000
    assert m["dual_mae_mm2"] == pytest.approx((21 + 31) / 2)
    assert m["single_r2"] == pytest.approx(1 - 3 / 200)
    perfect = numeric_metrics(items(0.0))
    assert perfect["single_r2"] == 1.0 and perfect["dual_r2"] == 1.0


def test_failures_count_in_success_not_in_mae() -> None:
    m = numeric_metrics(items(2.0, failed=("v0", "l1")))
    assert m["success"] == pytest.approx(3 / 5)
    assert m["single_mae"] == pytest.approx(2.0)
    assert m["dual_mae_mm2"] == pytest.approx(abs(32 * 8 - 300))


def test_common_items_and_restriction() -> None:
    by_mode = {"a": items(1.0, failed=("v0",)), "b": items(3.0, failed=("l0",))}
    common = common_items(by_mode)
    assert common == {"v1", "v2", "l1"}
    restricted = numeric_metrics(by_mode["b"], restrict_to=common)
    assert restricted["items"] == 3 and restricted["single_mae"] == pytest.approx(3.0)


def test_r_squared_edge_cases() -> None:
    assert math.isnan(r_squared([1.0], [1.0]))
    assert math.isnan(r_squared([2.0, 2.0], [1.0, 3.0]))
    assert r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0


def test_paired_bootstrap_brackets_the_metric_and_is_seeded() -> None:
    by_mode = {"a": items(1.0), "b": items(4.0)}

    def mae(sample: list[NumericItem]) -> float:
        return numeric_metrics(sample)["long_mae"]

    first = bootstrap_intervals(by_mode, mae, draws=200, seed=3)
    assert first == bootstrap_intervals(by_mode, mae, draws=200, seed=3)
    assert first["a"][0] <= 1.0 <= first["a"][1] and first["b"][0] <= 4.0 <= first["b"][1]
    with pytest.raises(ValueError, match="other items"):
        bootstrap_intervals({"a": items(1.0), "b": items(1.0)[:-1]}, mae)
