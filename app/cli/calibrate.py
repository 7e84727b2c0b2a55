"""``radcaliper calibrate``: fit a checkpoint's calibrated ranges, decode checks and detection
threshold; registered on the ``radcaliper`` app by ``app.cli.root``."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from app.cli.loading import (
    finite,
    load_checkpoint,
)
from app.console import (
    EXIT_NOTHING,
    err,
    out,
    safe,
    settings_of,
)
from app.progress import progress_display

if TYPE_CHECKING:
    from model.measurer.infer import TraceEvent


__all__ = ["calibrate"]

logger = logging.getLogger(__name__)
_settings = settings_of


def calibrate(
    model_dir: Annotated[Path, typer.Argument(help="Measurer checkpoint directory to calibrate.")],
    n: Annotated[int, typer.Option("--n", min=10, help="Held-out studies to calibrate on.")] = 200,
    seed: Annotated[
        int, typer.Option("--seed", help="Run seed of the held-out phantoms (not the training's).")
    ] = 7001,
    phantoms_dir: Annotated[
        Path | None,
        typer.Option("--phantoms", help="Calibrate on the studies under this folder instead."),
    ] = None,
    coverage: Annotated[
        float,
        typer.Option(
            "--coverage", min=0.5, max=0.99, callback=finite, help="Nominal coverage of ranges."
        ),
    ] = 0.90,
    dataset: Annotated[
        Path | None,
        typer.Option(
            "--dataset",
            help="Calibrate on the studies of this dataset folder ('radcaliper dataset import'; "
            "studies the model was not trained on).",
        ),
    ] = None,
    decode_quantile: Annotated[
        float,
        typer.Option(
            "--decode-quantile",
            min=0.001,
            max=0.2,
            callback=finite,
            help="Refuse ('not measurable') a value whose numeric decode is weaker than all "
            "but this fraction of the decodes on the calibration studies.",
        ),
    ] = 0.01,
    false_per_study: Annotated[
        float,
        typer.Option(
            "--false-per-study",
            min=0.0,
            callback=finite,
            help="Detection operating point: leave out findings the model is less sure of "
            "than the least sure one that keeps the false findings per calibration study "
            "within this budget (a finite number >= 0).",
        ),
    ] = 1.0,
) -> None:
    """Fit the calibrated ranges of a checkpoint on held-out studies (split conformal):
    phantoms by default, or a dataset.

    Measures N held-out studies, fits per measurement name the interval that covers the truth
    with the nominal probability (absolute or size-adaptive, whichever is narrower), stores it in
    MODEL_DIR/radcaliper.json with the MAE it rests on, and reports the empirical coverage. The
    same studies fit the weakest numeric decode the checkpoint reports as a number (the
    --decode-quantile of the reported values' decode confidences); a weaker one is "not
    measurable" with the reason. They also fit the detection operating point: the least
    presence (the model's probability that something is at a candidate) of a reported finding,
    the lowest that keeps the false findings within --false-per-study.
    """
    from ingestion.errors import RadcaliperError
    from model.measurer.calibrate import (
        detection_curve,
        fit_calibration,
        fit_decode_check,
        fit_detection_threshold,
    )
    from model.measurer.checkpoint import write_settings
    from model.measurer.data import DatasetSource, FolderSource, PhantomSource, StudySource
    from model.measurer.evaluate import StudyOutcome, evaluate
    from model.measurer.evaluate.scoring import calibration_pairs
    from model.measurer.results import MeasurementName

    if dataset is not None and phantoms_dir is not None:
        err.print("[red]error:[/red] give --dataset or --phantoms, not both")
        raise typer.Exit(EXIT_NOTHING)
    if seed == 0 and phantoms_dir is None and dataset is None:
        err.print(
            "[yellow]note[/yellow] seed 0 is the default training seed; calibrate on "
            "studies the model never saw"
        )
    measurer = load_checkpoint(model_dir, calibrated=False)  # raw values, nothing refused
    last_stage = measurer.stages[-1].name if measurer.stages else None
    confidences: list[float | None] = []
    reported_presences: list[float | None] = []  # the study being measured, in report order
    presences: list[list[float | None]] = []  # per study scored

    def reported(event: TraceEvent) -> None:
        if event.stage == last_stage:
            confidences.extend(
                c.outcome.confidence for c in event.state.candidates if c.outcome is not None
            )
            reported_presences[:] = [c.presence for c in event.state.candidates]

    measurer.subscribe(reported)
    try:
        if dataset is not None:
            data_source = DatasetSource(dataset)
            source: StudySource = data_source
            count = min(n, len(data_source))
        elif phantoms_dir is not None:
            folders = FolderSource(phantoms_dir)
            source, count = folders, min(n, len(folders.folders))
        else:
            source, count = PhantomSource(seed), n
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    with progress_display() as progress:
        task = progress.add_task("calibrating", total=count, status="")

        def scored(outcome: StudyOutcome) -> None:
            """One study scored: keep its reports' presences (in report order), advance."""
            presences.append(list(reported_presences) if outcome.result is not None else [])
            reported_presences.clear()
            progress.advance(task)

        evaluation = evaluate(measurer, (source.study(i) for i in range(count)), on_study=scored)
    pairs = calibration_pairs(evaluation.outcomes)
    measured = {name for name, _, _ in pairs}
    missing = sorted(m.value for m in MeasurementName if m.value not in measured)
    if missing:
        err.print(
            f"[red]error:[/red] no matched {', '.join(missing)} measurement on {count} studies: "
            "the model finds or measures nothing to calibrate against; train it longer"
        )
        raise typer.Exit(EXIT_NOTHING)
    try:
        calibration = fit_calibration(pairs, coverage)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_NOTHING) from exc
    decode_check = fit_decode_check(confidences, decode_quantile)
    detection = None
    if any(p is not None for values in presences for p in values):
        curve = detection_curve(evaluation.outcomes, presences)
        detection = fit_detection_threshold(curve, false_per_study)
    settings = dataclasses.replace(
        measurer.loaded.settings,
        calibration=calibration,
        decode_check=decode_check,
        detection=detection,
    )
    write_settings(model_dir, settings)
    table = Table(title=f"Calibration of {model_dir} on {count} studies")
    for column in ("measurement", "n", "MAE mm", "rule", "empirical coverage", "mean width mm"):
        table.add_column(column)
    for name, rule in sorted(calibration.rules.items()):
        table.add_row(
            name,
            str(rule.n),
            f"{rule.mae_mm:.2f}",
            f"{rule.kind.value} q={rule.quantile:.3f}",
            f"{rule.empirical_coverage:.3f}",
            f"{rule.mean_width_mm:.2f}",
        )
    out.print(table)
    if decode_check is None:
        known = sum(c is not None for c in confidences)
        out.print(
            f"No decode check: {known} reported values with a decode confidence are too few for "
            f"--decode-quantile {decode_quantile:g}; calibrate on more studies"
        )
    else:
        out.print(
            f"Decode check: a value whose decode confidence is below "
            f"{decode_check.min_confidence:.3f} (the weakest {decode_quantile:.1%} of "
            f"{decode_check.n} reported values) is reported as not measurable"
        )
    if detection is None:
        out.print(
            "No detection operating point: this checkpoint does not verify its candidates "
            "with the point task, or reported nothing on these studies"
        )
    else:
        recall = (
            "no lesion >= 10 mm"
            if math.isnan(detection.fitted_recall)
            else f"lesion recall (>= 10 mm) {detection.fitted_recall:.2f}"
        )
        within = detection.fitted_false_per_study <= false_per_study
        out.print(
            f"Detection operating point: a finding whose presence is below "
            f"{detection.min_presence:.10g} is not reported; on these {detection.studies} "
            f"studies {detection.fitted_false_per_study:.2f} false findings per study "
            f"({'within' if within else 'over'} the budget of {false_per_study:g}), {recall}"
        )
