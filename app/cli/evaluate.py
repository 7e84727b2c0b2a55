"""``radcaliper evaluate``: score a checkpoint on phantoms or a dataset and write the comparison
(markdown sections, plots, JSON); registered on the ``radcaliper`` app by ``app.cli.root``."""

from __future__ import annotations

import enum
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli.loading import load_checkpoint, output_folder
from app.cli.store import checked
from app.cli.train import read_train_config, with_steps
from app.console import (
    EXIT_NOTHING,
    command_line,
    err,
    out,
    safe,
    settings_of,
)
from app.progress import progress_display

if TYPE_CHECKING:
    from model.measurer.evaluate.comparison import Configuration
    from model.measurer.train import StepReport

__all__ = [
    "CLICK_BEGIN",
    "CLICK_END",
    "DATASET_BEGIN",
    "DATASET_END",
    "RESULTS_BEGIN",
    "RESULTS_END",
    "EvaluationTask",
    "SplitSide",
    "evaluate",
]

logger = logging.getLogger(__name__)
_settings = settings_of


RESULTS_BEGIN = "<!-- radcaliper evaluate: begin -->"
RESULTS_END = "<!-- radcaliper evaluate: end -->"
DATASET_BEGIN = "<!-- radcaliper evaluate --dataset: begin -->"
DATASET_END = "<!-- radcaliper evaluate --dataset: end -->"
CLICK_BEGIN = "<!-- radcaliper evaluate --task click: begin -->"
CLICK_END = "<!-- radcaliper evaluate --task click: end -->"


class EvaluationTask(enum.StrEnum):
    """What ``--dataset`` is scored on (``--task``)."""

    STUDY = "study"
    CLICK = "click"


class SplitSide(enum.StrEnum):
    """A side of the patient split (``ingestion.dataset.split.Side``; ``--split``)."""

    TRAIN = "train"
    VALIDATION = "validation"
    CALIBRATION = "calibration"
    TEST = "test"


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
    task: Annotated[
        EvaluationTask,
        typer.Option(
            "--task",
            case_sensitive=False,
            help="With --dataset: 'study' finds and measures every series; 'click' measures "
            "each lesion with readers' reads at clicks inside it (and outside it), against "
            "the readers, beside the classical click-seeded segmentation.",
        ),
    ] = "study",  # type: ignore[assignment]
    split: Annotated[
        list[SplitSide] | None,
        typer.Option(
            "--split",
            case_sensitive=False,
            help="With --task click: the side(s) of the patient split to score (repeatable; "
            "default test; docs/datasets.md).",
        ),
    ] = None,
) -> None:
    """Evaluate a model on a dataset (--dataset), or compare the numeric modes (RNED with the
    paper's and the correlation decoder, standard tokens, xVal) and the positional modes (M-RoPE,
    Circle-RoPE, Circle-RoPE + AGE) at the same data, backbone, budget and seed, on the same
    held-out phantoms.

    With --dataset: writes OUT/evaluation.json, OUT/evaluation.md and plots (Bland-Altman and
    predicted vs true per measurement); --results-md gets the tables. With --dataset and
    --task click: OUT/click_evaluation.json, OUT/click_evaluation.md and plots, for the model
    and the classical baseline on the test patients (--split), clicks drawn with --seed.
    Otherwise writes OUT/numeric_modes.json, OUT/positional_modes.json, plots (predicted vs
    true, Bland-Altman of the shipped model, coverage vs nominal) and the tables in
    --results-md. Models are trained into --work once and reused when their configuration is
    unchanged.
    """
    if out_dir is not None:
        output_folder(out_dir, "--out")
    if split and (dataset is None or task is not EvaluationTask.CLICK):
        err.print("[red]error:[/red] --split goes with --dataset DIR --task click")
        raise typer.Exit(2)
    if task is EvaluationTask.CLICK:
        if dataset is None:
            err.print("[red]error:[/red] --task click needs --dataset DIR (readers' reads)")
            raise typer.Exit(2)
        sides = tuple(split or (SplitSide.TEST,))
        _evaluate_clicks(ctx, dataset, demo, out_dir, results_md, sides, seed)
        return
    if dataset is not None:
        _evaluate_on_dataset(ctx, dataset, demo, out_dir, results_md)
        return
    out_dir = out_dir or Path("benchmarks/results")
    import time

    from app.evaluation.plots import bland_altman, coverage_vs_nominal, predicted_vs_true
    from app.report import comparison_markdown
    from model.measurer.checkpoint import default_checkpoint
    from model.measurer.data import PhantomSource
    from model.measurer.evaluate.comparison import compare, numeric_items, results_json
    from model.measurer.infer import CheckpointMeasurer
    from model.measurer.train import Stage, TrainConfig

    settings = _settings(ctx)
    began = time.monotonic()
    if quick:
        base = TrainConfig.tiny(
            seed=0, stages=(Stage("quick", steps or 3, 1e-3, warmup_steps=1),), axes_batch=0
        )
        studies = 4
    else:
        base = TrainConfig() if config_file is None else read_train_config(config_file)
        if steps is not None:
            base = with_steps(base, steps)
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

        def on_configuration(configuration: Configuration, phase: str) -> None:
            progress.update(task, status=f"{configuration.name}: {phase}")
            if phase == "training":
                started[0] += 1
            if phase == "evaluating":
                progress.advance(task)
                progress.update(steps_task, completed=started[0] * base.total_steps)

        def on_step(report: StepReport) -> None:
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
    """``evaluate --dataset``: one model on one dataset (``app.evaluation.dataset``)."""
    from app.evaluation.dataset import evaluate_dataset, write_outputs
    from ingestion.errors import RadcaliperError
    from model.measurer.data import DatasetSource

    try:  # the dataset first: a wrong folder should not wait for the model to load
        source = DatasetSource(dataset, cache=1)  # read once; each series is measured once
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    measurer = load_checkpoint(model_dir)
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


def _evaluate_clicks(
    ctx: typer.Context,
    dataset: Path,
    model_dir: Path | None,
    out_dir: Path | None,
    results_md: Path | None,
    sides: tuple[SplitSide, ...],
    seed: int,
) -> None:
    """``evaluate --dataset DIR --task click``: the model and the baseline at the same clicks
    (``app.evaluation.clicks``)."""
    from app.evaluation.clicks import ClickMeasurer, evaluate_clicks, write_click_outputs
    from ingestion.dataset.format import read_dataset
    from ingestion.dataset.split import Side, select_side
    from ingestion.errors import RadcaliperError
    from model.baseline import ClickSegmentation

    chosen = [Side(s.value) for s in sides]
    try:  # the dataset first: a wrong folder should not wait for the model to load
        data = select_side(read_dataset(dataset), chosen)
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    measurer = load_checkpoint(model_dir)
    info = measurer.info
    baseline = ClickSegmentation()
    measurers: dict[str, ClickMeasurer] = {
        f"{info.name} {info.version}": measurer,
        f"{baseline.info.name} {baseline.info.version}": baseline,
    }
    try:
        with progress_display() as progress:
            task = progress.add_task("clicking", total=None, status="")
            result = evaluate_clicks(
                measurers,
                data,
                chosen,
                seed=seed,
                on_series=lambda done, total: progress.update(task, completed=done, total=total),
            )
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    target = out_dir or dataset / "evaluation" / f"click-{info.name}-{info.version}"
    header = [
        f"- command: `{command_line(ctx).strip()}`; {result.seconds / 60:.1f} min",
        f"- dataset: `{dataset}`, side(s) {', '.join(result.sides)}: {result.lesions} lesions; "
        f"click seed {seed}; results in `{target}/`",
    ]
    text = write_click_outputs(result, target, header)
    if results_md is not None:
        _replace_section(results_md, text, CLICK_BEGIN, CLICK_END)
    out.print(text, markup=False, highlight=False)
