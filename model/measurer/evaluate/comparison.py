"""The evaluation harness: numeric and positional modes compared on the same data, backbone,
budget and seed (issue 7; ``radcaliper evaluate``).

Configurations (:data:`CONFIGURATIONS`):

- numeric modes, all with Circle-RoPE + AGE (alternate): ``rned_rnd`` (the paper's decoder,
  score-MSE loss), ``rned_corr`` (correlation decoder, candidate softmax), ``standard_tokens``
  (numbers as digits, cross-entropy only), ``xval``;
- positional modes, all with ``rned_corr``: ``mrope`` (plain Qwen2.5-VL, AGE off),
  ``circle`` (Circle-RoPE in every layer), ``circle_age`` (alternate; the same training as
  the numeric table's ``rned_corr``, trained once).

Each configuration is the base :class:`TrainConfig` with only the numeric mode or the AGE
strategy changed, trained (or loaded, when ``WORK/<key>`` holds a finished run of that exact
configuration) and evaluated on the same held-out phantoms, split in two halves:

- numbers: every true finding of the test half is measured at its true centre (the measure
  task alone, so detection errors do not mix in): ``model.measurer.evaluate.metrics`` on the
  answers, with paired bootstrap intervals across modes and the MAE on items every mode parsed;
- ranges: split-conformal ranges fitted on the calibration half's answers at the nominal levels
  :data:`LEVELS`, their empirical coverage and mean width on the test half;
- detection: the full pipeline (find, group, measure) on the test half: recall of lesions >= 10
  mm and of vessels, precision of the reported findings (phantom-spec matching rule).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.measurer.calibrate.calibration import fit_calibration
from model.measurer.checkpoint.settings import SETTINGS_NAME, NumericMode
from model.measurer.data.study import StudySource, TrainingStudy
from model.measurer.evaluate.metrics import (
    NumericItem,
    bootstrap_intervals,
    common_items,
    numeric_metrics,
)
from model.measurer.evaluate.scoring import evaluate
from model.measurer.inputs.data import measure_example
from model.measurer.results import FindingKind
from model.measurer.train.config import StepReport, TrainConfig
from model.measurer.train.loop import train

__all__ = [
    "CONFIGURATIONS",
    "LEVELS",
    "Comparison",
    "Configuration",
    "ConfigurationResult",
    "compare",
    "json_safe",
    "numeric_items",
    "results_json",
]

logger = logging.getLogger(__name__)

LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
"""Nominal coverage levels of the coverage curve."""


@dataclass(frozen=True)
class Configuration:
    """One compared configuration."""

    name: str  # the row's mode in its table
    table: str  # "numeric" or "positional"
    numeric_mode: NumericMode
    strategy: str  # AGE strategy of Circle-RoPE ("off": plain M-RoPE)

    @property
    def key(self) -> str:
        """The training it needs (shared by rows that need the same one)."""
        return f"{self.numeric_mode.value}-{self.strategy}"


CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration("rned_rnd", "numeric", NumericMode.RNED_RND, "alternate"),
    Configuration("rned_corr", "numeric", NumericMode.RNED_CORR, "alternate"),
    Configuration("standard_tokens", "numeric", NumericMode.STANDARD, "alternate"),
    Configuration("xval", "numeric", NumericMode.XVAL, "alternate"),
    Configuration("mrope", "positional", NumericMode.RNED_CORR, "off"),
    Configuration("circle", "positional", NumericMode.RNED_CORR, "all"),
    Configuration("circle_age", "positional", NumericMode.RNED_CORR, "alternate"),
)


def configured(base: TrainConfig, configuration: Configuration) -> TrainConfig:
    """``base`` with the configuration's numeric mode and AGE strategy."""
    size = dataclasses.replace(base.size, circle_rope_strategy=configuration.strategy)
    return dataclasses.replace(base, numeric_mode=configuration.numeric_mode, size=size)


def _trained(directory: Path, config: TrainConfig) -> bool:
    """True when ``directory`` holds the finished run of exactly ``config``."""
    state_file = directory / "train_state" / "state.json"
    settings_file = directory / SETTINGS_NAME
    if not (state_file.is_file() and settings_file.is_file()):
        return False
    state = json.loads(state_file.read_text())
    settings = json.loads(settings_file.read_text())
    return bool(
        state.get("config") == config.to_json()
        and state.get("step") == config.total_steps
        and settings.get("training", {}).get("config") == config.to_json()
    )


def ensure_trained(
    config: TrainConfig,
    directory: Path,
    source: StudySource,
    *,
    on_step: Callable[[StepReport], None] | None = None,
) -> tuple[Path, bool]:
    """Train ``config`` into ``directory`` unless a finished run of it is there (then load it);
    returns the directory and whether it was trained now."""
    if _trained(directory, config):
        logger.info("%s: trained already, loading", directory)
        return directory, False
    train(config, directory, source, name="radcaliper-eval", on_step=on_step)
    return directory, True


def numeric_items(measurer: Any, studies: Sequence[TrainingStudy]) -> list[NumericItem]:
    """Every true finding measured at its true centre (the measure task only)."""
    from model.measurer.infer.inference import measure_findings

    examples, ids = [], []
    truths: list[tuple[float, ...]] = []
    inputs = measurer.loaded.settings.measure_inputs
    for study in studies:
        for k, finding in enumerate(study.findings):
            examples.append(
                measure_example(study.volume, finding.center_lps_mm, finding.kind, inputs)
            )
            if finding.kind == "lesion":
                assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
                truths.append((finding.long_axis_mm, finding.short_axis_mm))
            else:
                assert finding.diameter_mm is not None
                truths.append((finding.diameter_mm,))
            ids.append(f"{study.name}/{k}")
    outcomes = measure_findings(
        measurer.lm,
        measurer.loaded.tokenizer,
        examples,
        batch_size=measurer.options.measure_batch,
        device=measurer.device,
    )
    items = []
    for item_id, example, truth, outcome in zip(ids, examples, truths, outcomes, strict=True):
        values = [m.value_mm for m in outcome.measurements]
        predicted: tuple[float, ...] | None = None
        if outcome.parsed and all(v is not None for v in values):
            predicted = tuple(float(v) for v in values if v is not None)
        kind = "lesion" if example.kind is FindingKind.LESION else "vessel"
        items.append(NumericItem(item_id, kind, truth, predicted))
    return items


def _pairs(items: Sequence[NumericItem]) -> list[tuple[str, float, float]]:
    names = {"lesion": ("long_axis", "short_axis"), "vessel": ("diameter",)}
    return [
        (name, p, t)
        for item in items
        if item.predicted is not None
        for name, p, t in zip(names[item.kind], item.predicted, item.truth, strict=True)
    ]


def coverage_curve(
    calibration: Sequence[NumericItem], test: Sequence[NumericItem]
) -> list[dict[str, float]]:
    """Per nominal level: the test items' empirical coverage and mean width (all names pooled)
    under ranges fitted on the calibration items."""
    out = []
    fit_pairs, test_pairs = _pairs(calibration), _pairs(test)
    for level in LEVELS:
        try:
            fitted = fit_calibration(fit_pairs, level)
        except ValueError as error:
            logger.warning("no ranges at %.2f: %s", level, error)
            out.append({"nominal": level, "coverage": math.nan, "mean_width_mm": math.nan})
            continue
        inside, widths = [], []
        for name, predicted, truth in test_pairs:
            interval = fitted.interval(name, predicted)
            if interval is None:
                continue
            inside.append(interval[0] <= truth <= interval[1])
            widths.append(interval[1] - interval[0])
        out.append(
            {
                "nominal": level,
                "coverage": sum(inside) / len(inside) if inside else math.nan,
                "mean_width_mm": sum(widths) / len(widths) if widths else math.nan,
            }
        )
    return out


@dataclass(frozen=True)
class ConfigurationResult:
    configuration: Configuration
    checkpoint: Path
    items: tuple[NumericItem, ...]
    calibration_items: tuple[NumericItem, ...]
    detection: dict[str, float]
    coverage: tuple[dict[str, float], ...]


@dataclass(frozen=True)
class Comparison:
    """All results, and the rows of the two tables."""

    results: tuple[ConfigurationResult, ...]
    numeric_rows: tuple[dict[str, Any], ...]
    positional_rows: tuple[dict[str, Any], ...]


def _detection(measurer: Any, studies: Sequence[TrainingStudy]) -> dict[str, float]:
    evaluation = evaluate(measurer, studies)
    reported = sum(len(o.result.findings) for o in evaluation.outcomes if o.result is not None)
    matched = sum(len(o.matches) for o in evaluation.outcomes)
    return {
        "lesion_recall_10mm": evaluation.lesion_recall,
        "vessel_recall": evaluation.vessel_recall,
        "precision": matched / reported if reported else math.nan,
        "false_per_study": evaluation.false_per_study,
        "seconds_per_study": evaluation.seconds_median,
    }


def _metric(name: str) -> Callable[[Sequence[NumericItem]], float]:
    def value(sample: Sequence[NumericItem]) -> float:
        return numeric_metrics(sample)[name]

    return value


def _rows(results: Sequence[ConfigurationResult], table: str, draws: int) -> list[dict[str, Any]]:
    chosen = [r for r in results if r.configuration.table == table]
    by_mode = {r.configuration.name: list(r.items) for r in chosen}
    common = common_items(by_mode)
    intervals = {
        metric: bootstrap_intervals(by_mode, _metric(metric), draws=draws)
        for metric in ("single_mae", "dual_mae_mm2", "long_mae", "short_mae", "success")
    }
    rows = []
    for r in chosen:
        name = r.configuration.name
        metrics = numeric_metrics(r.items)
        nominal = {c["nominal"]: c for c in r.coverage}
        rows.append(
            {
                "mode": name,
                "numeric_mode": r.configuration.numeric_mode.value,
                "age_strategy": r.configuration.strategy,
                **metrics,
                "ci95": {k: list(v[name]) for k, v in intervals.items()},
                "common_items": len(common),
                "common": {
                    k: v
                    for k, v in numeric_metrics(r.items, restrict_to=common).items()
                    if k.endswith("mae") or k.endswith("mm2")
                },
                "detection": r.detection,
                "coverage_90": nominal.get(0.9, {}).get("coverage", math.nan),
                "mean_width_90_mm": nominal.get(0.9, {}).get("mean_width_mm", math.nan),
                "coverage_curve": list(r.coverage),
                "checkpoint": str(r.checkpoint),
            }
        )
    return rows


def compare(
    base: TrainConfig,
    work_dir: Path,
    source: StudySource,
    calibration_studies: Sequence[TrainingStudy],
    test_studies: Sequence[TrainingStudy],
    *,
    configurations: Sequence[Configuration] = CONFIGURATIONS,
    bootstrap_draws: int = 1000,
    on_configuration: Callable[[Configuration, str], None] | None = None,
    on_step: Callable[[StepReport], None] | None = None,
) -> Comparison:
    """Train (or load) and evaluate every configuration (module doc)."""
    from model.measurer.infer.pipeline import CheckpointMeasurer

    evaluated: dict[str, ConfigurationResult] = {}
    results = []
    for configuration in configurations:
        if configuration.key in evaluated:
            results.append(
                dataclasses.replace(evaluated[configuration.key], configuration=configuration)
            )
            continue
        config = configured(base, configuration)
        if on_configuration is not None:
            on_configuration(configuration, "training")
        directory, _ = ensure_trained(config, work_dir / configuration.key, source, on_step=on_step)
        if on_configuration is not None:
            on_configuration(configuration, "evaluating")
        measurer = CheckpointMeasurer.load(directory)
        items = numeric_items(measurer, test_studies)
        calibration_items = numeric_items(measurer, calibration_studies)
        result = ConfigurationResult(
            configuration,
            directory,
            tuple(items),
            tuple(calibration_items),
            _detection(measurer, test_studies),
            tuple(coverage_curve(calibration_items, items)),
        )
        evaluated[configuration.key] = result
        results.append(result)
    return Comparison(
        tuple(results),
        tuple(_rows(results, "numeric", bootstrap_draws)),
        tuple(_rows(results, "positional", bootstrap_draws)),
    )


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float (nested in dicts, lists, tuples) as None, so
    that it is valid JSON (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def results_json(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as JSON (NaN written as null)."""
    return json.dumps([json_safe(dict(r)) for r in rows], indent=2) + "\n"
