"""What the model commands share: loading the measurer (kept loaded in a resident), the
checkpoint folder, and the checks and error lines of their options and outputs."""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from app.console import EXIT_NOTHING, err, safe, settings_of

if TYPE_CHECKING:
    from app.batch.measure import DeferredMeasurer
    from app.resident import KeptModels, KeptVolumes
    from ingestion.load import LoadResult
    from ingestion.volume import Modality
    from model.measurer.infer import CheckpointMeasurer
    from model.measurer.protocol import Measurer

__all__ = [
    "checkpoint_dir",
    "deferred_measurer",
    "finite",
    "load_checkpoint",
    "load_measurer",
    "load_study",
    "model_error",
    "os_error",
    "output_folder",
]

logger = logging.getLogger(__name__)
_settings = settings_of


def checkpoint_dir(model_dir: Path | None) -> Path:
    """``model_dir``, else the demo model's directory; exit 2 when the demo model is missing."""
    from model.measurer.checkpoint import default_checkpoint

    directory = model_dir or default_checkpoint()
    if model_dir is None and not directory.is_dir():
        err.print(
            f"[red]error:[/red] the bundled demo model is missing ({directory}); reinstall "
            "radcaliper or pass --model DIR"
        )
        raise typer.Exit(EXIT_NOTHING)
    return directory


def output_folder(path: Path, name: str) -> None:
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


def os_error(error: OSError) -> typer.Exit:
    """Print an ``OSError`` met while writing as one line; the exit (2) to raise."""
    where = f"{error.filename}: " if error.filename else ""
    err.print(f"[red]error:[/red] {safe(where)}{safe(error.strerror or error)}", highlight=False)
    return typer.Exit(EXIT_NOTHING)


def finite(value: float) -> float:
    """A float option's check: a finite number (typer's ranges let inf through, nan too)."""
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def model_error(error: Exception) -> typer.Exit:
    """Print a ``ModelError`` as the one line a command exits 2 with; the exit to raise."""
    err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
    return typer.Exit(EXIT_NOTHING)


@functools.cache
def _kept() -> KeptModels[CheckpointMeasurer]:
    """The checkpoints a resident keeps loaded (made at the first load: ``--help`` imports
    nothing of the resident)."""
    from app.resident import KeptModels

    return KeptModels()


@functools.cache
def _kept_volumes() -> KeptVolumes[LoadResult]:
    """The studies a resident keeps loaded (made at the first load)."""
    from app.resident import KeptVolumes

    return KeptVolumes(lambda loaded: sum(v.voxels.nbytes for v in loaded.volumes))


def load_study(path: Path, modality: Modality | None) -> LoadResult:
    """``ingestion.load.load_path(path, modality)``; in a resident, kept loaded between
    commands until a file under ``path`` changes (a reader's clicks on one study)."""
    from ingestion.load import load_path

    variant = "" if modality is None else str(modality)
    return _kept_volumes().get(path, variant, lambda: load_path(path, modality))


def load_measurer(model_dir: Path | None) -> Measurer:
    """The checkpoint at ``model_dir`` (the demo model without one) as the app measures with
    it, or exit 2 saying why."""
    return load_checkpoint(model_dir)


def load_checkpoint(model_dir: Path | None, *, calibrated: bool = True) -> CheckpointMeasurer:
    """The checkpoint at ``model_dir`` (the demo model without one), or exit 2 saying why;
    ``calibrated=False`` leaves its ``calibrate`` stage out (raw values, nothing refused). What
    ``calibrate`` needs beyond measuring (its stages, its trace, its settings)."""
    from ingestion.errors import ModelError
    from model.measurer.infer import CheckpointMeasurer

    directory = checkpoint_dir(model_dir)

    def load() -> CheckpointMeasurer:
        try:
            measurer = CheckpointMeasurer.load(directory)
        except ModelError as error:
            raise model_error(error) from None
        if not calibrated:
            measurer.stages = tuple(s for s in measurer.stages if s.name != "calibrate")
        return measurer

    return _kept().get(directory, calibrated, load)  # loaded once in a resident


def deferred_measurer(model_dir: Path | None) -> DeferredMeasurer:
    """The checkpoint at ``model_dir`` (the demo model without one) as an
    ``app.batch.measure.DeferredMeasurer``: its settings read and its files hashed now (exit 2
    saying why when it is not a checkpoint), its weights loaded when it first measures."""
    from app.batch.measure import DeferredMeasurer
    from ingestion.errors import ModelError

    directory = checkpoint_dir(model_dir)
    try:
        return DeferredMeasurer.of(directory)
    except ModelError as error:
        raise model_error(error) from None
