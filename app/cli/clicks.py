"""``radcaliper train-click`` and ``radcaliper calibrate-click``: the click model, trained on the
training patients' reads and calibrated on the calibration patients' (``ingestion.dataset.split``),
then attached to a checkpoint whose ``measure --at`` and review-UI clicks it answers; registered
by ``app.cli.root``."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from app.cli.loading import finite, os_error, output_folder
from app.console import EXIT_NOTHING, err, out, safe
from app.progress import progress_display

if TYPE_CHECKING:
    from ingestion.dataset.format import Dataset

__all__ = ["CLICK_FOLDER", "attach_click_model", "calibrate_click", "train_click"]

logger = logging.getLogger(__name__)

#: the folder of a checkpoint its attached click model lives in
CLICK_FOLDER = "click"


def _reads_side(dataset: Path, side: str) -> Dataset:
    """The dataset's chosen side of the patient split, or exit 2 saying why."""
    from ingestion.dataset.format import read_dataset
    from ingestion.dataset.split import Side, select_side
    from ingestion.errors import RadcaliperError

    try:
        return select_side(read_dataset(dataset), Side(side))
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None


def train_click(
    out_dir: Annotated[Path, typer.Argument(help="Folder to write the click model into.")],
    dataset: Annotated[
        Path,
        typer.Option(
            "--dataset",
            help="A dataset of real reads ('radcaliper dataset import DIR OUT --from reads'); "
            "only its training patients are used.",
        ),
    ],
    init_from: Annotated[
        Path | None,
        typer.Option("--init-from", help="Checkpoint whose weights to start from (the demo's)."),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimiser steps.")] = 2400,
    lr: Annotated[
        float, typer.Option("--lr", min=1e-7, max=1.0, callback=finite, help="Peak learning rate.")
    ] = 2e-4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the examples drawn.")] = 44,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU threads (default: all).")
    ] = None,
    version: Annotated[str, typer.Option("--version-tag", help="Model version to record.")] = (
        "0.1.0"
    ),
) -> None:
    """Train a click model: the caliper of a clicked lesion drawn in a view that fits it.

    Starts from --init-from's weights and trains the point task (a lesion at the click, or
    nothing) and the axes task (the caliper's end points in the view's pixels) on the
    dataset's training patients: every slice of every lesion, clicks anywhere inside it, sizes
    balanced, "nothing here" at least 5 mm from the lesion. Calibrate it next with
    'radcaliper calibrate-click'.
    """
    import torch

    from ingestion.errors import RadcaliperError
    from model.measurer.checkpoint import default_checkpoint
    from model.measurer.data.reads import ReadsClicks
    from model.measurer.inputs.view import LesionView
    from model.measurer.train.clicks import ClickStep, ClickTrainConfig, train_click_model

    output_folder(out_dir, "OUT_DIR")
    data = _reads_side(dataset, "train")
    if threads:
        torch.set_num_threads(threads)
    view = LesionView()
    try:
        examples = ReadsClicks.from_dataset(data, view)
    except (RadcaliperError, ValueError) as exc:
        err.print(f"[red]error:[/red] {dataset}: {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    config = ClickTrainConfig(steps=steps, lr=lr, seed=seed, view=view)
    start = init_from or default_checkpoint()
    with progress_display() as progress:
        task = progress.add_task("training", total=steps, status="")

        def stepped(step: ClickStep) -> None:
            progress.update(task, completed=step.step, status=f"axes loss {step.axes_loss:.3f}")

        try:
            train_click_model(
                start,
                out_dir,
                examples,
                config,
                name="radcaliper-demo-click",
                version=version,
                provenance={
                    "command": " ".join(["radcaliper", *sys.argv[1:]]),
                    "lesions": len(examples.lesions),
                    "side": "train",
                },
                on_step=stepped,
            )
        except RadcaliperError as exc:
            err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
            raise typer.Exit(EXIT_NOTHING) from None
        except OSError as exc:
            raise os_error(exc) from None
    out.print(f"wrote {out_dir} ({len(examples.lesions)} lesions, {steps} steps)")


def calibrate_click(
    model_dir: Annotated[Path, typer.Argument(help="Click model to calibrate.")],
    dataset: Annotated[
        Path,
        typer.Option(
            "--dataset",
            help="A dataset of real reads; only its calibration patients are used.",
        ),
    ],
    coverage: Annotated[
        float,
        typer.Option(
            "--coverage", min=0.5, max=0.99, callback=finite, help="Nominal coverage of ranges."
        ),
    ] = 0.90,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random clicks.")] = 0,
    attach_to: Annotated[
        Path | None,
        typer.Option(
            "--attach-to",
            help="Then copy the calibrated click model into this checkpoint (its 'click' "
            "folder), which answers clicks with it from then on.",
        ),
    ] = None,
) -> None:
    """Fit a click model's ranges on the calibration patients' reads (split conformal per
    measurement and size bin), store them in MODEL_DIR, and optionally attach it."""
    from ingestion.errors import RadcaliperError
    from model.measurer.calibrate.clicks import click_pairs, fit_click_calibration
    from model.measurer.checkpoint import read_settings, write_settings
    from model.measurer.infer import CheckpointMeasurer
    from model.measurer.infer.click import ClickCaliper

    data = _reads_side(dataset, "calibration")
    try:
        model = CheckpointMeasurer.load(model_dir)
        view = model.settings.lesion_view
        if view is None:
            err.print(
                f"[red]error:[/red] {model_dir} is not a click model (no lesion view); train "
                "one with 'radcaliper train-click'"
            )
            raise typer.Exit(EXIT_NOTHING)
        if attach_to is not None:
            read_settings(attach_to)  # a checkpoint, before the work
        with progress_display() as progress:
            task = progress.add_task("calibrating", total=len(data.findings), status="")
            pairs = click_pairs(
                ClickCaliper(model, view, None),
                data,
                seed=seed,
                on_lesion=lambda done, _: progress.update(task, completed=done),
            )
        calibration = fit_click_calibration(pairs.pairs, coverage)
    except (RadcaliperError, ValueError) as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    write_settings(model_dir, dataclasses.replace(model.settings, calibration=calibration))
    table = Table(title=f"Click ranges of {model_dir}: {pairs.clicks} clicks")
    for column in ("measurement", "predicted size", "n", "MAE mm", "rule", "mean width mm"):
        table.add_column(column)
    for name, bins in sorted(calibration.bins.items()):
        for size_bin in bins:
            rule = size_bin.rule
            table.add_row(
                name,
                f"[{size_bin.low_mm:g}, {size_bin.high_mm:g}) mm",
                str(rule.n),
                f"{rule.mae_mm:.2f}",
                f"{rule.kind.value} q={rule.quantile:.3f}",
                f"{rule.mean_width_mm:.2f}",
            )
    out.print(table)
    if pairs.unanswered:
        out.print(f"{pairs.unanswered} of {pairs.clicks} clicks gave no value (left out)")
    if attach_to is not None:
        try:
            attach_click_model(attach_to, model_dir)
        except OSError as exc:
            raise os_error(exc) from None
        out.print(f"attached to {attach_to} ({attach_to / CLICK_FOLDER})")


def attach_click_model(checkpoint: Path, click_model: Path) -> None:
    """Copy ``click_model`` into ``checkpoint/click`` (whole: it is copied beside first, then
    moved into place) and name it in the checkpoint's settings; no other setting changes."""
    from model.measurer.checkpoint import read_settings
    from model.measurer.checkpoint.settings import SETTINGS_NAME

    read_settings(checkpoint)  # a checkpoint, before anything is copied
    target = checkpoint / CLICK_FOLDER
    if target.resolve() != click_model.resolve():
        staging = checkpoint / f".{CLICK_FOLDER}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(click_model, staging, ignore=shutil.ignore_patterns("train_state"))
        shutil.rmtree(target, ignore_errors=True)
        staging.replace(target)
    path = checkpoint / SETTINGS_NAME
    data = json.loads(path.read_text())
    data["click_model"] = CLICK_FOLDER
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    partial.replace(path)
    read_settings(checkpoint)  # still a checkpoint
    logger.info("click model attached in %s", target)
