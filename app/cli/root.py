"""The ``radcaliper`` command line (Typer).

Heavy libraries (torch, transformers, MONAI) are imported inside the commands that need them, so
``radcaliper --help`` and ``radcaliper inspect`` start in well under a second. Errors from the
libraries are translated here: one clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from app.cli.batch import batch
from app.cli.calibrate import calibrate
from app.cli.clicks import calibrate_click, train_click
from app.cli.dataset import dataset_app
from app.cli.evaluate import evaluate
from app.cli.measure import measure
from app.cli.resident import resident
from app.cli.serve import serve
from app.cli.store import DbOption, audit_app, checked, db_app, open_database, users_app
from app.cli.train import export_model, train
from app.console import EXIT_NOTHING, EXIT_OK, err, out, safe, settings_of
from app.logs import configure_logging

if TYPE_CHECKING:
    from app.inspection import InspectReport

__all__ = ["app", "main"]

logger = logging.getLogger(__name__)

app = typer.Typer(
    name="radcaliper",
    help=(
        "radcaliper measures lesions and vessels on CT/MR studies and keeps every number "
        "auditable. Run a command with --help for its options."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
_settings = settings_of


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"radcaliper {version('radcaliper')}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    verbose: Annotated[
        int,
        typer.Option("--verbose", "-v", count=True, help="More log output (-v info, -vv debug)."),
    ] = 0,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Show the version and exit.",
        ),
    ] = False,
) -> None:
    """radcaliper: calibrated lesion and vessel measurements on CT/MR, with an audit trail."""
    from app.settings import Settings

    try:
        settings = Settings()
    except Exception as exc:  # pydantic ValidationError: a bad RADCALIPER_* variable
        err.print(f"[red]error:[/red] invalid RADCALIPER_* setting: {exc}")
        raise typer.Exit(EXIT_NOTHING) from exc
    if verbose:
        settings = settings.model_copy(update={"log_level": "DEBUG" if verbose > 1 else "INFO"})
    configure_logging(settings.log_level)
    ctx.obj = settings


def _print_inspect(report: InspectReport) -> None:
    series = report["series"]
    if series:
        table = Table(title=f"Series under {safe(report['path'])}", show_lines=False)
        for col in (
            "series",
            "format",
            "modality",
            "rows x cols x slices",
            "spacing mm (row, col, slice)",
            "plane",
            "description",
        ):
            table.add_column(col)
        for s in series:
            dims, sp = s["dimensions"], s["spacing_mm"]
            uid = s["series_instance_uid"]
            table.add_row(
                safe(uid if len(uid) <= 28 else "…" + uid[-27:]),
                s["source_format"],
                s["modality"] or "unknown",
                f"{dims['rows']} x {dims['columns']} x {dims['slices']}",
                f"{sp['row']:g}, {sp['column']:g}, {sp['slice']:g}",
                s["orientation"]["plane"],
                safe(s["description"]),  # the file's text: shown, not applied as markup
            )
        out.print(table)
        for s in series:
            for warning in s["warnings"]:
                out.print(
                    f"[yellow]note[/yellow] {safe(s['series_instance_uid'])}: {safe(warning)}"
                )
    else:
        out.print(f"[red]No usable CT/MR series under {safe(report['path'])}.[/red]")
    if report["rejected"]:
        out.print(f"\n[bold]{len(report['rejected'])} file(s) skipped:[/bold]")
        for r in report["rejected"]:
            out.print(f"  - {r['reason']}", markup=False, highlight=False)


@app.command()
def inspect(
    ctx: typer.Context,
    path: Annotated[
        Path, typer.Argument(help="A DICOM file or folder tree, or a NIfTI or NRRD file.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    headers_only: Annotated[
        bool,
        typer.Option(
            "--headers-only",
            help="Read headers only (fast); pixels are not decoded, so damage there goes unseen.",
        ),
    ] = False,
) -> None:
    """Show what would be ingested: each series with identifiers, modality, dimensions, spacing
    and orientation, and each skipped file with its reason.

    Exit status: 0 if at least one series loads, 2 if nothing is usable.
    """
    from app.inspection import inspect_path_report
    from ingestion import Modality

    settings = _settings(ctx)
    modality = Modality(settings.nifti_modality) if settings.nifti_modality else None
    report = inspect_path_report(path, read_pixels=not headers_only, nifti_modality=modality)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print_inspect(report)
    raise typer.Exit(EXIT_OK if report["series"] else EXIT_NOTHING)


@app.command()
def phantoms(
    out_dir: Annotated[Path, typer.Argument(help="Folder to write the studies into.")],
    n: Annotated[int, typer.Option("--n", min=1, help="Number of studies.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same studies).")] = 0,
    nifti: Annotated[
        bool, typer.Option("--nifti", help="Also write each study as NIfTI (image.nii.gz).")
    ] = False,
) -> None:
    """Write synthetic CT studies (shared/design/phantom-spec.md) as DICOM series, with truth.json.

    Each study goes to OUT/<study>/dicom/ (randomly named files); --nifti adds
    OUT/<study>/image.nii.gz. OUT/<study>/truth.json holds the lesions' long and short axes, the
    vessel diameter and their centres in LPS mm.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from ingestion.phantoms import write_phantoms

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("phantoms", total=n)
        studies = write_phantoms(
            out_dir, n=n, seed=seed, nifti=nifti, on_study=lambda _: progress.advance(task)
        )
    out.print(f"Wrote {len(studies)} studies to {out_dir}")


@app.command("export-sr")
def export_sr(
    ctx: typer.Context,
    study_uid: Annotated[str, typer.Argument(help="StudyInstanceUID of a stored study.")],
    out_dir: Annotated[Path, typer.Argument(help="Folder to write <study uid>.sr.dcm into.")],
    organization: Annotated[
        str, typer.Option("--organization", help="Verifying organization of a reviewed study.")
    ] = "radcaliper",
    db: DbOption = None,
) -> None:
    """Write the study's stored measurements as a DICOM SR (TID 1500 Comprehensive 3D SR).

    One measurement group per finding: tracking identifier and UID, finding type, long axis /
    short axis / diameter in mm with the calibrated range as measurement uncertainty, the
    measured slice, the model (name, version, not for clinical use) and each measurement's
    review status. Corrected values replace the model's; rejected ones are left out. VERIFIED,
    with the reviewers, once every measurement is reviewed. Exit status: 0 written, 2 the study
    is not stored or cannot be exported.
    """
    from app.sr import export_study_sr

    limits = _settings(ctx).correction_limits
    store = open_database(ctx, db)
    try:
        with store.reader() as session:
            done = checked(
                lambda: export_study_sr(
                    session, study_uid, out_dir, organization=organization, limits=limits
                )
            )
    finally:
        store.dispose()
    state = "VERIFIED" if done.verified else "UNVERIFIED"
    left = f", {len(done.left_out)} implausible value(s) left out" if done.left_out else ""
    out.print(
        f"wrote {done.path} ({done.groups} measurement group(s), {state}{left})", highlight=False
    )


for command in (measure, resident, batch, train, calibrate, evaluate, serve):
    app.command()(command)
app.command("export-model")(export_model)
app.command("train-click")(train_click)
app.command("calibrate-click")(calibrate_click)
app.add_typer(db_app, name="db")
app.add_typer(users_app, name="users")
app.add_typer(audit_app, name="audit")
app.add_typer(dataset_app, name="dataset")


def main() -> None:
    """Console-script entry point: run the CLI and translate radcaliper errors."""
    from ingestion.errors import RadcaliperError

    try:
        app()
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        sys.exit(EXIT_NOTHING)
