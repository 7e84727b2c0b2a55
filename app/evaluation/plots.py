"""Plots of the evaluation (PNG, matplotlib's Agg backend): predicted vs true per mode,
Bland-Altman of the shipped model, coverage vs nominal level; and the audit tab's agreement of
model and reviewers.

The agreement figure survives any stored value: a pair whose model or reviewer value is not
plausible (not finite, not > 0, or over its measurement's limit: ``db.review.CorrectionLimits``,
e.g. a 1e308 mm correction stored before corrections were checked) is left out of the figure and
the statistics, and the summary says how many were left out and why.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from db.review import CorrectionLimits

__all__ = [
    "agreement_figure",
    "bland_altman",
    "coverage_vs_nominal",
    "measurement_agreement",
    "predicted_vs_true",
]

_NAMES = {"lesion": ("long axis", "short axis"), "vessel": ("diameter",)}

logger = logging.getLogger(__name__)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _points(items: Sequence[Any]) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = {}
    for item in items:
        if item.predicted is None:
            continue
        for name, p, t in zip(_NAMES[item.kind], item.predicted, item.truth, strict=True):
            truth, predicted = out.setdefault(name, ([], []))
            truth.append(t)
            predicted.append(p)
    return out


def predicted_vs_true(items_by_mode: Mapping[str, Sequence[Any]], path: Path, title: str) -> Path:
    """One panel per mode: predicted against true values (mm), the identity line drawn."""
    plt = _pyplot()
    modes = list(items_by_mode)
    figure, axes = plt.subplots(1, len(modes), figsize=(4 * len(modes), 4), squeeze=False)
    for axis, mode in zip(axes[0], modes, strict=True):
        points = _points(items_by_mode[mode])
        top = 1.0
        for name, (truth, predicted) in points.items():
            axis.scatter(truth, predicted, s=8, alpha=0.6, label=name)
            top = max(top, *truth, *predicted)
        axis.plot([0, top], [0, top], color="grey", linewidth=0.8)
        axis.set_title(mode)
        axis.set_xlabel("true (mm)")
        axis.set_ylabel("predicted (mm)")
        if points:
            axis.legend(fontsize=7)
    figure.suptitle(title)
    return _save(figure, path)


def _save(figure: Any, path: Path) -> Path:
    """Lay out, write (creating the folder) and close ``figure``."""
    plt = _pyplot()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _limits(axis: Any, differences: Sequence[float]) -> tuple[float, float]:
    """Draw the bias and the 95 % limits of agreement; returns (bias, 1.96 sd)."""
    bias = sum(differences) / len(differences)
    sd = math.sqrt(sum((d - bias) ** 2 for d in differences) / max(1, len(differences) - 1))
    for value, style in ((bias, "-"), (bias - 1.96 * sd, "--"), (bias + 1.96 * sd, "--")):
        axis.axhline(value, color="grey", linestyle=style, linewidth=0.8)
    return bias, 1.96 * sd


def bland_altman(items: Sequence[Any], path: Path, title: str) -> Path:
    """Difference (predicted - true) against the mean, with the bias and 95 % limits."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    differences: list[float] = []
    for name, (truth, predicted) in _points(items).items():
        means = [(a + b) / 2 for a, b in zip(truth, predicted, strict=True)]
        diffs = [b - a for a, b in zip(truth, predicted, strict=True)]
        differences += diffs
        axis.scatter(means, diffs, s=8, alpha=0.6, label=name)
    if differences:
        bias, limit = _limits(axis, differences)
        axis.set_title(f"{title}\nbias {bias:+.2f} mm, 95 % limits +- {limit:.2f} mm")
        axis.legend(fontsize=7)
    else:
        axis.set_title(title)
    axis.set_xlabel("mean of predicted and true (mm)")
    axis.set_ylabel("predicted - true (mm)")
    return _save(figure, path)


def coverage_vs_nominal(
    curves: Mapping[str, Sequence[Mapping[str, float]]], path: Path, title: str
) -> Path:
    """Empirical coverage of the calibrated ranges against their nominal level, per mode."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5, 5))
    axis.plot([0.5, 1.0], [0.5, 1.0], color="grey", linewidth=0.8)
    for mode, curve in curves.items():
        axis.plot(
            [c["nominal"] for c in curve],
            [c["coverage"] for c in curve],
            marker="o",
            label=mode,
        )
    axis.set_xlabel("nominal coverage")
    axis.set_ylabel("empirical coverage (test half)")
    axis.set_xlim(0.45, 1.0)
    axis.set_ylim(0.0, 1.0)
    axis.legend(fontsize=7)
    axis.set_title(title)
    return _save(figure, path)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def agreement_figure(
    rows: Sequence[Mapping[str, Any]], limits: CorrectionLimits | None = None
) -> tuple[Any, str]:
    """Model vs reviewer for audit rows: a Bland-Altman figure and a one-line summary with the
    coverage of the model's ranges against the reviewers' values.

    A reviewer's value is the corrected value, or the model's own value when accepted; rejected
    and pending rows have none. Pairs with a value that is not plausible under ``limits``
    (default ``CorrectionLimits()``) are left out and counted in the summary.
    """
    from db.review import CorrectionLimits

    limits = limits or CorrectionLimits()
    plt = _pyplot()
    pairs = []
    inside = 0
    implausible: list[Any] = []
    for row in rows:
        model = row.get("value_mm")
        if model is None:
            continue
        if row.get("status") == "corrected" and row.get("reviewed_value_mm") is not None:
            reviewer = row["reviewed_value_mm"]
        elif row.get("status") == "accepted":
            reviewer = model
        else:
            continue
        name = str(row.get("name"))
        # a value that is no number (text written into the column by hand) is implausible too
        if any(limits.problem(name, v) for v in (model, reviewer)):
            implausible.append(row.get("measurement_id"))
            continue
        pairs.append((float(model), float(reviewer)))
        span = row.get("range_mm")
        if span is not None and all(map(_number, span)) and span[0] <= reviewer <= span[1]:
            inside += 1
    figure, axis = plt.subplots(figsize=(6, 4))
    if pairs:
        means = [(m + r) / 2 for m, r in pairs]
        diffs = [m - r for m, r in pairs]
        axis.scatter(means, diffs, s=10, alpha=0.7)
        bias, limit = _limits(axis, diffs)
        summary = (
            f"{len(pairs)} reviewed measurements: model - reviewer bias {bias:+.2f} mm, 95 % "
            f"limits +- {limit:.2f} mm; the model's range held the reviewer's value in "
            f"{inside} of {len(pairs)} ({inside / len(pairs):.0%})"
        )
    else:
        summary = "no accepted or corrected measurements in this selection"
    if implausible:
        logger.warning(
            "agreement figure: %d measurement(s) with implausible values left out: %s",
            len(implausible),
            implausible,
        )
        summary += (
            f"; {len(implausible)} left out with an implausible value (not finite, not > 0 or "
            f"over the limit: long/short axis {limits.long_axis_mm:g}/{limits.short_axis_mm:g} "
            f"mm, diameter {limits.diameter_mm:g} mm): measurement "
            + ", ".join(str(m) for m in implausible[:10])
            + (f" and {len(implausible) - 10} more" if len(implausible) > 10 else "")
        )
    axis.set_xlabel("mean of model and reviewer (mm)")
    axis.set_ylabel("model - reviewer (mm)")
    axis.set_title("Model vs reviewer")
    figure.tight_layout()
    plt.close(figure)
    return figure, summary


def measurement_agreement(
    pairs: Sequence[tuple[str, float, float]], agreement_path: Path, scatter_path: Path, title: str
) -> tuple[Path, Path]:
    """From ``(name, predicted_mm, true_mm)`` pairs: a Bland-Altman panel per measurement name
    (bias and 95 % limits) and a predicted-vs-true panel per name. With no pair, each figure
    says so."""
    plt = _pyplot()
    by_name: dict[str, list[tuple[float, float]]] = {}
    for name, value, true in pairs:
        by_name.setdefault(name, []).append((value, true))
    names = sorted(by_name) or ["no matched measurement"]
    paths = []
    for path, scatter in ((agreement_path, False), (scatter_path, True)):
        figure, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 4), squeeze=False)
        for axis, name in zip(axes[0], names, strict=True):
            values = by_name.get(name, [])
            label = name.replace("_", " ")
            if not values:
                axis.set_title(label)
                continue
            predicted = [p for p, _ in values]
            truth = [t for _, t in values]
            if scatter:
                top = max(1.0, *predicted, *truth)
                axis.scatter(truth, predicted, s=12, alpha=0.7)
                axis.plot([0, top], [0, top], color="grey", linewidth=0.8)
                axis.set_xlabel("true (mm)")
                axis.set_ylabel("predicted (mm)")
                axis.set_title(f"{label} (n = {len(values)})")
            else:
                means = [(p + t) / 2 for p, t in values]
                diffs = [p - t for p, t in values]
                axis.scatter(means, diffs, s=12, alpha=0.7)
                bias, limit = _limits(axis, diffs)
                axis.set_xlabel("mean of predicted and true (mm)")
                axis.set_ylabel("predicted - true (mm)")
                axis.set_title(f"{label} (n = {len(values)})\nbias {bias:+.2f}, +- {limit:.2f} mm")
        figure.suptitle(title)
        paths.append(_save(figure, path))
    return paths[0], paths[1]
