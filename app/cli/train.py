"""``radcaliper train`` and ``radcaliper export-model``: train a checkpoint (with its memory
estimate and training configuration) and export one; registered by ``app.cli.root``."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer
from rich.markup import escape
from rich.table import Table

from app.cli.loading import (
    os_error,
    output_folder,
)
from app.console import (
    EXIT_NOTHING,
    EXIT_OK,
    command_line,
    err,
    out,
    safe,
    settings_of,
)
from app.progress import progress_display

if TYPE_CHECKING:
    from model.measurer.train import StepReport, TrainConfig

__all__ = ["export_model", "read_train_config", "train", "with_steps"]

logger = logging.getLogger(__name__)
_settings = settings_of


class _MemoryOptions(TypedDict, total=False):
    """``train``'s memory options that replace the configuration's."""

    gradient_checkpointing: bool
    accumulation: int
    weights_dtype: str


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
    from model.measurer.checkpoint import NumericMode
    from model.measurer.data import FolderSource, PhantomSource, StudySource, parse_sources
    from model.measurer.train import TrainConfig
    from model.measurer.train import train as run_training

    try:
        mode = NumericMode(numeric_mode)
    except ValueError:
        err.print(
            f"[red]error:[/red] --numeric-mode {numeric_mode!r}: use one of "
            + ", ".join(m.value for m in NumericMode)
        )
        raise typer.Exit(EXIT_NOTHING) from None
    if config_file is not None:
        config = read_train_config(config_file)
        if base_model is not None:
            config = dataclasses.replace(config, base_model=str(base_model))
    elif base_model is not None:
        config = TrainConfig.for_base_model(
            str(base_model), seed=seed, numeric_mode=mode, threads=threads
        )
    else:
        config = TrainConfig(seed=seed, numeric_mode=mode, threads=threads)
    if steps is not None:
        config = with_steps(config, steps)
    memory: _MemoryOptions = {}  # the options given; the configuration's own otherwise
    if checkpointing is not None:
        memory["gradient_checkpointing"] = checkpointing
    if accumulation is not None:
        memory["accumulation"] = accumulation
    if weights_dtype is not None:
        memory["weights_dtype"] = weights_dtype
    try:
        config = dataclasses.replace(config, **memory)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {safe(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    if dry_run:
        _print_memory(config)
        raise typer.Exit(EXIT_OK)
    output_folder(out_dir, "OUT")
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

        def on_step(report: StepReport) -> None:
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
            raise os_error(exc) from None
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
    from model.measurer.checkpoint import export_checkpoint

    output_folder(out_dir, "OUT")
    try:
        written = export_checkpoint(model_dir, out_dir, base_model=base_model)
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    except OSError as exc:
        raise os_error(exc) from None
    out.print(f"Standalone checkpoint written to {written}")


def _print_memory(config: TrainConfig) -> None:
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


def _restricted_licences(described: Mapping[str, object]) -> list[str]:
    """The non-commercial licences (``NC``, "non-commercial") a training source's description
    (``StudySource.describe()``, which the checkpoint records) names, its parts' included."""
    import re

    def licences(item: Mapping[str, object]) -> set[str]:
        listed, parts = item.get("licences", ()), item.get("parts", ())
        own = {str(licence) for licence in _items(listed)}
        return own.union(*(licences(part) for part in _items(parts) if isinstance(part, Mapping)))

    pattern = re.compile(r"\bNC\b|non-?commercial", re.IGNORECASE)
    return sorted(licence for licence in licences(described) if pattern.search(licence))


def _items(value: object) -> Iterable[object]:
    """The items of a described list (nothing when the description holds none)."""
    return value if isinstance(value, Iterable) else ()


def read_train_config(path: Path) -> TrainConfig:
    """The ``TrainConfig`` in ``path`` (``--config``), or exit 2 with one line saying why."""
    from model.measurer.train import TrainConfig

    try:
        return TrainConfig.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        err.print(
            f"[red]error:[/red] --config {path}: not a training configuration ({exc}); start "
            "from benchmarks/configs/ or the training_config.json of a model card",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOTHING) from None


def with_steps(config: TrainConfig, steps: int) -> TrainConfig:
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
