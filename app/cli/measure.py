"""``radcaliper measure``: find and measure the lesions and vessels of one study (handed to a
running resident when there is one); registered on the ``radcaliper`` app by ``app.cli.root``."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli.loading import (
    load_measurer,
)
from app.cli.store import DbOption, checked, open_database
from app.console import (
    EXIT_NOTHING,
    EXIT_OK,
    cli_actor,
    command_args,
    err,
    out,
    safe,
    settings_of,
)

if TYPE_CHECKING:
    from app.report import JSONValue

__all__ = ["measure"]

logger = logging.getLogger(__name__)
_settings = settings_of


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
        data: list[JSONValue] = [r.to_json() for r in results]
        sys.stdout.write(json.dumps(data[0] if len(data) == 1 else data, indent=2) + "\n")
    else:
        from app.report import print_result

        for result in results:
            print_result(out, result)
    raise typer.Exit(EXIT_OK)
