"""``radcaliper measure``: find and measure the lesions and vessels of one study (handed to a
running resident when there is one); registered on the ``radcaliper`` app by ``app.cli.root``.

``measure PATH --at X,Y,Z [--at ...]`` measures only at clicked points (patient coordinates, LPS
mm) of one series: the result's findings are the points' findings in point order, and its
``clicks`` (JSON) say for each point its finding's id or why nothing is measurable there. The
points are checked before anything is loaded (three finite numbers, at most ``MAX_POINTS``),
and against the volume before the model or the store is opened (``refuse_outside``); the run
stored is one of its own (``app.measuring.clicks_identity``).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli.loading import (
    load_measurer,
    load_study,
)
from app.cli.points import MAX_POINTS, parsed_point, points_problem
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
    from app.measuring import Point
    from app.report import JSONValue
    from db.engine import Store
    from db.store import StoreOutcome
    from ingestion.volume import Volume
    from model.measurer.protocol import Measurer
    from model.measurer.results import StudyResult

__all__ = ["MAX_POINTS", "checked_points", "measure", "parsed_point", "refuse_outside"]

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
    at: Annotated[
        list[str] | None,
        typer.Option(
            "--at",
            metavar="X,Y,Z",
            callback=checked_points,
            help="Measure only at this point (patient coordinates, LPS mm; repeat for more "
            f"points, at most {MAX_POINTS}): one finding per point, or 'nothing measurable "
            "here' with the reason. With --json the result also has 'clicks': one "
            '{"at_lps_mm", "finding_id", "nothing_measurable"} per point, in order.',
        ),
    ] = None,
) -> None:
    """Find and measure the lesions (long x short axis) and vessels (diameter) of one study.

    Every value comes with its calibrated range and the model's name and version. A study with
    several series gives one result per series (a JSON list with --json). With --at, only what
    is at the given points is measured, in one series (a path holding several is refused): the
    findings in the order of the points, and for each point its finding or why there is none;
    a point outside the volume is refused before anything is measured. The result is stored
    (--db, else RADCALIPER_DATABASE_URL, else SQLite in the data dir) unless --no-store; the
    same model on the same input (and the same points) is stored once. Exit status: 0 measured
    (with --at: the model answered at least one point), 2 nothing could be measured (or stored).
    """
    if use_resident:
        from app.resident import forward_once

        verbosity = ctx.find_root().params.get("verbose") or 0
        data_dir = _settings(ctx).data_dir
        status = checked(lambda: forward_once(data_dir, command_args(ctx), verbosity=verbosity))
        if status is not None:
            raise typer.Exit(status)
    from app.heap import keep_freed_memory
    from app.threads import command_started, measuring_threads, torch_threads
    from ingestion import Modality

    started = command_started()  # what other work does while the study and the model load
    settings = _settings(ctx)
    modality = Modality(settings.nifti_modality) if settings.nifti_modality else None
    loaded = load_study(path, modality)  # kept loaded in a resident
    for rejected in loaded.rejected:
        logger.info("skipped: %s", rejected.reason)
    if not loaded.volumes:
        err.print(f"[red]error:[/red] no usable CT series under {path}", highlight=False)
        for rejected in loaded.rejected[:5]:
            err.print(f"  - {rejected.reason}", markup=False, highlight=False)
        raise typer.Exit(EXIT_NOTHING)
    points = None if not at else [parsed_point(text) for text in at]
    if points is not None:
        refuse_outside(path, loaded.volumes, at or [], points)  # before a model or store opens
    store = None if no_store else open_database(ctx, db, create=True)
    key = settings.pseudonym_key
    measurer = load_measurer(model_dir)
    import torch  # loaded with the model

    keep_freed_memory()  # the process only measures from here on (app.heap)
    try:  # torch on the CPUs other work leaves free (app.threads)
        with torch_threads(measuring_threads(torch.get_num_threads(), since=started)):
            if points is not None:
                status = _measure_clicks(
                    measurer, loaded.volumes[0], points, path, store, key, as_json
                )
                raise typer.Exit(status)
            results = _measure_series(measurer, loaded.volumes, path, store, key)
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


def _measure_series(
    measurer: Measurer,
    volumes: Sequence[Volume],
    path: Path,
    store: Store | None,
    pseudonym_key: str | None,
) -> list[StudyResult]:
    """Measure and store each series (a series the model refuses is said and left out)."""
    from app.measuring import measure_and_store
    from ingestion.errors import ModelError

    results = []
    for volume in volumes:
        run = functools.partial(
            measure_and_store,
            measurer,
            volume,
            source=str(path.resolve()),
            store=store,
            actor=cli_actor(),
            pseudonym_key=pseudonym_key,
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
        _say_stored(measured.result, measured.stored)
    return results


def _measure_clicks(
    measurer: Measurer,
    volume: Volume,
    points: Sequence[Point],
    path: Path,
    store: Store | None,
    pseudonym_key: str | None,
    as_json: bool,
) -> int:
    """Measure at ``points``, store and print the answers (module doc); the exit status."""
    from app.measuring import measure_at_and_store

    run = functools.partial(
        measure_at_and_store,
        measurer,
        volume,
        points,
        source=str(path.resolve()),
        store=store,
        actor=cli_actor(),
        pseudonym_key=pseudonym_key,
    )
    measured = checked(run)
    if not measured.answered:
        err.print(
            "[red]not measured:[/red] the model answered at none of the points (each point's "
            "reason is in its answer)",
            highlight=False,
        )
    _say_stored(measured.result, measured.stored)
    if as_json:
        data = measured.result.to_json()
        data["clicks"] = [click.to_json() for click in measured.clicks]
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        from app.report import print_result

        print_result(out, measured.result)
        for k, click in enumerate(measured.clicks, start=1):
            where = ", ".join(f"{c:.1f}" for c in click.at_lps_mm)
            answer = (
                click.nothing_measurable
                if click.finding_id is None
                else f"finding {click.finding_id} "
                f"({measured.result.findings[click.finding_id - 1].kind.value})"
            )
            out.print(f"point {k} at ({where}) mm: {safe(answer)}", highlight=False)
    return EXIT_OK if measured.answered else EXIT_NOTHING


def _say_stored(result: StudyResult, stored: StoreOutcome | None) -> None:
    if stored is not None:
        verb = "stored as" if stored.created else "already stored as"
        err.print(
            f"series {safe(result.series_instance_uid)}: {verb} run {stored.run_id}",
            highlight=False,
        )


# --- --at: clicked points ------------------------------------------------------------------------


def checked_points(values: list[str] | None) -> list[str] | None:
    """The ``--at`` option's check: every value a point, at most ``MAX_POINTS`` of them
    (refused with exit 2 before anything is loaded, or handed to a resident)."""
    if not values:
        return values
    problem = points_problem(values)
    if problem is not None:
        raise typer.BadParameter(problem)
    return values


def _extent(volume: Volume) -> tuple[tuple[float, float], ...]:
    """(low, high) LPS mm on each axis of the box around the volume's voxels (their edges)."""
    import numpy as np

    corners = np.array(
        [
            [-0.5 if low else n - 0.5 for low, n in zip(choice, volume.shape, strict=True)]
            for choice in itertools.product((True, False), repeat=3)
        ]
    )
    lps = volume.geometry.index_to_lps(corners)
    return tuple((float(lps[:, a].min()), float(lps[:, a].max())) for a in range(3))


def refuse_outside(
    path: Path, volumes: Sequence[Volume], texts: Sequence[str], points: Sequence[Point]
) -> None:
    """Exit 2 unless ``path`` holds one series and every point lies in its volume (its voxels'
    edges included), naming the series, or the point and the volume's extent."""
    if len(volumes) > 1:
        series = ", ".join(safe(v.identifiers.series_instance_uid) for v in volumes[:5])
        err.print(
            f"[red]error:[/red] --at measures one series, and {safe(path)} holds "
            f"{len(volumes)} ({series}{', ...' if len(volumes) > 5 else ''}); give the folder "
            "or file of one series",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOTHING)
    import numpy as np

    (volume,) = volumes
    for text, point in zip(texts, points, strict=True):
        index = volume.geometry.lps_to_index(np.asarray(point, dtype=np.float64))
        if all(-0.5 <= i <= n - 0.5 for i, n in zip(index, volume.shape, strict=True)):
            continue
        spans = ", ".join(
            f"{axis} {low:.2f} to {high:.2f}"
            for axis, (low, high) in zip("xyz", _extent(volume), strict=True)
        )
        err.print(
            f"[red]error:[/red] --at {safe(text)} is outside the volume of "
            f"{safe(path)}: it spans {spans} mm (LPS, x to the patient's left, y posterior, "
            "z head); give a point inside it",
            highlight=False,
        )
        raise typer.Exit(EXIT_NOTHING)
