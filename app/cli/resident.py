"""``radcaliper resident``: keep the libraries and the model loaded for ``radcaliper measure``
(``app.resident``; registered on the ``radcaliper`` app by ``app.cli.root``). The command the
resident runs for its clients is this command line's own (:func:`command_runner`), handed to
``app.resident.serve``."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import typer

from app.console import EXIT_NOTHING, EXIT_OK, err, safe, settings_of

if TYPE_CHECKING:
    from app.resident import Command

__all__ = ["RootCommand", "command_runner", "resident"]

logger = logging.getLogger(__name__)


class RootCommand(Protocol):
    """The part of the command line's root command the resident calls (typer's own click)."""

    def main(self, *, args: list[str], prog_name: str, standalone_mode: bool) -> object:
        """Run the command line on ``args``; without standalone mode it raises what it ends in."""
        ...


def command_runner(command: RootCommand) -> Command:
    """What the resident runs for a client: ``radcaliper ARGV`` on ``command`` (this command
    line's root) in this process; its exit status, as the command would exit in its own.

    Typer carries its own copy of click, so its usage errors are ``typer.TyperException`` s
    (with ``show`` and ``exit_code``), not ``click.ClickException``."""

    def run(argv: list[str]) -> int:
        try:
            status = command.main(args=argv, prog_name="radcaliper", standalone_mode=False)
        except typer.Exit as exc:
            return int(exc.exit_code)
        except typer.Abort:
            err.print("Aborted.")
            return 1
        except typer.TyperException as exc:  # a usage error: shown as the command would
            show = getattr(exc, "show", None)
            if callable(show):
                show()
            else:
                err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
            code = getattr(exc, "exit_code", 2)
            return code if isinstance(code, int) else 2
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        except Exception:  # a bug: the client gets one line, the resident's log the traceback
            logger.exception("measure failed in the resident")
            err.print("[red]error:[/red] measuring failed in the resident; see its log")
            return 1
        return status if isinstance(status, int) else 0

    return run


def resident(
    ctx: typer.Context,
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="The checkpoint to load now (default: the demo model); 'measure --model' "
            "with another one loads that one at its first command.",
        ),
    ] = None,
    idle_exit: Annotated[
        float,
        typer.Option(
            "--idle-exit",
            min=0,
            help="Stop after this many minutes without a command (0: never).",
        ),
    ] = 60.0,
) -> None:
    """Keep torch, transformers, MONAI and the model loaded, so that 'radcaliper measure' starts
    at once: while this runs, 'measure' (as the same user, with the same data dir) hands its
    command to it and prints what it answers.

    The command runs here as it would in the client's own process: with its environment (the
    same settings and database), its working folder and umask; the output, exit status and what
    is stored are the same. Commands run one at a time. A checkpoint whose files changed is
    loaded again; a client of other radcaliper code (an update since this started) is refused
    and measures in its own process. Ctrl-C or SIGTERM stops it after the command it runs.
    Listens at DATA_DIR/resident.sock (owner only; a data dir of another user, or one that
    others may write, is refused). 'measure --no-resident' never uses it.
    """
    from app.cli.loading import load_measurer
    from app.resident import ResidentError, keeping_models, listen, serve
    from ingestion.errors import ConfigurationError

    settings = settings_of(ctx)
    try:
        listener = listen(settings.data_dir)
    except (ResidentError, ConfigurationError) as exc:  # a data dir another user may change
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from None
    try:
        with keeping_models():
            measurer = load_measurer(model_dir)
            import ingestion.prepare  # noqa: F401  # MONAI, loaded now rather than at the first study
            from ingestion.load import load_path  # noqa: F401

            model = measurer.info
            label = " (NOT FOR CLINICAL USE)" if model.not_for_clinical_use else ""
            err.print(
                f"resident: pid {os.getpid()}, model {safe(model.name)} {safe(model.version)}"
                f"{label}, listening at {safe(listener.path)}; 'radcaliper measure' hands its "
                "commands here. Ctrl-C stops it.",
                highlight=False,
            )
            serve(
                listener,
                idle_exit_s=idle_exit * 60 if idle_exit > 0 else None,
                run=command_runner(ctx.find_root().command),
            )
    finally:
        listener.close()
    raise typer.Exit(EXIT_OK)
