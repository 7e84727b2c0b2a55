"""``radcaliper batch``: every study under a folder tree (registered on the app by ``app.cli``).

The work is in ``app.batch.run``; this module reads the options, draws the progress and turns the
outcome into one summary, the report files and the exit status.
"""

from __future__ import annotations

import enum
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Generic

import typer
from rich.markup import escape

from app.cli.loading import deferred_measurer
from app.cli.store import DbOption, checked, open_database
from app.console import EXIT_NOTHING, cli_actor, err, out, settings_of
from app.progress import ProgressDisplay, TaskKey, progress_display

if TYPE_CHECKING:
    from app.batch.options import BatchOptions, BatchSummary
    from app.batch.state import StudyRecord
    from db.engine import Store

__all__ = ["batch"]

logger = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130
_SHOWN = 10  # failed studies / rejected files listed on the terminal when there is no report


class _Listener(Generic[TaskKey]):
    """Feeds a progress display (bar or lines) from the batch's callbacks."""

    def __init__(self, display: ProgressDisplay[TaskKey]) -> None:
        self.display = display
        self.files = 0
        self.scan_task = display.add_task("scanning files", total=None, status="")
        self.study_task: TaskKey | None = None
        self.done = 0

    def scanned(self, files: int) -> None:
        self.files = files
        self.display.update(self.scan_task, completed=files)

    def planned(self, studies: int) -> None:
        self.display.update(self.scan_task, completed=self.files, total=max(1, self.files))
        self.study_task = self.display.add_task("studies", total=studies, status="")

    def finished(self, record: StudyRecord, summary: BatchSummary) -> None:
        assert self.study_task is not None, "planned() comes before the first study"
        status = (
            f"{summary.stored} stored, {summary.already_stored} already, {summary.failed} failed"
        )
        self.done += 1
        self.display.update(self.study_task, completed=self.done, status=status)


class Engine(enum.StrEnum):
    LOCAL = "local"
    RAY = "ray"


def _print_summary(summary: BatchSummary) -> None:
    scan = summary.scan
    hours = summary.seconds / 3600
    rate = f", {summary.stored / hours:,.0f} studies/hour" if summary.stored and hours else ""
    out.print(
        f"{summary.studies} studies under {escape(str(summary.root))}: {summary.stored} stored, "
        f"{summary.already_stored} already stored, {summary.failed} failed "
        f"({summary.seconds:.1f} s{rate})",
        highlight=False,
    )
    out.print(
        f"{scan.files} files ({scan.reused} unchanged since the last scan): {scan.images} "
        f"images, {scan.skipped} skipped, {scan.rejected} rejected; series: "
        f"{summary.skipped_series} left out, {summary.rejected_series} rejected",
        highlight=False,
    )
    if summary.sr_written or summary.sr_failed:
        out.print(f"DICOM SR: {summary.sr_written} written, {summary.sr_failed} failed")
    if summary.report:
        out.print("report: " + ", ".join(escape(str(p)) for p in summary.report), highlight=False)


def _print_problems(summary: BatchSummary) -> None:
    """Without a report: the first failed studies and rejected files on stderr."""
    if summary.report or not summary.problems:
        return
    err.print(
        f"{summary.problems} problem(s); the first ones below (--report FILE lists them all):",
        highlight=False,
    )
    for line in summary.first_problems[:_SHOWN]:
        err.print(f"  - {line}", markup=False, highlight=False)


def batch(
    ctx: typer.Context,
    root: Annotated[Path, typer.Argument(help="Folder tree to process (e.g. a PACS export).")],
    db: DbOption = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=0,
            help="Local engine: processes that load studies while others measure (default: "
            "half the CPUs, 1 to 8; 0 loads in this process). "
            "Ray engine: measuring workers, each with the model loaded once (default: one per "
            "--gpus-per-worker GPUs, else half the cluster's CPUs).",
        ),
    ] = None,
    measurers: Annotated[
        int | None,
        typer.Option(
            "--measurers",
            min=1,
            help="Local engine: processes that measure and store, each with the model loaded "
            "and one torch thread (1: this process, with the CPUs the loaders leave). Default: "
            "1 with a GPU, else one per CPU less the loaders beyond the first, as many as half "
            "the available memory holds.",
        ),
    ] = None,
    engine: Annotated[
        Engine,
        typer.Option(
            "--engine",
            case_sensitive=False,
            help="Where to run: 'local' (this machine) or 'ray' (a Ray cluster: header reads "
            "and loads as tasks, measuring and storing in workers; pip install "
            "'radcaliper[ray]').",
        ),
    ] = Engine.LOCAL,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="Ray engine: the cluster to join: 'auto' (this machine's running cluster), "
            "HOST:PORT or ray://HOST:PORT (default: start a Ray instance on this machine).",
        ),
    ] = None,
    gpus_per_worker: Annotated[
        float,
        typer.Option(
            "--gpus-per-worker",
            min=0,
            help="Ray engine: GPUs each measuring worker holds (0: CPU workers).",
        ),
    ] = 0.0,
    connect_timeout: Annotated[
        float,
        typer.Option(
            "--connect-timeout",
            help="Ray engine with --address: give up joining the cluster after this many "
            "seconds (exit 2); an address where nothing listens is refused at once.",
        ),
    ] = 30.0,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Write FILE.json and FILE.csv: every study's outcome, every rejected file "
            "and series with its reason, everything skipped (a .json/.csv suffix is dropped).",
        ),
    ] = None,
    export_sr: Annotated[
        Path | None,
        typer.Option(
            "--export-sr",
            help="Write a DICOM SR (TID 1500) per stored study into this folder, "
            "<study uid>.sr.dcm (an existing file is kept).",
        ),
    ] = None,
    model_dir: Annotated[
        Path | None,
        typer.Option("--model", help="Measurer checkpoint directory (default: the demo model)."),
    ] = None,
    work: Annotated[
        Path | None,
        typer.Option(
            "--work",
            help="Work folder for the file index and the resume state (default: "
            "DATA_DIR/batch/<hash of ROOT>).",
        ),
    ] = None,
    modality: Annotated[
        list[str] | None,
        typer.Option(
            "--modality",
            help="Modality to measure; repeat for several (CT, MR; default CT).",
        ),
    ] = None,
    min_slices: Annotated[
        int,
        typer.Option("--min-slices", min=1, help="Series with fewer slices are not measured."),
    ] = 10,
    include_derived: Annotated[
        bool,
        typer.Option(
            "--include-derived",
            help="Also consider DERIVED/SECONDARY series (reformats); by default only "
            "ORIGINAL images are measured.",
        ),
    ] = False,
    all_series: Annotated[
        bool,
        typer.Option(
            "--all-series",
            help="Measure every eligible series of a study, not only the best one.",
        ),
    ] = False,
    organization: Annotated[
        str,
        typer.Option("--organization", help="Verifying organization in exported SRs."),
    ] = "radcaliper",
) -> None:
    """Measure every study under ROOT, unattended, resumably and idempotently.

    Every file's header is indexed on disk (memory does not grow with the tree); per study one
    series is chosen (CT, at least --min-slices slices, no localizers, derived images or
    secondary captures; axial first, then the thinnest reconstruction), loaded in worker
    processes while measuring processes (see --measurers) measure it, and stored in one
    transaction per study. A re-run
    skips what is stored for the same model and input, so a killed batch resumes where it
    stopped. With --engine ray the same batch runs on a Ray cluster (every node sees ROOT, the
    model and the database at the same addresses; PostgreSQL on more than one node). Exit
    status: 0 every study done and no file rejected, 1 some files or studies failed (the others
    are stored), 2 nothing could run (no ROOT, no study under it, an unusable database or
    model, no Ray for --engine ray, or another batch in the work folder).
    """
    from app.batch.options import BatchOptions, default_work_dir, default_workers
    from app.batch.run import run_batch
    from app.files import owner_only_dir
    from ingestion.errors import ConfigurationError, ModelError
    from ingestion.selection import SelectionRules

    settings = settings_of(ctx)
    if engine is Engine.LOCAL and (address is not None or gpus_per_worker or connect_timeout != 30):
        err.print(
            "[red]error:[/red] --address, --gpus-per-worker and --connect-timeout are options "
            "of --engine ray",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOTHING)
    if engine is Engine.RAY and measurers is not None:
        err.print(
            "[red]error:[/red] --measurers is an option of --engine local (with --engine ray, "
            "--workers sets the measuring workers)",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOTHING)
    if not root.exists():
        err.print(f"[red]error:[/red] {escape(str(root))}: no such file or folder", highlight=False)
        raise typer.Exit(EXIT_NOTHING)
    root = root.resolve()
    try:
        rules = SelectionRules(
            modalities=tuple(m.upper() for m in modality or ["CT"]),
            min_slices=min_slices,
            include_derived=include_derived,
            all_series=all_series,
        )
    except ValueError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    if work is None:  # the work index holds headers: inside the owner-only data dir
        checked(lambda: owner_only_dir(settings.data_dir))
    options = BatchOptions(
        root=root,
        work_dir=work or default_work_dir(settings.data_dir, root),
        rules=rules,
        workers=default_workers() if workers is None or engine is Engine.RAY else workers,
        measurers=measurers,
        export_sr=export_sr,
        report=report,
        organization=organization,
        actor=cli_actor(),
        pseudonym_key=settings.pseudonym_key,
        correction_limits=settings.correction_limits,
    )
    if engine is Engine.RAY:
        _check_ray(workers, gpus_per_worker, connect_timeout)
    store = open_database(ctx, db, create=True)
    try:
        if engine is Engine.RAY:
            summary = _run_on_ray(
                options, store, model_dir, address, workers, gpus_per_worker, connect_timeout
            )
        else:  # the model is loaded when the first study needs measuring
            measurer = deferred_measurer(model_dir)
            with progress_display() as display:
                summary = run_batch(
                    options, store=store, measurer=measurer, listener=_Listener(display)
                )
    except (ConfigurationError, ModelError) as exc:  # ModelError: the model did not load
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    finally:
        store.dispose()
    _print_summary(summary)
    _print_problems(summary)
    if summary.aborted:
        err.print(
            f"[red]error:[/red] the batch stopped: {escape(summary.aborted)}; fix it and run the "
            "same command again to resume",
            highlight=False,
        )
    if summary.interrupted:
        err.print("interrupted; run the same command again to resume", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED)
    if summary.studies == 0:
        err.print(
            f"[red]error:[/red] no CT/MR image study under {escape(str(root))}", highlight=False
        )
    raise typer.Exit(summary.exit_code)


def _check_ray(workers: int | None, gpus_per_worker: float, connect_timeout: float) -> None:
    """Ray installed and the options valid, before the database is opened (exit 2 if not)."""
    from app.batch.ray_engine import RayOptions, import_ray
    from ingestion.errors import ConfigurationError

    try:
        import_ray()
        RayOptions(
            workers=workers or None,
            gpus_per_worker=gpus_per_worker,
            connect_timeout_s=connect_timeout,
        )
    except (ConfigurationError, ValueError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    if workers == 0:
        err.print("[red]error:[/red] --engine ray needs --workers >= 1 (measuring workers)")
        raise typer.Exit(EXIT_NOTHING)


def _run_on_ray(
    options: BatchOptions,
    store: Store,
    model_dir: Path | None,
    address: str | None,
    workers: int | None,
    gpus_per_worker: float,
    connect_timeout: float,
) -> BatchSummary:
    """The batch on Ray: the model named from its directory (its weights load in the workers)."""
    from app.batch.options import ModelIdentity
    from app.batch.ray_engine import RayEngine, RayOptions
    from app.batch.run import run_batch
    from ingestion.errors import ModelError
    from model.measurer.checkpoint.settings import default_checkpoint

    try:
        model = ModelIdentity.of(model_dir or default_checkpoint())
    except ModelError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    ray_options = RayOptions(
        address=address,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        connect_timeout_s=connect_timeout,
    )
    with RayEngine(options, store, model, ray_options) as engine, progress_display() as display:
        return run_batch(
            options, store=store, measurer=model, listener=_Listener(display), engine=engine
        )
