"""Calibrated ranges: split-conformal intervals per measurement name.

On held-out phantoms the measurer's values are compared with the truth. For each measurement
name, with ``n`` held-out pairs and nominal coverage ``1 - a``, the score quantile
``q = s_(k)``, ``k = ceil((n + 1)(1 - a))`` (the k-th smallest score) gives intervals that cover a
new true value with probability >= 1 - a when the new case is exchangeable with the held-out ones
(split conformal prediction). Two scores are fitted:

- absolute: ``s = |y - y_hat|``, interval ``y_hat +- q`` (same width for every size);
- size-adaptive: ``s = |y - y_hat| / max(y_hat, floor)``, interval ``y_hat +- q max(y_hat, floor)``
  (wider for larger findings, where errors are larger).

The adaptive score is used for a name when its mean width on the held-out set is smaller than the
absolute one's (both have the same coverage guarantee); otherwise absolute. Lower bounds are
clipped at 0 mm. With too few pairs for the requested coverage (``k > n``) there is no finite
interval and fitting raises. The MAE the ranges rest on is stored with them ("MAE-calibrated").

The same held-out studies fit the checkpoint's ``DecodeCheck``: the weakest numeric decode it
stands behind. Each measure answer carries the decode confidence of its weakest number
(``NumericHead.confidence``: for RNED the peak correlation of the hidden state with its value's
codeword). With the ``n`` confidences of the answers on the calibration studies, a new answer's
conformal p-value is ``(1 + #{c_i <= c}) / (n + 1)``; it is rejected ("not measurable") when that
is at most ``quantile``, i.e. when ``c < c_(k)``, ``k = floor(quantile (n + 1))``. Under
exchangeability a validated-like answer is wrongly rejected with probability <= ``quantile``;
an answer weaker than nearly every validated one is outside what was validated.

They also fit the ``DetectionThreshold``: the presence (the point task's probability that
something is at a candidate) below which a finding is not reported, chosen for a budget of
false findings per study (``model.measurer.calibrate.operating``).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_COVERAGE",
    "DEFAULT_DECODE_QUANTILE",
    "Calibration",
    "DecodeCheck",
    "DetectionThreshold",
    "IntervalRule",
    "ScoreKind",
    "SizeBin",
    "fit_binned_calibration",
    "fit_calibration",
    "fit_decode_check",
]

DEFAULT_COVERAGE = 0.90
DEFAULT_DECODE_QUANTILE = 0.01
_FLOOR_MM = 1.0  # adaptive score: sizes below this count as this (no division by ~0)


class ScoreKind(enum.StrEnum):
    ABSOLUTE = "absolute"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class IntervalRule:
    """The fitted interval of one measurement name."""

    kind: ScoreKind
    quantile: float  # q: mm (absolute) or a fraction of the value (adaptive)
    floor_mm: float
    coverage: float  # nominal
    n: int  # held-out pairs it was fitted on
    mae_mm: float  # mean absolute error on those pairs
    empirical_coverage: float  # fraction of those pairs inside their interval
    mean_width_mm: float

    def interval(self, value_mm: float) -> tuple[float, float]:
        """(low, high) around ``value_mm``; low clipped at 0."""
        half = self.quantile * (max(value_mm, self.floor_mm) if self.kind == "adaptive" else 1.0)
        return (max(0.0, value_mm - half), value_mm + half)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "quantile": self.quantile,
            "floor_mm": self.floor_mm,
            "coverage": self.coverage,
            "n": self.n,
            "mae_mm": self.mae_mm,
            "empirical_coverage": self.empirical_coverage,
            "mean_width_mm": self.mean_width_mm,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IntervalRule:
        return cls(
            kind=ScoreKind(data["kind"]),
            quantile=float(data["quantile"]),
            floor_mm=float(data["floor_mm"]),
            coverage=float(data["coverage"]),
            n=int(data["n"]),
            mae_mm=float(data["mae_mm"]),
            empirical_coverage=float(data["empirical_coverage"]),
            mean_width_mm=float(data["mean_width_mm"]),
        )


@dataclass(frozen=True)
class SizeBin:
    """The rule of one size bin of a name: values in ``[low_mm, high_mm)``."""

    low_mm: float
    high_mm: float
    rule: IntervalRule

    def to_json(self) -> dict[str, Any]:
        high = None if math.isinf(self.high_mm) else self.high_mm
        return {"low_mm": self.low_mm, "high_mm": high, "rule": self.rule.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SizeBin:
        high = data.get("high_mm")
        return cls(
            float(data["low_mm"]),
            math.inf if high is None else float(high),
            IntervalRule.from_json(data["rule"]),
        )


_BINS_KEY = "_size_bins"


@dataclass(frozen=True)
class Calibration:
    """Interval rules by measurement name (saved with the checkpoint as JSON); where a name
    has ``bins``, the rule of the bin its value falls in (Mondrian conformal: each bin's
    coverage holds on its own)."""

    rules: Mapping[str, IntervalRule]
    bins: Mapping[str, tuple[SizeBin, ...]] = dataclasses.field(default_factory=dict)

    def rule(self, name: str, value_mm: float) -> IntervalRule | None:
        """The rule that makes a value's range: its size bin's, else its name's."""
        for size_bin in self.bins.get(str(name), ()):
            if size_bin.low_mm <= value_mm < size_bin.high_mm:
                return size_bin.rule
        return self.rules.get(str(name))

    def interval(self, name: str, value_mm: float) -> tuple[float, float] | None:
        """The calibrated range of a value, or None when ``name`` was never calibrated."""
        rule = self.rule(name, value_mm)
        return None if rule is None else rule.interval(value_mm)

    def coverage(self, name: str) -> float | None:
        rule = self.rules.get(str(name))
        return None if rule is None else rule.coverage

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {name: rule.to_json() for name, rule in sorted(self.rules.items())}
        if self.bins:  # written only when there are bins: older files stay the same
            data[_BINS_KEY] = {
                name: [b.to_json() for b in bins] for name, bins in sorted(self.bins.items())
            }
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        bins = data.get(_BINS_KEY, {})
        return cls(
            {
                name: IntervalRule.from_json(rule)
                for name, rule in data.items()
                if name != _BINS_KEY
            },
            {name: tuple(SizeBin.from_json(b) for b in rows) for name, rows in bins.items()},
        )


def fit_calibration(
    pairs: Iterable[tuple[str, float, float]],
    coverage: float = DEFAULT_COVERAGE,
    *,
    floor_mm: float = _FLOOR_MM,
) -> Calibration:
    """Fit per-name rules from ``(name, predicted_mm, true_mm)`` held-out pairs.

    Raises ValueError for a coverage outside (0, 1), non-finite values, or a name with too few
    pairs for that coverage (``ceil((n + 1) coverage) > n``; e.g. 0.90 needs n >= 9).
    """
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    by_name: dict[str, list[tuple[float, float]]] = {}
    for name, predicted, true in pairs:
        if not (math.isfinite(predicted) and math.isfinite(true)):
            raise ValueError(f"{name}: non-finite pair ({predicted}, {true})")
        by_name.setdefault(str(name), []).append((float(predicted), float(true)))
    return Calibration(
        {name: _fit(name, values, coverage, floor_mm) for name, values in by_name.items()}
    )


def fit_binned_calibration(
    pairs: Iterable[tuple[str, float, float]],
    edges_mm: Iterable[float],
    coverage: float = DEFAULT_COVERAGE,
    *,
    floor_mm: float = _FLOOR_MM,
) -> Calibration:
    """Per-name rules (:func:`fit_calibration`) and, within each name, one rule per size bin of
    the *predicted* value (``edges_mm``: the inner edges, e.g. 6, 10, 20 mm): split conformal
    within each bin (Mondrian), so a bin whose errors are larger gets wider ranges and each
    bin's coverage holds on its own. A bin with too few pairs for ``coverage`` is merged into
    its smaller neighbour (the first bin into the next). Raises ValueError as
    :func:`fit_calibration` does, or for edges that are not increasing positive numbers."""
    listed = list(pairs)
    overall = fit_calibration(listed, coverage, floor_mm=floor_mm)
    edges = [float(e) for e in edges_mm]
    if any(not (math.isfinite(e) and e > 0) for e in edges) or edges != sorted(set(edges)):
        raise ValueError(f"edges_mm must be increasing positive numbers, got {edges}")
    need = math.ceil(coverage / (1 - coverage))
    bounds = [0.0, *edges, math.inf]
    by_name: dict[str, list[tuple[float, float]]] = {}
    for name, predicted, true in listed:
        by_name.setdefault(str(name), []).append((float(predicted), float(true)))
    bins: dict[str, tuple[SizeBin, ...]] = {}
    for name, values in by_name.items():
        groups = [
            [lo, hi, [(p, t) for p, t in values if lo <= p < hi]]
            for lo, hi in itertools.pairwise(bounds)
        ]
        merged: list[list[Any]] = []
        for group in groups:
            if merged and len(merged[-1][2]) < need:  # the previous bin is too small: widen it
                merged[-1][1], merged[-1][2] = group[1], merged[-1][2] + group[2]
            else:
                merged.append(group)
        if len(merged) > 1 and len(merged[-1][2]) < need:  # the last one: into its neighbour
            last = merged.pop()
            merged[-1][1], merged[-1][2] = last[1], merged[-1][2] + last[2]
        bins[name] = tuple(
            SizeBin(lo, hi, _fit(f"{name} [{lo:g}, {hi:g}) mm", group, coverage, floor_mm))
            for lo, hi, group in merged
        )
    return Calibration(overall.rules, bins)


def _fit(
    name: str, pairs: list[tuple[float, float]], coverage: float, floor_mm: float
) -> IntervalRule:
    n = len(pairs)
    k = math.ceil((n + 1) * coverage)
    if k > n:
        need = math.ceil(coverage / (1 - coverage))
        raise ValueError(
            f"{name}: {n} held-out values are too few for coverage {coverage:g} "
            f"(need at least {need}); calibrate on more studies"
        )
    mae = sum(abs(t - p) for p, t in pairs) / n
    candidates = []
    for kind in ScoreKind:
        scores = sorted(
            abs(t - p) / (max(p, floor_mm) if kind == "adaptive" else 1.0) for p, t in pairs
        )
        q = scores[k - 1]
        rule = IntervalRule(kind, q, floor_mm, coverage, n, mae, 0.0, 0.0)
        intervals = [rule.interval(p) for p, _ in pairs]
        inside = sum(lo <= t <= hi for (lo, hi), (_, t) in zip(intervals, pairs, strict=True))
        width = sum(hi - lo for lo, hi in intervals) / n
        candidates.append(IntervalRule(kind, q, floor_mm, coverage, n, mae, inside / n, width))
    absolute, adaptive = candidates
    return adaptive if adaptive.mean_width_mm < absolute.mean_width_mm else absolute


@dataclass(frozen=True)
class DecodeCheck:
    """The weakest numeric decode a checkpoint reports as a number (module doc)."""

    min_confidence: float  # answers whose weakest number decodes below this: not measurable
    quantile: float  # the conformal level it was fitted at
    n: int  # calibration answers it was fitted on

    def accepts(self, confidence: float | None) -> bool:
        """Whether an answer with this weakest decode confidence may be reported; an answer
        without numbers or from a head with no confidence measure (None, NaN) is not judged."""
        return confidence is None or math.isnan(confidence) or confidence >= self.min_confidence

    def reason(self, confidence: float) -> str:
        """Why an answer was refused, for the "not measurable" measurement."""
        return (
            f"low-confidence numeric decode: peak correlation {confidence:.3f} is below "
            f"{self.min_confidence:.3f}, weaker than all but {self.quantile:.0%} of the "
            f"{self.n} decodes on the checkpoint's calibration studies"
        )

    def to_json(self) -> dict[str, Any]:
        return {"min_confidence": self.min_confidence, "quantile": self.quantile, "n": self.n}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecodeCheck:
        return cls(float(data["min_confidence"]), float(data["quantile"]), int(data["n"]))


@dataclass(frozen=True)
class DetectionThreshold:
    """A checkpoint's detection operating point (``model.measurer.calibrate.operating``).

    Args:
        min_presence: a finding whose presence is below this is not reported.
        false_per_study: the budget it was fitted for.
        fitted_false_per_study: false findings per study at it on the calibration studies.
        fitted_recall: lesions >= 10 mm found at it on the calibration studies (NaN: none).
        studies: measured calibration studies it was fitted on.
    """

    min_presence: float
    false_per_study: float
    fitted_false_per_study: float
    fitted_recall: float
    studies: int

    def accepts(self, presence: float | None) -> bool:
        """Whether a finding of this presence is reported (None: not verified, not judged)."""
        return presence is None or presence >= self.min_presence

    def to_json(self) -> dict[str, Any]:
        return {
            "min_presence": self.min_presence,
            "false_per_study": self.false_per_study,
            "fitted_false_per_study": self.fitted_false_per_study,
            "fitted_recall": None if math.isnan(self.fitted_recall) else self.fitted_recall,
            "studies": self.studies,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DetectionThreshold:
        recall = data.get("fitted_recall")
        return cls(
            float(data["min_presence"]),
            float(data["false_per_study"]),
            float(data["fitted_false_per_study"]),
            math.nan if recall is None else float(recall),
            int(data["studies"]),
        )


def fit_decode_check(
    confidences: Iterable[float | None], quantile: float = DEFAULT_DECODE_QUANTILE
) -> DecodeCheck | None:
    """The ``DecodeCheck`` of held-out answers' weakest decode confidences (module doc).

    None and NaN entries (no numbers, no confidence measure) are left out. Returns None when
    fewer than ``1 / quantile - 1`` confidences remain: too few to reject anything at that
    level. Raises ValueError for a quantile outside (0, 0.5).
    """
    if not 0 < quantile < 0.5:
        raise ValueError(f"quantile must be in (0, 0.5), got {quantile}")
    values = sorted(c for c in confidences if c is not None and not math.isnan(c))
    k = math.floor(quantile * (len(values) + 1))
    if k < 1:
        return None
    return DecodeCheck(values[k - 1], quantile, len(values))
