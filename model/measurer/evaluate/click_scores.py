"""The clicked measurement scored against radiologists (``radcaliper evaluate --task click``).

One :class:`ClickCase` per lesion: the readers' reads (each reader's long and short axis), the
truth (the readers' median), and what a measurer answered at a click inside the lesion on its
largest slice (:class:`ClickAnswer`), at two more clicks inside it, and at a click in the lung
at least 5 mm outside any lesion. :func:`score_clicks` gives every figure of the scoreboard:

- **share measured**: lesions whose click (on the largest slice) was answered with a lesion's
  long axis;
- **MAE and bias** (predicted - truth) of the long and short axis against the readers' median;
- **leave one reader out**: for each reader in turn, the reference is the median of the *other*
  readers; the measurer's error against it and that reader's own error against it are each
  averaged over the readers of the case, so both are scored against the same references. The
  readers' MAE is over the same rows as the measurer's (the rows it measured);
- the same **per size bin** of the truth's long axis (< 6, 6-10, 10-20, >= 20 mm) with n;
- **coverage** of the ranges (the share of measured rows whose range holds the truth), with its
  95 % Clopper-Pearson interval for that n;
- **nothing here**: of the clicks outside any lesion, how many were measured (should be none);
- **three-click agreement**: the mean absolute difference of the long axis between the three
  clicks of a lesion (pairs of clicks that both measured), averaged over lesions;
- **seconds per click** on an already loaded volume (median and mean).

Pure NumPy and SciPy (the binomial interval); no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from model.measurer.results import FindingKind, MeasurementName, StudyFinding

__all__ = [
    "SIZE_BINS_MM",
    "AxisScores",
    "ClickAnswer",
    "ClickCase",
    "ClickScores",
    "GroupScores",
    "binomial_interval",
    "score_clicks",
    "size_bin_of",
]

#: the size bins of the truth's long axis (mm): [low, high)
SIZE_BINS_MM: tuple[tuple[str, float, float], ...] = (
    ("< 6 mm", 0.0, 6.0),
    ("6-10 mm", 6.0, 10.0),
    ("10-20 mm", 10.0, 20.0),
    (">= 20 mm", 20.0, math.inf),
)


def size_bin_of(long_axis_mm: float) -> str:
    """The size bin of a truth's long axis."""
    for name, low, high in SIZE_BINS_MM:
        if low <= long_axis_mm < high:
            return name
    raise ValueError(f"no size bin for a long axis of {long_axis_mm} mm")


@dataclass(frozen=True)
class ClickAnswer:
    """What a measurer answered at one click: a lesion's long and short axis with their ranges,
    or nothing (``long_mm`` None), and how long it took."""

    long_mm: float | None
    short_mm: float | None
    long_range_mm: tuple[float, float] | None
    short_range_mm: tuple[float, float] | None
    seconds: float
    kind: str | None = None  # what was answered ("lesion", "vessel"), None: nothing

    @property
    def measured(self) -> bool:
        """A lesion's long axis was given (the clicked task: measure this lesion)."""
        return self.kind == FindingKind.LESION and self.long_mm is not None

    @classmethod
    def of(cls, finding: StudyFinding | None, seconds: float) -> ClickAnswer:
        """The answer a ``measure_at`` finding (None: nothing there) gives."""
        if finding is None:
            return cls(None, None, None, None, seconds)
        values = {m.name: m for m in finding.measurements}
        long = values.get(MeasurementName.LONG_AXIS)
        short = values.get(MeasurementName.SHORT_AXIS)
        return cls(
            None if long is None else long.value_mm,
            None if short is None else short.value_mm,
            None if long is None else long.range_mm,
            None if short is None else short.range_mm,
            seconds,
            str(finding.kind),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "long_mm": self.long_mm,
            "short_mm": self.short_mm,
            "long_range_mm": None if self.long_range_mm is None else list(self.long_range_mm),
            "short_range_mm": None if self.short_range_mm is None else list(self.short_range_mm),
            "seconds": round(self.seconds, 4),
        }


@dataclass(frozen=True)
class ClickCase:
    """One lesion: the readers' reads, the truth (their median) and a measurer's answers."""

    case: str
    patient: str
    truth_long_mm: float
    truth_short_mm: float
    reads: tuple[tuple[float, float], ...]  # each reader's (long, short)
    answer: ClickAnswer  # at the click on the largest slice
    extra: tuple[ClickAnswer, ...] = ()  # at the further clicks inside the lesion
    outside: ClickAnswer | None = None  # at a click in the lung outside any lesion

    @property
    def size_bin(self) -> str:
        return size_bin_of(self.truth_long_mm)

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "patient": self.patient,
            "truth_long_mm": self.truth_long_mm,
            "truth_short_mm": self.truth_short_mm,
            "reads": [list(r) for r in self.reads],
            "size_bin": self.size_bin,
            "answer": self.answer.to_json(),
            "extra": [a.to_json() for a in self.extra],
            "outside": None if self.outside is None else self.outside.to_json(),
        }


def binomial_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson interval of a proportion (NaNs for n = 0)."""
    from scipy.stats import beta

    if n == 0:
        return (math.nan, math.nan)
    alpha = 1 - level
    low = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, n - successes + 1))
    high = 1.0 if successes == n else float(beta.ppf(1 - alpha / 2, successes + 1, n - successes))
    return (low, high)


def _leave_one_out(reads: Sequence[float], predicted: float) -> tuple[float, float]:
    """(the measurer's, the readers') absolute error against the median of the other readers,
    each averaged over the readers left out in turn."""
    mine, theirs = [], []
    for i, read in enumerate(reads):
        others = [r for j, r in enumerate(reads) if j != i]
        if not others:
            continue
        reference = float(np.median(others))
        mine.append(abs(predicted - reference))
        theirs.append(abs(read - reference))
    return (float(np.mean(mine)), float(np.mean(theirs))) if mine else (math.nan, math.nan)


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


@dataclass(frozen=True)
class AxisScores:
    """One axis (long or short) over a set of measured rows."""

    n: int
    mae_mm: float
    bias_mm: float  # mean of predicted - truth
    loo_mae_mm: float  # against the median of the other readers, averaged
    readers_loo_mae_mm: float  # the readers' own, on the same rows
    coverage: float  # of the truth by the range (rows with a range)
    coverage_n: int
    coverage_interval: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mae_mm": self.mae_mm,
            "bias_mm": self.bias_mm,
            "loo_mae_mm": self.loo_mae_mm,
            "readers_loo_mae_mm": self.readers_loo_mae_mm,
            "coverage": self.coverage,
            "coverage_n": self.coverage_n,
            "coverage_interval": list(self.coverage_interval),
        }


def _axis(cases: Sequence[ClickCase], long: bool) -> AxisScores:
    rows = []
    for c in cases:
        predicted = c.answer.long_mm if long else c.answer.short_mm
        if not c.answer.measured or predicted is None:
            continue
        truth = c.truth_long_mm if long else c.truth_short_mm
        reads = [r[0] if long else r[1] for r in c.reads]
        interval = c.answer.long_range_mm if long else c.answer.short_range_mm
        rows.append((predicted, truth, _leave_one_out(reads, predicted), interval))
    covered = [lo <= t <= hi for _, t, _, r in rows if r is not None for lo, hi in [r]]
    hits = int(sum(covered))
    return AxisScores(
        n=len(rows),
        mae_mm=_mean([abs(p - t) for p, t, _, _ in rows]),
        bias_mm=_mean([p - t for p, t, _, _ in rows]),
        loo_mae_mm=_mean([loo[0] for _, _, loo, _ in rows]),
        readers_loo_mae_mm=_mean([loo[1] for _, _, loo, _ in rows]),
        coverage=hits / len(covered) if covered else math.nan,
        coverage_n=len(covered),
        coverage_interval=binomial_interval(hits, len(covered)),
    )


@dataclass(frozen=True)
class GroupScores:
    """The scores of a set of lesions (all, or one size bin)."""

    n: int
    measured: int
    long: AxisScores
    short: AxisScores

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "measured": self.measured,
            "long_axis": self.long.to_json(),
            "short_axis": self.short.to_json(),
        }


def _group(cases: Sequence[ClickCase]) -> GroupScores:
    return GroupScores(
        n=len(cases),
        measured=sum(c.answer.measured for c in cases),
        long=_axis(cases, long=True),
        short=_axis(cases, long=False),
    )


@dataclass(frozen=True)
class ClickScores:
    """Every figure of the click scoreboard (module doc)."""

    overall: GroupScores
    bins: dict[str, GroupScores]
    outside_n: int  # clicks placed outside any lesion
    outside_measured: int  # of them, answered with a measurement (should be 0)
    three_click_n: int  # lesions with at least two of their three clicks measured
    three_click_mad_mm: float  # mean absolute long-axis difference between clicks
    seconds_median: float
    seconds_mean: float
    clicks: int
    cases: tuple[ClickCase, ...] = field(repr=False, default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_json(),
            "size_bins": {name: scores.to_json() for name, scores in self.bins.items()},
            "nothing_here": {"clicks": self.outside_n, "measured": self.outside_measured},
            "three_click": {"n": self.three_click_n, "long_axis_mad_mm": self.three_click_mad_mm},
            "seconds_per_click": {
                "median": self.seconds_median,
                "mean": self.seconds_mean,
                "clicks": self.clicks,
            },
        }


def score_clicks(cases: Sequence[ClickCase]) -> ClickScores:
    """Every figure of the scoreboard over ``cases`` (module doc)."""
    bins = {name: _group([c for c in cases if c.size_bin == name]) for name, _, _ in SIZE_BINS_MM}
    outside = [c.outside for c in cases if c.outside is not None]
    differences = []
    for c in cases:
        longs = [a.long_mm for a in (c.answer, *c.extra) if a.measured and a.long_mm is not None]
        pairs = [abs(a - b) for a, b in combinations(longs, 2)]
        if pairs:
            differences.append(float(np.mean(pairs)))
    seconds = [a.seconds for c in cases for a in (c.answer, *c.extra)]
    seconds += [a.seconds for a in outside]
    return ClickScores(
        overall=_group(cases),
        bins=bins,
        outside_n=len(outside),
        outside_measured=sum(a.measured for a in outside),
        three_click_n=len(differences),
        three_click_mad_mm=_mean(differences),
        seconds_median=float(np.median(seconds)) if seconds else math.nan,
        seconds_mean=_mean(seconds),
        clicks=len(seconds),
        cases=tuple(cases),
    )
