"""``radcaliper evaluate --dataset DIR``: a model against the truth of a dataset folder.

Every series of the dataset is loaded and measured, and scored with the same matching rule and
metrics as the phantom evaluation (``model.measurer.evaluate.scoring``): recall per kind and size
bin, false (and unjudged) findings per study, MAE and Bland-Altman of each measurement, coverage of
the calibrated ranges, parse success and seconds per study. A series whose image cannot be
loaded is listed with the reason and scored as refused. Writes ``evaluation.json`` (summary,
per-study rows, the model, the dataset), ``evaluation.md`` (the tables) and two plots
(``agreement.png``: Bland-Altman per measurement; ``predicted_vs_true.png``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model.measurer.data.sources import DatasetSource
    from model.measurer.evaluate.scoring import Evaluation, StudyOutcome
    from model.measurer.infer.pipeline import CheckpointMeasurer

__all__ = ["DatasetEvaluation", "evaluate_dataset", "evaluation_markdown"]


@dataclass(frozen=True)
class DatasetEvaluation:
    """The outcome of evaluating one model on one dataset."""

    evaluation: Evaluation
    model: dict[str, Any]
    dataset: str
    names: tuple[str, ...]  # per outcome, the study's label in the tables
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "model": self.model,
            "summary": self.evaluation.to_json(),
            "studies": [
                {**o.to_json(), "image": o.name, "name": name}
                for o, name in zip(self.evaluation.outcomes, self.names, strict=True)
            ],
            "seconds": self.seconds,
        }


def _label(path: str) -> str:
    """A short label for a study: its image's last two path parts."""
    parts = Path(path).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else path


def evaluate_dataset(
    measurer: CheckpointMeasurer,
    source: DatasetSource,
    *,
    on_study: Callable[[StudyOutcome], None] | None = None,
) -> DatasetEvaluation:
    """Measure every series of the dataset ``source`` reads and score it.

    A study is labelled in the tables by its image's last two path parts.
    """
    from ingestion.dataset.format import Label
    from ingestion.errors import IngestionError
    from model.measurer.evaluate.scoring import StudyOutcome, score_study, summarize

    began = time.monotonic()
    outcomes: list[StudyOutcome] = []
    labels: list[str] = []
    for index, uid in enumerate(source.series):
        entry = source.dataset.study(uid)
        labels.append(_label(entry.image.path))
        try:
            study = source.study(index)
        except IngestionError as error:
            rows = source.dataset.findings_of(uid)
            outcome = StudyOutcome(
                entry.image.path,
                tuple(r for r in rows if r.label is Label.FINDING),
                None,
                f"not loaded: {error}",
                (),
                (),
                0.0,
                annotated=entry.annotated,
            )
        else:
            outcome = score_study(study, measurer)
        outcomes.append(outcome)
        if on_study is not None:
            on_study(outcome)
    info = measurer.info
    return DatasetEvaluation(
        summarize(outcomes),
        info.to_json(),
        str(source.root),
        tuple(labels),
        time.monotonic() - began,
    )


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}"


def _fraction(found: int, total: int) -> str:
    return f"{found}/{total} ({found / total:.2f})" if total else "-"


def evaluation_markdown(result: DatasetEvaluation, header: Sequence[str] = ()) -> str:
    """The summary table and the per-study table as markdown."""
    e = result.evaluation
    model = result.model
    lines = [
        *header,
        "",
        f"Model: {model['name']} {model['version']} ({model['numeric_mode']})"
        + ("; not for clinical use" if model.get("not_for_clinical_use") else ""),
        "",
        "| metric | value |",
        "|---|---|",
        f"| studies (refused or not loaded) | {e.studies} ({e.refused}) |",
        f"| true findings in refused studies (not in the recalls below) | "
        f"{e.findings_in_refused} |",
        f"| lesions >= 10 mm found | {_fraction(e.lesions_10mm_found, e.lesions_10mm)} |",
        f"| vessels found | {_fraction(e.vessels_found, e.vessels)} |",
    ]
    for kind, bins in e.recall_by_size.items():
        for name, (found, total) in bins.items():
            lines.append(f"| {kind}s {name} found | {_fraction(found, total)} |")
    lines += [
        f"| false findings per measured study | {_num(e.false_per_study)} ({e.false_findings}) |",
        f"| unjudged findings (kind not annotated) | {e.unjudged_findings} |",
    ]
    for name, mae in e.mae_mm.items():
        agreement = e.agreement[name]
        low, high = agreement.limits_mm
        lines.append(
            f"| {name.replace('_', ' ')}: MAE mm (n); Bland-Altman bias [95 % limits] | "
            f"{_num(mae)} ({e.counts[name]}); {_num(agreement.bias_mm)} "
            f"[{_num(low)}, {_num(high)}] |"
        )
    for name, coverage in e.coverage.items():
        lines.append(
            f"| {name.replace('_', ' ')}: range coverage (mean width mm) | "
            f"{_num(coverage)} ({_num(e.mean_width_mm[name])}) |"
        )
    lines += [
        f"| measurements with a value (parsed) | {_num(e.answers_parsed, 3)} |",
        f"| malformed find answers | {e.malformed_find_answers} |",
        f"| seconds per study (median; mean) | {_num(e.seconds_median, 1)}; "
        f"{_num(e.seconds_mean, 1)} |",
        "",
        "| study | true findings | found | reported | false | unjudged | s | refused because |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for outcome, name in zip(e.outcomes, result.names, strict=True):
        row = outcome.to_json()
        reason = (row["error"] or "").replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {name} | {row['true_findings']} | {row['found']} | {row['reported']} | "
            f"{row['false_findings']} | {row['unjudged_findings']} | "
            f"{_num(row['seconds'], 1)} | {reason[:160]} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(result: DatasetEvaluation, out_dir: Path, header: Sequence[str] = ()) -> str:
    """Write evaluation.json, evaluation.md and the plots under ``out_dir``; returns the
    markdown."""
    from app.evaluation.plots import measurement_agreement
    from model.measurer.evaluate.comparison import json_safe
    from model.measurer.evaluate.scoring import calibration_pairs

    out_dir.mkdir(parents=True, exist_ok=True)

    (out_dir / "evaluation.json").write_text(
        json.dumps(json_safe(result.to_json()), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    text = evaluation_markdown(result, header)
    (out_dir / "evaluation.md").write_text(text, encoding="utf-8")
    title = f"{result.model['name']} {result.model['version']} on {Path(result.dataset).name}"
    measurement_agreement(
        calibration_pairs(result.evaluation.outcomes),
        out_dir / "agreement.png",
        out_dir / "predicted_vs_true.png",
        title,
    )
    return text
