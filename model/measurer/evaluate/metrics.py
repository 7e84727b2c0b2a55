"""The RNED paper's metrics, made precise (``shared/design/rned-notes.md``), with paired bootstrap
intervals.

An item is one finding measured at its true centre: a vessel is a *single*-value item
(diameter), a lesion a *dual*-value item (long x short). An answer succeeds when it parses into
exactly the expected count of numbers; the value metrics are over successful items:

- single MAE (mm) and R^2 of the diameters; the same for the long axis alone;
- dual MAE in mm^2 and dual R^2 of the products long x short;
- long-axis and short-axis MAE after sorting each predicted pair (long >= short);
- the same MAEs on the items that *every* compared mode parsed (MAE over successes flatters
  a mode that fails often);
- paired bootstrap 95 % intervals: the items are resampled with replacement, the same draw for
  every mode, so differences between modes are paired.

Pure NumPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "NumericItem",
    "bootstrap_intervals",
    "common_items",
    "numeric_metrics",
    "r_squared",
]


@dataclass(frozen=True)
class NumericItem:
    """One measured finding: what was true and what the model answered (None: no parse)."""

    item_id: str
    kind: str  # "lesion" (dual) or "vessel" (single)
    truth: tuple[float, ...]  # lesion (long, short), vessel (diameter,)
    predicted: tuple[float, ...] | None  # sorted like truth; None when the answer failed


def r_squared(truth: Sequence[float], predicted: Sequence[float]) -> float:
    """1 - SS_res / SS_tot (NaN with fewer than two items or no spread)."""
    t = np.asarray(truth, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if t.size < 2:
        return math.nan
    total = float(((t - t.mean()) ** 2).sum())
    if total == 0:
        return math.nan
    return 1.0 - float(((t - p) ** 2).sum()) / total


def _mae(pairs: Sequence[tuple[float, float]]) -> float:
    return float(np.mean([abs(a - b) for a, b in pairs])) if pairs else math.nan


def numeric_metrics(
    items: Sequence[NumericItem], *, restrict_to: set[str] | None = None
) -> dict[str, float]:
    """The metrics of one mode's items (module doc); ``restrict_to``: only these item ids."""
    chosen = [i for i in items if restrict_to is None or i.item_id in restrict_to]
    ok = [i for i in chosen if i.predicted is not None]
    single = [(i.predicted[0], i.truth[0]) for i in ok if i.kind == "vessel" and i.predicted]
    dual = [(i.predicted, i.truth) for i in ok if i.kind == "lesion" and i.predicted]
    longs = [(p[0], t[0]) for p, t in dual]
    shorts = [(p[1], t[1]) for p, t in dual]
    products = [(p[0] * p[1], t[0] * t[1]) for p, t in dual]
    return {
        "items": float(len(chosen)),
        "success": len(ok) / len(chosen) if chosen else math.nan,
        "single_mae": _mae(single),
        "single_r2": r_squared([t for _, t in single], [p for p, _ in single]),
        "long_single_mae": _mae(longs),
        "long_single_r2": r_squared([t for _, t in longs], [p for p, _ in longs]),
        "dual_mae_mm2": _mae(products),
        "dual_r2": r_squared([t for _, t in products], [p for p, _ in products]),
        "long_mae": _mae(longs),
        "short_mae": _mae(shorts),
    }


def common_items(items_by_mode: Mapping[str, Sequence[NumericItem]]) -> set[str]:
    """Ids of the items that every mode answered successfully."""
    sets = [
        {i.item_id for i in items if i.predicted is not None} for items in items_by_mode.values()
    ]
    return set.intersection(*sets) if sets else set()


def bootstrap_intervals(
    items_by_mode: Mapping[str, Sequence[NumericItem]],
    metric: Callable[[Sequence[NumericItem]], float],
    *,
    draws: int = 1000,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """95 % percentile intervals of ``metric`` per mode, from paired resamples of the items.

    Every mode must hold the same item ids (in any order): one draw of ids serves all modes.
    """
    modes = list(items_by_mode)
    if not modes:
        return {}
    ids = sorted({i.item_id for i in items_by_mode[modes[0]]})
    by_id = {m: {i.item_id: i for i in items_by_mode[m]} for m in modes}
    for m in modes:
        if set(by_id[m]) != set(ids):
            raise ValueError(f"mode {m} has other items than {modes[0]}; pair them first")
    rng = np.random.default_rng(seed)
    values: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(draws):
        draw = rng.integers(0, len(ids), len(ids))
        for m in modes:
            sample = [by_id[m][ids[k]] for k in draw]
            values[m].append(metric(sample))
    out = {}
    for m in modes:
        finite = [v for v in values[m] if math.isfinite(v)]
        out[m] = (
            (float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5)))
            if finite
            else (math.nan, math.nan)
        )
    return out
