"""The measurer's commands: measure, train, export-model, calibrate, evaluate and serve
(registered on the ``radcaliper`` app by ``app.cli``). Heavy libraries are imported inside each
command."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from app.cli_store import DbOption, checked, open_database
from app.console import (
    EXIT_NOTHING,
    EXIT_OK,
    cli_actor,
    command_args,
    command_line,
    err,
    out,
    safe,
    settings_of,
)
from app.progress import progress_display

if TYPE_CHECKING:
    from model.measurer.infer.state import TraceEvent

__all__ = [
    "RESULTS_BEGIN",
    "RESULTS_END",
    "calibrate",
    "deferred_measurer",
    "evaluate",
    "load_measurer",
    "measure",
    "serve",
    "train",
]

logger = logging.getLogger(__name__)
_settings = settings_of


def _checkpoint_dir(model_dir: Path | None) -> Path:
    """``model_dir``, else the demo model's directory; exit 2 when the demo model is missing."""
    from model.measurer.checkpoint.settings import default_checkpoint

    directory = model_dir or default_checkpoint()
    if model_dir is None and not directory.is_dir():
        err.print(
            f"[red]error:[/red] the bundled demo model is missing ({directory}); reinstall "
            "radcaliper or pass --model DIR"
        )
        raise typer.Exit(EXIT_NOTHING)
    return directory


def _output_folder(path: Path, name: str) -> None:
    """Exit 2 with one line, before any work, when ``path`` (the ``name`` option or argument)
    cannot be the folder a command writes into: it, or a folder above it, is a file, or it
    cannot be written."""
    for folder in (path, *path.parents):
        if not (folder.exists() or folder.is_symlink()):
            continue
        if not folder.is_dir():
            where = "it is a file" if folder == path else f"{folder} is a file"
            err.print(
                f"[red]error:[/red] {name} {safe(path)}: {safe(where)}, not a folder; give a "
                "folder (it is created when missing)",
                highlight=False,
            )
            raise typer.Exit(EXIT_NOTHING)
        if not os.access(folder, os.W_OK | os.X_OK):
            err.print(
                f"[red]error:[/red] {name} {safe(path)}: {safe(folder)} cannot be written by "
                "this user; give another folder",
                highlight=False,
            )
            raise typer.Exit(EXIT_NOTHING)
        return


def _os_error(error: OSError) -> typer.Exit:
    """Print an ``OSError`` met while writing as one line; the exit (2) to raise."""
    where = f"{error.filename}: " if error.filename else ""
    err.print(f"[red]error:[/red] {safe(where)}{safe(error.strerror or error)}", highlight=False)
    return typer.Exit(EXIT_NOTHING)


def _finite(value: float) -> float:
    """A float option's check: a finite number (typer's ranges let inf through, nan too)."""
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def _model_error(error: Exception) -> typer.Exit:
    """Print a ``ModelError`` as the one line a command exits 2 with; the exit to raise."""
    err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
    return typer.Exit(EXIT_NOTHING)


def load_measurer(model_dir: Path | None, *, calibrated: bool = True) -> Any:
    """The checkpoint at ``model_dir`` (the demo model without one), or exit 2 saying why;
    ``calibrated=False`` leaves its ``calibrate`` stage out (raw values, nothing refused)."""
    from app.resident import kept_model
    from ingestion.errors import ModelError
    from model.measurer.infer.pipeline import CheckpointMeasurer

    directory = _checkpoint_dir(model_dir)

    def load() -> CheckpointMeasurer:
        try:
            measurer = CheckpointMeasurer.load(directory)
        except ModelError as error:
            raise _model_error(error) from None
        if not calibrated:
            measurer.stages = tuple(s for s in measurer.stages if s.name != "calibrate")
        return measurer

    return kept_model(directory, calibrated, load)  # loaded once in a resident


def deferred_measurer(model_dir: Path | None) -> Any:
    """The checkpoint at ``model_dir`` (the demo model without one) as an
    ``app.batch_measure.DeferredMeasurer``: its settings read and its files hashed now (exit 2
    saying why when it is not a checkpoint), its weights loaded when it first measures."""
    from app.batch_measure import DeferredMeasurer
    from ingestion.errors import ModelError

    directory = _checkpoint_dir(model_dir)
    try:
        return DeferredMeasurer.of(directory)
    except ModelError as error:
        raise _model_error(error) from None


def measure(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="A DICOM folder or file, or a NIfTI or NRRD file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    model_dir: Annotated[
        Path | None,
        typer.Option("--model", help="Measurer checkpoint directory (default: the demo model)."),
    ] = None,
    db: DbOption = None,
    no_store: Annotated[
        bool, typer.Option("--no-store", help="Only print the result; do not store it.")
    ] = False,
    use_resident: Annotated[
        bool,
        typer.Option(
            "--resident/--no-resident",
            help="Hand the command to 'radcaliper resident' when one runs for this data dir "
            "(the same result, without loading the libraries and the model first).",
        ),
    ] = True,
) -> None:
    """Find and measure the lesions (long x short axis) and vessels (diameter) of one study.

    Every value comes with its calibrated range and the model's name and version. A study with
    several series gives one result per series (a JSON list with --json). The result is stored
    (--db, else RADCALIPER_DATABASE_URL, else SQLite in the data dir) unless --no-store; the
    same model on the same input is stored once. Exit status: 0 measured, 2 nothing could be
    measured (or stored).
    """
    if use_resident:
        from app.resident import forward

        verbosity = ctx.find_root().params.get("verbose") or 0
        data_dir = _settings(ctx).data_dir
        status = checked(lambda: forward(data_dir, command_args(ctx), verbosity=verbosity))
        if status is not None:
            raise typer.Exit(status)
    from app.heap import keep_freed_memory
    from app.measuring import measure_and_store
    from app.threads import command_started, measuring_threads, torch_threads
    from ingestion import Modality
    from ingestion.errors import ModelError
    from ingestion.load import load_path

    started = command_started()  # what other work does while the study and the model load
    settings = _settings(ctx)
    modality = Modality(settings.nifti_modality) if settings.nifti_modality else None
    loaded = load_path(path, modality)
    for rejected in loaded.rejected:
        logger.info("skipped: %s", rejected.reason)
    if not loaded.volumes:
        err.print(f"[red]error:[/red] no usable CT series under {path}", highlight=False)
        for rejected in loaded.rejected[:5]:
            err.print(f"  - {rejected.reason}", markup=False, highlight=False)
        raise typer.Exit(EXIT_NOTHING)
    store = None if no_store else open_database(ctx, db, create=True)
    measurer = load_measurer(model_dir)
    import torch  # loaded with the model

    keep_freed_memory()  # the process only measures from here on (app.heap)
    results = []
    try:  # torch on the CPUs other work leaves free (app.threads)
        with torch_threads(measuring_threads(torch.get_num_threads(), since=started)):
            for volume in loaded.volumes:
                run = functools.partial(
                    measure_and_store,
                    measurer,
                    volume,
                    source=str(path.resolve()),
                    store=store,
                    actor=cli_actor(),
                    pseudonym_key=settings.pseudonym_key,
                )
                try:
                    measured = checked(run)
                except ModelError as exc:
                    err.print(
                        f"[red]not measured:[/red] series "
                        f"{safe(volume.identifiers.series_instance_uid)}: {safe(exc)}",
                        highlight=False,
                    )
                    continue
                results.append(measured.result)
                if measured.stored is not None:
                    verb = "stored as" if measured.stored.created else "already stored as"
                    err.print(
                        f"series {safe(measured.result.series_instance_uid)}: {verb} run "
                        f"{measured.stored.run_id}",
                        highlight=False,
                    )
    finally:
        if store is not None:
            store.dispose()
    if not results:
        raise typer.Exit(EXIT_NOTHING)
    if as_json:
        data: Any = [r.to_json() for r in results]
        sys.stdout.write(json.dumps(data[0] if len(data) == 1 else data, indent=2) + "\n")
    else:
        from app.report import print_result

        for result in results:
            print_result(out, result)
    raise typer.Exit(EXIT_OK)


def train(
    ctx: typer.Context,
    out_dir: Annotated[Path, typer.Argument(help="Checkpoint directory to write (and resume).")],
    phantoms_dir: Annotated[
        Path | None,
        typer.Option(
            "--phantoms",
            help="Train on the studies under this folder (from 'radcaliper phantoms'); "
            "default: phantoms generated on the fly.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the model and the data.")] = 0,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            min=1,
            help="Total steps, split over the stages in their proportions (default 15000: "
            "12000 + 3000; with --base-model 4000: a quarter projector, the rest LoRA).",
        ),
    ] = None,
    numeric_mode: Annotated[
        str,
        typer.Option(
            "--numeric-mode", help="rned_corr (default), rned_rnd, xval or standard_tokens."
        ),
    ] = "rned_corr",
    resume: Annotated[
        bool, typer.Option("--resume/--no-resume", help="Continue from OUT/train_state.")
    ] = True,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU threads (default: all).")
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="A JSON training configuration (see the model card)."),
    ] = None,
    version: Annotated[str, typer.Option("--version-tag", help="Model version to record.")] = (
        "0.1.0"
    ),
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            help="Train on dataset folders ('radcaliper dataset import'), mixed by weight: "
            "DIR[:weight],... ; 'phantoms' stands for phantoms generated on the fly, 'hybrid' "
            "for real CT backgrounds of the shared data with synthetic lesions made on the fly "
            "(see --hold-out), e.g. --dataset site:3,phantoms:1 or hybrid:2,phantoms:1.",
        ),
    ] = None,
    hold_out: Annotated[
        str | None,
        typer.Option(
            "--hold-out",
            help="Hybrid backgrounds (ids, comma-separated) never used for training: keep them "
            "for calibration and validation ('radcaliper dataset hybrid --hold-out').",
        ),
    ] = None,
    base_model: Annotated[
        Path | None,
        typer.Option(
            "--base-model",
            help="A local Qwen2.5-VL checkpoint directory (config, safetensors, tokenizer; "
            "nothing is downloaded) to fine-tune instead of the default tiny model: a projector "
            "stage, then LoRA (rank 128, alpha 256).",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Model name to record in the checkpoint (default: radcaliper-demo, or "
            "radcaliper-<base model folder> with --base-model).",
        ),
    ] = None,
    checkpointing: Annotated[
        bool | None,
        typer.Option(
            "--gradient-checkpointing/--no-gradient-checkpointing",
            help="Recompute each layer's activations in the backward pass: far less memory, "
            "about a third more time (default: on with --base-model).",
        ),
    ] = None,
    accumulation: Annotated[
        int | None,
        typer.Option(
            "--accumulation",
            min=1,
            help="Split each step's examples into this many micro-batches (less memory, the "
            "same examples per step; default 1).",
        ),
    ] = None,
    weights_dtype: Annotated[
        str | None,
        typer.Option(
            "--weights-dtype",
            help="The frozen weights' dtype: auto (bfloat16 for --base-model on a GPU, else "
            "float32), float32 or bfloat16. Trained parameters stay float32.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the run's estimated peak GPU memory (and its checkpoint's size), then "
            "stop: reads only the base model's config.json, loads no weights or data.",
        ),
    ] = False,
) -> None:
    """Train the measurer (the default tiny Circle-RoPE Qwen2.5-VL with RNED, or a local
    Qwen2.5-VL checkpoint with --base-model) on phantoms or on datasets.

    Default model: two stages (from scratch with a wide numeric label, then a refinement).
    --base-model: a projector stage (vision merger, numeric head, the [NUM] row), then LoRA.
    Deterministic for a seed, resumable: state is saved every 1000 steps under
    OUT/train_state. Calibrate the result with 'radcaliper calibrate OUT' before use.
    """

    from ingestion.errors import RadcaliperError
    from model.measurer.checkpoint.settings import NumericMode
    from model.measurer.data.sources import FolderSource, PhantomSource, parse_sources
    from model.measurer.data.study import StudySource
    from model.measurer.train.config import TrainConfig
    from model.measurer.train.loop import train as run_training

    try:
        mode = NumericMode(numeric_mode)
    except ValueError:
        err.print(
            f"[red]error:[/red] --numeric-mode {numeric_mode!r}: use one of "
            + ", ".join(m.value for m in NumericMode)
        )
        raise typer.Exit(EXIT_NOTHING) from None
    if config_file is not None:
        config = _read_train_config(config_file)
        if base_model is not None:
            config = dataclasses.replace(config, base_model=str(base_model))
    elif base_model is not None:
        config = TrainConfig.for_base_model(
            str(base_model), seed=seed, numeric_mode=mode, threads=threads
        )
    else:
        config = TrainConfig(seed=seed, numeric_mode=mode, threads=threads)
    if steps is not None:
        config = _with_steps(config, steps)
    memory: dict[str, Any] = {
        "gradient_checkpointing": checkpointing,
        "accumulation": accumulation,
        "weights_dtype": weights_dtype,
    }
    try:
        config = dataclasses.replace(config, **{k: v for k, v in memory.items() if v is not None})
    except ValueError as exc:
        err.print(f"[red]error:[/red] {safe(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    if dry_run:
        _print_memory(config)
        raise typer.Exit(EXIT_OK)
    _output_folder(out_dir, "OUT")
    if dataset is not None and phantoms_dir is not None:
        err.print("[red]error:[/red] give --dataset or --phantoms, not both")
        raise typer.Exit(EXIT_NOTHING)
    if hold_out and (dataset is None or "hybrid" not in dataset):
        err.print(
            "[red]error:[/red] --hold-out names hybrid backgrounds: use it with --dataset hybrid"
        )
        raise typer.Exit(EXIT_NOTHING)
    try:
        if dataset is not None:
            held_out = tuple(i for i in (hold_out or "").split(",") if i)
            source: StudySource = parse_sources(dataset, config.seed, held_out=held_out)
        elif phantoms_dir is not None:
            source = FolderSource(phantoms_dir)
        else:
            source = PhantomSource(config.seed)
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    for licence in _restricted_licences(source.describe()):
        err.print(
            f"[yellow]warning[/yellow] training data under '{safe(licence)}': a non-commercial "
            "licence allows development and evaluation, not a model you ship",
            highlight=False,
        )
    command = command_line(ctx)
    with progress_display() as progress:
        task = progress.add_task("training", total=config.total_steps, status="")

        def on_step(report: Any) -> None:
            progress.update(
                task,
                completed=report.step,
                status=f"{report.stage}: loss {report.loss:.3f}",
            )

        try:
            run_training(
                config,
                out_dir,
                source,
                name=name,
                version=version,
                provenance={"command": command},
                resume=resume,
                on_step=on_step,
            )
        except RadcaliperError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(EXIT_NOTHING) from None
        except OSError as exc:  # the checkpoint cannot be written (a full disk, ...)
            raise _os_error(exc) from None
    out.print(f"Trained model written to {out_dir}; calibrate it: radcaliper calibrate {out_dir}")


def export_model(
    model_dir: Annotated[
        Path, typer.Argument(help="A trained checkpoint (from 'radcaliper train --base-model').")
    ],
    out_dir: Annotated[Path, typer.Argument(help="Folder to write the standalone checkpoint to.")],
    base_model: Annotated[
        Path | None,
        typer.Option(
            "--base-model",
            help="Where the base Qwen2.5-VL now is, if it moved since training (its weights must "
            "be the ones trained from: their sha256 is checked).",
        ),
    ] = None,
) -> None:
    """Write a standalone checkpoint: the base model with the fine-tuned changes merged in
    (LoRA adapters, projector, [NUM] rows), loadable without the base model folder and by
    transformers' Auto classes after importing radcaliper's model package.

    'radcaliper train --base-model' saves only what fine-tuning changed (a few per cent of the
    model) and needs the base folder to load; this writes the whole model.
    """
    from ingestion.errors import RadcaliperError
    from model.measurer.checkpoint.weights import export_checkpoint

    _output_folder(out_dir, "OUT")
    try:
        written = export_checkpoint(model_dir, out_dir, base_model=base_model)
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    except OSError as exc:
        raise _os_error(exc) from None
    out.print(f"Standalone checkpoint written to {written}")


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
            "--coverage", min=0.5, max=0.99, callback=_finite, help="Nominal coverage of ranges."
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
            callback=_finite,
            help="Refuse ('not measurable') a value whose numeric decode is weaker than all "
            "but this fraction of the decodes on the calibration studies.",
        ),
    ] = 0.01,
    false_per_study: Annotated[
        float,
        typer.Option(
            "--false-per-study",
            min=0.0,
            callback=_finite,
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
    from model.measurer.calibrate.calibration import fit_calibration, fit_decode_check
    from model.measurer.calibrate.operating import detection_curve, fit_detection_threshold
    from model.measurer.checkpoint.settings import write_settings
    from model.measurer.data.sources import DatasetSource, FolderSource, PhantomSource
    from model.measurer.data.study import StudySource
    from model.measurer.evaluate.scoring import StudyOutcome, calibration_pairs, evaluate
    from model.measurer.results import MeasurementName

    if dataset is not None and phantoms_dir is not None:
        err.print("[red]error:[/red] give --dataset or --phantoms, not both")
        raise typer.Exit(EXIT_NOTHING)
    if seed == 0 and phantoms_dir is None and dataset is None:
        err.print(
            "[yellow]note[/yellow] seed 0 is the default training seed; calibrate on "
            "studies the model never saw"
        )
    measurer = load_measurer(model_dir, calibrated=False)  # raw values, nothing refused
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


def _print_memory(config: Any) -> None:
    """``train --dry-run``: the estimated peak GPU memory of the run, by part."""
    from ingestion.errors import RadcaliperError
    from model.measurer.train.memory import GIB, estimate_training_memory, model_shape

    try:
        shape = model_shape(config)
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    dtype = config.resolved_weights_dtype("cuda")
    estimate = estimate_training_memory(config, shape, weights_dtype=dtype)
    what = config.base_model or "the default model"
    table = Table(
        title=f"Estimated peak GPU memory of one training step: {escape(str(what))}",
        caption=(
            f"{shape.parameters() / 1e6:,.1f} M parameters, "
            f"{estimate.trainable_parameters / 1e6:,.1f} M trained; frozen weights {dtype}, "
            "bf16 autocast; gradient checkpointing "
            f"{'on' if config.gradient_checkpointing else 'off'}; {config.accumulation} "
            f"micro-batch(es); {estimate.tokens_per_step} tokens per step. An estimate "
            "(model.measurer.train.memory): leave a margin."
        ),
    )
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for part, gib in estimate.rows():
        table.add_row(part, f"{gib:.2f}")
    out.print(table)
    if config.base_model is not None and config.init_from is None:
        stored = 2 if dtype == "bfloat16" else 4
        changed = estimate.trainable_parameters * stored
        whole = shape.parameters() * stored
        out.print(
            f"Checkpoint: what changed, about {changed / GIB:.2f} GiB ({100 * changed / whole:.1f}"
            f" % of the {whole / GIB:.2f} GiB model), in the base model's dtype."
        )


def _restricted_licences(described: Mapping[str, Any]) -> list[str]:
    """The non-commercial licences (``NC``, "non-commercial") a training source's description
    (``StudySource.describe()``, which the checkpoint records) names, its parts' included."""
    import re

    def licences(item: Mapping[str, Any]) -> set[str]:
        own = {str(licence) for licence in item.get("licences", ())}
        return own.union(*(licences(part) for part in item.get("parts", ())))

    pattern = re.compile(r"\bNC\b|non-?commercial", re.IGNORECASE)
    return sorted(licence for licence in licences(described) if pattern.search(licence))


def _read_train_config(path: Path) -> Any:
    """The ``TrainConfig`` in ``path`` (``--config``), or exit 2 with one line saying why."""
    from model.measurer.train.config import TrainConfig

    try:
        return TrainConfig.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        err.print(
            f"[red]error:[/red] --config {path}: not a training configuration ({exc}); start "
            "from benchmarks/configs/ or the training_config.json of a model card",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOTHING) from None


def _with_steps(config: Any, steps: int) -> Any:
    """``config`` with ``steps`` training steps in all, split over its stages in the proportions
    they have (the default 12,000 + 3,000 gives 80 % / 20 %; a real checkpoint's projector and
    LoRA stages 25 % / 75 %), each stage at least one step while there are steps to give (fewer
    steps than stages: the first stages get one each, the rest none)."""
    stages = config.stages
    if steps < len(stages):
        counts = [1] * steps + [0] * (len(stages) - steps)
    else:
        total = sum(s.steps for s in stages)
        counts = [max(1, round(steps * s.steps / total)) for s in stages[:-1]]
        counts.append(steps - sum(counts))
        while counts[-1] < 1:  # rounding left the last stage nothing: take from the largest
            largest = counts.index(max(counts[:-1]))
            counts[largest] -= 1
            counts[-1] += 1
    changed = tuple(dataclasses.replace(s, steps=n) for s, n in zip(stages, counts, strict=True))
    return dataclasses.replace(config, stages=changed)


RESULTS_BEGIN = "<!-- radcaliper evaluate: begin -->"
RESULTS_END = "<!-- radcaliper evaluate: end -->"
DATASET_BEGIN = "<!-- radcaliper evaluate --dataset: begin -->"
DATASET_END = "<!-- radcaliper evaluate --dataset: end -->"


def _replace_section(
    path: Path, text: str, begin: str = RESULTS_BEGIN, end: str = RESULTS_END
) -> None:
    """Put ``text`` between the ``begin`` and ``end`` markers of ``path`` (appended the first
    time)."""
    old = path.read_text() if path.is_file() else ""
    block = f"{begin}\n{text}{end}\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        path.write_text(head + block + tail)
    else:
        path.write_text(old.rstrip("\n") + "\n\n" + block)


def evaluate(
    ctx: typer.Context,
    quick: Annotated[
        bool, typer.Option("--quick", help="Tiny models, a few steps, 4 studies (for CI).")
    ] = False,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Training steps per configuration.")
    ] = None,
    studies: Annotated[
        int, typer.Option("--studies", min=4, help="Held-out studies (half calibrate, half test).")
    ] = 200,
    seed: Annotated[
        int, typer.Option("--seed", help="Run seed of the held-out phantoms (not training's).")
    ] = 2027,
    work: Annotated[
        Path | None,
        typer.Option("--work", help="Where the compared models are trained (and found again)."),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Folder for the JSON results and the plots (default benchmarks/results; with "
            "--dataset, DATASET/evaluation/MODEL-VERSION).",
        ),
    ] = None,
    results_md: Annotated[
        Path | None,
        typer.Option("--results-md", help="Markdown file whose evaluate section is replaced."),
    ] = None,
    demo: Annotated[
        Path | None,
        typer.Option(
            "--model", help="The shipped model for the Bland-Altman plot (default: demo)."
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A JSON training configuration (as for train) that every compared model "
            "starts from: size, batches, stages (--steps still rescales its stages).",
        ),
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            "--dataset",
            help="Evaluate --model (default: the demo) on this dataset folder instead of "
            "comparing modes: recall, false findings, MAE, Bland-Altman, coverage, time; "
            "results in --out (default DATASET/evaluation/MODEL-VERSION).",
        ),
    ] = None,
) -> None:
    """Evaluate a model on a dataset (--dataset), or compare the numeric modes (RNED with the
    paper's and the correlation decoder, standard tokens, xVal) and the positional modes (M-RoPE,
    Circle-RoPE, Circle-RoPE + AGE) at the same data, backbone, budget and seed, on the same
    held-out phantoms.

    With --dataset: writes OUT/evaluation.json, OUT/evaluation.md and plots (Bland-Altman and
    predicted vs true per measurement); --results-md gets the tables. Otherwise writes
    OUT/numeric_modes.json, OUT/positional_modes.json, plots (predicted vs true, Bland-Altman of
    the shipped model, coverage vs nominal) and the tables in --results-md. Models are trained
    into --work once and reused when their configuration is unchanged.
    """
    if out_dir is not None:
        _output_folder(out_dir, "--out")
    if dataset is not None:
        _evaluate_on_dataset(ctx, dataset, demo, out_dir, results_md)
        return
    out_dir = out_dir or Path("benchmarks/results")
    import time

    from app.plots import bland_altman, coverage_vs_nominal, predicted_vs_true
    from app.report import comparison_markdown
    from model.measurer.checkpoint.settings import default_checkpoint
    from model.measurer.data.sources import PhantomSource
    from model.measurer.evaluate.comparison import compare, numeric_items, results_json
    from model.measurer.infer.pipeline import CheckpointMeasurer
    from model.measurer.train.config import Stage, TrainConfig

    settings = _settings(ctx)
    began = time.monotonic()
    if quick:
        base = TrainConfig.tiny(
            seed=0, stages=(Stage("quick", steps or 3, 1e-3, warmup_steps=1),), axes_batch=0
        )
        studies = 4
    else:
        base = TrainConfig() if config_file is None else _read_train_config(config_file)
        if steps is not None:
            base = _with_steps(base, steps)
    if work is None:  # the compared models go into the data dir: an own one only
        from app.files import owner_only_dir

        checked(lambda: owner_only_dir(settings.data_dir))
    work_dir = work or settings.data_dir / ("evaluate-quick" if quick else "evaluate")
    held_out = PhantomSource(seed)
    half = studies // 2
    calibration = [held_out.study(i) for i in range(half)]
    test = [held_out.study(i) for i in range(half, studies)]
    with progress_display() as progress:
        task = progress.add_task("configurations", total=7, status="")
        # training steps over all configurations (one found in --work counts as done)
        steps_task = progress.add_task("training steps", total=7 * base.total_steps, status="")
        started = [0]

        def on_configuration(configuration: Any, phase: str) -> None:
            progress.update(task, status=f"{configuration.name}: {phase}")
            if phase == "training":
                started[0] += 1
            if phase == "evaluating":
                progress.advance(task)
                progress.update(steps_task, completed=started[0] * base.total_steps)

        def on_step(report: Any) -> None:
            progress.update(
                steps_task,
                completed=(started[0] - 1) * base.total_steps + report.step,
                status=f"{report.stage}: loss {report.loss:.3f}",
            )

        comparison = compare(
            base,
            work_dir,
            PhantomSource(base.seed),
            calibration,
            test,
            bootstrap_draws=100 if quick else 1000,
            on_configuration=on_configuration,
            on_step=on_step,
        )
        progress.update(task, completed=7)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "numeric_modes.json").write_text(results_json(comparison.numeric_rows))
    (out_dir / "positional_modes.json").write_text(results_json(comparison.positional_rows))
    numeric_results = [r for r in comparison.results if r.configuration.table == "numeric"]
    predicted_vs_true(
        {r.configuration.name: r.items for r in numeric_results},
        out_dir / "predicted_vs_true.png",
        f"Held-out phantoms, {len(test)} studies, measured at the true centres",
    )
    coverage_vs_nominal(
        {r.configuration.name: r.coverage for r in comparison.results},
        out_dir / "coverage_vs_nominal.png",
        "Calibrated ranges: coverage on the test half",
    )
    shipped = demo or default_checkpoint()
    if (shipped / "radcaliper.json").is_file():
        measurer = CheckpointMeasurer.load(shipped)
        bland_altman(
            numeric_items(measurer, test),
            out_dir / "bland_altman_shipped.png",
            f"{measurer.info.name} {measurer.info.version} vs truth",
        )
    seconds = time.monotonic() - began
    command = command_line(ctx)
    header = [
        f"- command: `{command.strip()}`; run time {seconds / 60:.1f} min on this machine",
        f"- held-out: {studies} phantoms of run seed {seed} (first half calibrates the "
        f"ranges, second half is tested); training: seed {base.seed}, "
        f"{base.total_steps} steps per configuration",
        f"- results: `{out_dir}/numeric_modes.json`, `{out_dir}/positional_modes.json`, plots "
        f"in `{out_dir}/`",
    ]
    text = comparison_markdown(
        list(comparison.numeric_rows), list(comparison.positional_rows), header
    )
    if results_md is not None:
        _replace_section(results_md, text)
    out.print(text, markup=False, highlight=False)


def _evaluate_on_dataset(
    ctx: typer.Context,
    dataset: Path,
    model_dir: Path | None,
    out_dir: Path | None,
    results_md: Path | None,
) -> None:
    """``evaluate --dataset``: one model on one dataset (``app.dataset_eval``)."""
    from app.dataset_eval import evaluate_dataset, write_outputs
    from ingestion.errors import RadcaliperError
    from model.measurer.data.sources import DatasetSource

    try:  # the dataset first: a wrong folder should not wait for the model to load
        source = DatasetSource(dataset, cache=1)  # read once; each series is measured once
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    measurer = load_measurer(model_dir)
    info = measurer.info
    try:
        with progress_display() as progress:
            task = progress.add_task("evaluating", total=len(source), status="")
            result = evaluate_dataset(measurer, source, on_study=lambda _: progress.advance(task))
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    target = out_dir or dataset / "evaluation" / f"{info.name}-{info.version}"
    header = [
        f"- command: `{command_line(ctx).strip()}`; {result.seconds / 60:.1f} min",
        f"- dataset: `{dataset}` ({result.evaluation.studies} series); results in `{target}/`",
    ]
    text = write_outputs(result, target, header)
    if results_md is not None:
        _replace_section(results_md, text, DATASET_BEGIN, DATASET_END)
    out.print(text, markup=False, highlight=False)


def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port.")] = 7860,
    db: DbOption = None,
    model_dir: Annotated[
        Path | None,
        typer.Option("--model", help="Measurer checkpoint directory (default: the demo model)."),
    ] = None,
    session_minutes: Annotated[
        float, typer.Option("--session-minutes", min=1, help="Login sessions expire after this.")
    ] = 30.0,
    demo: Annotated[
        bool | None,
        typer.Option(
            "--demo/--no-demo",
            help="Fill an empty database with demo studies and users (default: for the default "
            "database only).",
        ),
    ] = None,
    secure_cookies: Annotated[
        bool | None,
        typer.Option(
            "--secure-cookies/--no-secure-cookies",
            help="Send the session cookie over HTTPS only: turn on behind an HTTPS proxy "
            "(default: RADCALIPER_SECURE_COOKIES, else off).",
        ),
    ] = None,
) -> None:
    """Start the review UI: log in, worklist, study view with overlays, reviews, upload, audit.

    On the first start with the default database it measures three phantom studies with the demo
    model and creates the demo users reviewer, auditor and admin, printing their passwords once
    (also in DATA_DIR/demo-users.txt). Stop it with Ctrl-C.

    Failed logins back off: 5 for one user name from one address lock that name from that
    address for 30 s, doubled with each further failure up to 15 minutes; 30 from one address
    lock the address; a name with 10 failures from anywhere within 15 minutes is slowed (3 s)
    from other addresses, never locked, so its owner still gets in (RADCALIPER_LOGIN_*
    settings; 'radcaliper users unlock' ends a lock). The client address is the peer's; a
    proxy's X-Forwarded-For counts only from RADCALIPER_TRUSTED_PROXIES. The UI's temporary
    files are kept in DATA_DIR/ui-temp (owner-only, emptied when the server stops).
    """
    import uvicorn

    from app.files import owner_only_dir
    from app.progress import steps_display
    from app.ui.context import UiContext
    from app.ui.demo import demo_real_study, seed_demo
    from app.ui.server import APP_PATH, create_app
    from ingestion import Modality

    settings = _settings(ctx)
    checked(lambda: owner_only_dir(settings.data_dir))  # uploads, demo studies, UI temp files
    store = open_database(ctx, db, create=True)
    context = UiContext(
        store=store,
        model_dir=model_dir,
        nifti_modality=Modality(settings.nifti_modality) if settings.nifti_modality else None,
        upload_dir=settings.data_dir / "uploads",
        pseudonym_key=settings.pseudonym_key,
        correction_limits=settings.correction_limits,
        temp_dir=settings.data_dir / "ui-temp",
    )
    if demo if demo is not None else db is None and settings.default_database:
        with steps_display("preparing the demo") as status:
            status.update("loading the demo model")
            measurer = context.measurer()
            real = demo_real_study()
            if real is None:
                out.print(
                    "no shared data folder on this machine: the demo shows phantoms only "
                    "(set RADCALIPER_SHARED_DATA to add the real CT demo study)"
                )
            passwords = seed_demo(
                store,
                measurer,
                settings.data_dir,
                on_step=lambda text: status.update(text),
                real_study=real,
            )
        for name, password in passwords.items():
            out.print(f"demo user [bold]{name}[/bold] password: {password}")
    out.print(f"radcaliper review UI on http://{host}:{port}/ (the app is at {APP_PATH}/)")
    uvicorn.run(
        create_app(
            context,
            session_minutes=session_minutes,
            login_limits=settings.login_limits,
            secure_cookies=settings.secure_cookies if secure_cookies is None else secure_cookies,
            trusted_origins=settings.trusted_origins,
            trusted_proxies=settings.trusted_proxies,
        ),
        host=host,
        port=port,
        log_level="warning",
        proxy_headers=False,  # the app reads X-Forwarded-For from trusted proxies only
    )
