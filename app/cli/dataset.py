"""``radcaliper dataset``: import annotations into a dataset folder, write hybrid training data
(real CT backgrounds with synthetic lesions) into one, and show what one holds.

``radcaliper dataset import SOURCE OUT --from KIND`` turns one input into rows of the dataset
format (``ingestion.dataset.format``) and adds them to OUT, replacing the rows of an earlier
import of the same input. What could not be imported is one line each (file, item, reason) on
stderr and in OUT/import_report.jsonl; the rest imports. Exit 0: everything imported; 1: some
items were skipped; 2: nothing could be imported.

``radcaliper dataset hybrid OUT --n N --seed S`` writes N studies of ``model.measurer.data.hybrid``
(real CT backgrounds, synthetic lesions) into OUT, with the same exit codes.
"""

from __future__ import annotations

import enum
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from app.console import EXIT_NOTHING, EXIT_OK, EXIT_PARTIAL, err, out, safe, settings_of
from app.progress import progress_display

if TYPE_CHECKING:
    from db.review import CorrectionLimits
    from ingestion.dataset.format import Dataset, ImportProgress, ImportResult

__all__ = ["dataset_app"]

dataset_app = typer.Typer(
    help="Datasets of true findings from label maps, DICOM SEG, DICOM SR, readers' measurements, "
    "reviews and phantoms (what train, calibrate and evaluate read).",
    no_args_is_help=True,
)


class SourceKind(enum.StrEnum):
    """What SOURCE is (``--from``)."""

    MASKS = "masks"
    SEG = "seg"
    SR = "sr"
    STORE = "store"
    PHANTOMS = "phantoms"
    READS = "reads"


def _run_import(
    kind: SourceKind,
    source: str,
    *,
    image: Path | None,
    images: Path | None,
    labels: Path | None,
    annotator: str | None,
    licence: str | None,
    modality: str | None,
    limits: CorrectionLimits,
    on_item: ImportProgress,
) -> ImportResult:
    """Call the importer of ``kind`` (each imports its libraries when called); ``limits``:
    the plausible values of an SR's measurements (the correction limits of the settings)."""
    if kind is SourceKind.STORE:
        from app.dataset_store import import_store

        return import_store(source, **({"licence": licence} if licence else {}))
    path = Path(source)
    if not path.exists():
        from ingestion.errors import ConfigurationError

        raise ConfigurationError(f"{path}: no such file or folder")
    if kind is SourceKind.MASKS:
        from ingestion.dataset.masks import import_masks

        return import_masks(
            path,
            image=image,
            label_file=labels,
            annotator=annotator or "unknown",
            licence=licence or "unknown",
            modality=modality,
            on_item=on_item,
        )
    if kind is SourceKind.SEG:
        from ingestion.dataset.seg import import_seg

        return import_seg(
            path,
            images=images,
            label_file=labels,
            annotator=annotator,
            licence=licence or "unknown",
            on_item=on_item,
        )
    if kind is SourceKind.SR:
        from ingestion.dataset.sr import import_sr

        return import_sr(
            path,
            limits=limits,
            images=images,
            annotator=annotator,
            licence=licence or "unknown",
            on_item=on_item,
        )
    if kind is SourceKind.READS:
        from ingestion.dataset.reads import import_reads

        return import_reads(
            path,
            on_item=on_item,
            **({"annotator": annotator} if annotator else {}),
            **({"licence": licence} if licence else {}),
        )
    from ingestion.dataset.phantoms import import_phantoms

    return import_phantoms(path, on_item=on_item, **({"licence": licence} if licence else {}))


@dataset_app.command("import")
def import_command(
    ctx: typer.Context,
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE",
            help="What to import: a label map or a folder of image/label pairs (masks), a SEG "
            "or SR file or folder, a database URL (store; 'default' for the app's database), "
            "a 'radcaliper phantoms' folder, or a folder of reads.csv with image/ and mask/ "
            "crops (reads: each reader's long and short axis; the truth is their median).",
        ),
    ],
    out_dir: Annotated[
        Path, typer.Argument(metavar="OUT", help="The dataset folder (made if missing).")
    ],
    kind: Annotated[
        SourceKind, typer.Option("--from", help="What SOURCE is.", case_sensitive=False)
    ],
    image: Annotated[
        Path | None,
        typer.Option(
            "--image",
            help="masks: the image a single label map annotates (DICOM folder, NIfTI, NRRD).",
        ),
    ] = None,
    images: Annotated[
        Path | None,
        typer.Option("--images", help="seg, sr: the folder holding the referenced series."),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(
            "--labels",
            help="masks, seg: JSON saying which labels are lesions and which vessels, e.g. "
            '{"1": "lesion", "52": "aorta"} (README "Datasets").',
        ),
    ] = None,
    annotator: Annotated[
        str | None,
        typer.Option("--annotator", help="Who made the annotations (reads: 'LIDC-IDRI readers')."),
    ] = None,
    licence: Annotated[
        str | None,
        typer.Option(
            "--licence",
            help="The annotations' licence or terms of use (reads: LIDC-IDRI's CC BY 3.0 "
            "with its attribution).",
        ),
    ] = None,
    modality: Annotated[
        str | None,
        typer.Option(
            "--modality", help="masks: CT or MR for NIfTI and NRRD images (they have no tag)."
        ),
    ] = None,
) -> None:
    """Import annotations into the dataset folder OUT.

    Importing the same input again replaces its rows and gives the same rows; other inputs' rows
    are kept. Items that cannot be used (a label map on another grid, a truncated lesion, an SR
    group without a usable measurement, a reads.csv row whose reads do not match n_reads, ...)
    are listed with the reason; the rest imports.

    --from reads: SOURCE holds reads.csv (case, patient_id, n_reads, reads_long_mm,
    reads_short_mm, median_read_long_mm, median_read_short_mm), image/CASE.nii.gz (CT) and
    mask/CASE.nii.gz; each row is one lesion whose axes are the readers' median, with every
    read kept, the patient recorded and the places (slice, centre, end points) from the mask.
    """
    from ingestion.dataset.format import INFO_NAME, write_import
    from ingestion.errors import RadcaliperError

    if modality is not None and modality.upper() not in ("CT", "MR"):
        err.print(f"[red]error:[/red] --modality {modality!r}: use CT or MR", highlight=False)
        raise typer.Exit(EXIT_NOTHING)
    if kind is SourceKind.STORE and source == "default":
        source = settings_of(ctx).effective_database_url
    try:
        with progress_display() as progress:
            task = progress.add_task(f"importing ({kind.value})", total=None, status="")

            def on_item(done: int, total: int, item: str) -> None:
                progress.update(task, completed=done, total=total, status=safe(Path(item).name))

            result = _run_import(
                kind,
                source,
                image=image,
                images=images,
                labels=labels,
                annotator=annotator,
                licence=licence,
                modality=modality.upper() if modality else None,
                limits=settings_of(ctx).correction_limits,
                on_item=on_item,
            )
            progress.update(task, completed=1, total=1, status="")
        if not (result.studies or result.findings or (out_dir / INFO_NAME).is_file()):
            dataset = None  # nothing to add, nothing to replace: no empty dataset is made
        else:
            dataset = write_import(out_dir, [result])
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    for skipped in result.skipped:
        err.print(f"[yellow]skipped[/yellow] {safe(skipped.line())}", highlight=False)
    kinds = Counter(f"{f.kind} ({f.label.value})" for f in result.findings)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no finding"
    held = (
        f"the dataset holds {len(dataset.series())} series, {len(dataset.findings)} rows"
        if dataset is not None
        else f"{safe(out_dir)} was not made"
    )
    out.print(
        f"Imported {len(result.studies)} series, {summary} from {safe(result.path)} into "
        f"{safe(out_dir)} ({len(result.skipped)} skipped); {held}",
        highlight=False,
    )
    if not result.findings and not result.studies:
        raise typer.Exit(EXIT_NOTHING)
    raise typer.Exit(EXIT_PARTIAL if result.skipped else EXIT_OK)


def _ids(option: str, value: str | None) -> list[str] | None:
    if value is None:
        return None
    ids = [part.strip() for part in value.split(",") if part.strip()]
    if not ids:
        from ingestion.errors import ConfigurationError

        raise ConfigurationError(f"{option} {value!r}: give background ids, e.g. ID,ID")
    return ids


@dataset_app.command("hybrid")
def hybrid_command(
    out_dir: Annotated[
        Path, typer.Argument(metavar="OUT", help="The dataset folder (made if missing).")
    ],
    n: Annotated[int, typer.Option("--n", min=1, help="How many studies to write.")],
    seed: Annotated[int, typer.Option("--seed", help="Study i is made from (seed, i).")] = 0,
    backgrounds: Annotated[
        str | None,
        typer.Option(
            "--backgrounds",
            metavar="ID,...",
            help="Use only these backgrounds (case ids of the shared data; default: every "
            "usable one).",
        ),
    ] = None,
    hold_out: Annotated[
        str | None,
        typer.Option(
            "--hold-out",
            metavar="ID,...",
            help="Never use these backgrounds (keep them for validation: write those with "
            "--backgrounds ID).",
        ),
    ] = None,
    shared: Annotated[
        Path | None,
        typer.Option(
            "--shared",
            metavar="DIR",
            help="The shared data folder holding real-ct/ and real-dicom/ (default: "
            "$RADCALIPER_SHARED_DATA, else ../shared/data beside the repository).",
        ),
    ] = None,
) -> None:
    """Write N hybrid studies into the dataset folder OUT: real CT backgrounds whose licence
    allows training a shipped model, augmented (flips, rotation, pixel spacing, field of view,
    slice thickness, intensity), with 1-4 synthetic lesions inserted by tissue. Truth is
    measured from each study's label map as 'dataset import --from masks' measures it;
    images and label maps are NIfTI files beside the manifest.

    Writing the same seed again replaces those studies' rows with the same rows. Exit 0:
    every study written; 1: some could not be made (listed); 2: none.
    """
    from ingestion.errors import RadcaliperError
    from model.measurer.data.hybrid import (
        HybridSource,
        choose_backgrounds,
        shared_data_root,
        write_hybrid_dataset,
    )

    try:
        root = shared_data_root(shared)
        chosen = choose_backgrounds(root, _ids("--backgrounds", backgrounds))
        held = _ids("--hold-out", hold_out) or []
        source = HybridSource(chosen, seed, held_out=held)
        with progress_display() as progress:
            task = progress.add_task("hybrid studies", total=n, status="")

            def on_item(done: int, total: int, item: str) -> None:
                progress.update(task, completed=done, total=total, status=safe(item))

            dataset, report = write_hybrid_dataset(out_dir, source, n, on_item=on_item)
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    failed = [line for line in report if not line.item]  # a whole study not made
    for line in report:
        colour = "red" if not line.item else "yellow"
        err.print(f"[{colour}]skipped[/{colour}] {safe(line.line())}", highlight=False)
    written = n - len(failed)
    names = ", ".join(ref.id for ref in source.training)
    out.print(
        f"Wrote {written} of {n} hybrid studies (seed {seed}; backgrounds {safe(names)}) into "
        f"{safe(out_dir)}; the dataset holds {len(dataset.series())} series, "
        f"{len(dataset.findings)} rows",
        highlight=False,
    )
    if written == 0:
        raise typer.Exit(EXIT_NOTHING)
    raise typer.Exit(EXIT_PARTIAL if failed else EXIT_OK)


def _summary_table(dataset: Dataset) -> Table:
    """Per input (source kind, path): series, lesions, vessels, negative examples, skipped."""
    series: dict[tuple[str, str], set[str]] = defaultdict(set)
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for study in dataset.studies:
        key = (study.provenance.source.value, study.provenance.path)
        series[key].add(study.series_instance_uid)
    for f in dataset.findings:
        key = (f.provenance.source.value, f.provenance.path)
        counts[key][f.kind if f.label.value == "finding" else "negative"] += 1
    for item in dataset.skipped:
        counts[(item.source.value, item.path)]["skipped"] += 1
    table = Table(title=f"Dataset {dataset.root}")
    for column in ("source", "input", "series", "lesions", "vessels", "negatives", "skipped"):
        table.add_column(column)
    for source, path in sorted(series.keys() | counts.keys()):
        count = counts[(source, path)]
        table.add_row(
            source,
            safe(path),
            str(len(series[(source, path)])),
            *(str(count[k]) for k in ("lesion", "vessel", "negative", "skipped")),
        )
    return table


@dataset_app.command("show")
def show_command(
    root: Annotated[Path, typer.Argument(metavar="DIR", help="A dataset folder.")],
    skipped: Annotated[
        bool, typer.Option("--skipped", help="Also list every item that was not imported.")
    ] = False,
) -> None:
    """What a dataset holds, per input: series, lesions, vessels, negative examples, skipped."""
    from ingestion.dataset.format import read_dataset
    from ingestion.errors import RadcaliperError

    try:
        dataset = read_dataset(root)
    except RadcaliperError as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    out.print(_summary_table(dataset))
    if skipped:
        for item in dataset.skipped:
            out.print(f"skipped {safe(item.line())}", highlight=False)
