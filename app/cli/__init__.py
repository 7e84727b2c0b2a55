"""The ``radcaliper`` command line, one module per command group.

``app.cli.root`` builds the Typer app (``inspect``, ``phantoms``, ``export-sr`` and the
registration of the others); ``measure``, ``train`` (with ``export-model``), ``calibrate``,
``evaluate``, ``serve``, ``batch``, ``resident``, ``store`` (``db``, ``users``, ``audit``) and
``dataset`` hold their commands, ``loading`` what the model commands share. ``main`` is the
console script (``radcaliper = "app.cli:main"``); ``app`` (the Typer app) is served lazily
(PEP 562), so importing this package costs nothing until a command runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from app.cli.root import app

__all__ = ["app", "handed_to_resident", "main"]


def main() -> None:
    """Console-script entry point: run the CLI and translate radcaliper errors. A plain
    ``radcaliper [-v] measure ...`` goes to a running resident before the command-line library
    loads (:func:`handed_to_resident`)."""
    import sys

    status = handed_to_resident(sys.argv[1:])
    if status is not None:
        sys.exit(status)
    from app.cli.root import main as _main

    _main()


_VERBOSE = {"-v": 1, "-vv": 2, "-vvv": 3, "--verbose": 1}


def handed_to_resident(argv: list[str]) -> int | None:
    """Run ``radcaliper [-v ...] measure ARGS`` in the resident of this data dir, if one listens,
    without loading Typer, Rich's tables and the commands first (a click's answer is then as
    quick as the resident: ``measure --at``); its exit status. None (run the command line here,
    as usual) for anything else: another command, ``--help``, ``--no-resident``, an ``--at``
    value the command would refuse (it says why), a data dir it would refuse, or no resident.
    The settings are not read here (pydantic takes longer to load than a click to answer): the
    resident reads them from this environment, as the command would, and says what is wrong."""
    verbosity, i = 0, 0
    while i < len(argv) and argv[i] in _VERBOSE:
        verbosity += _VERBOSE[argv[i]]
        i += 1
    if i >= len(argv) or argv[i] != "measure":
        return None
    args = argv[i + 1 :]
    if any(a in ("--help", "--no-resident") for a in args) or not _points_plain(args):
        return None
    import os

    from app.resident.client import environment_data_dir, forward_once
    from ingestion.errors import RadcaliperError

    if verbosity:  # as the command line's root does
        from app.logs import configure_logging

        configure_logging("DEBUG" if verbosity > 1 else "INFO")
    try:
        return forward_once(environment_data_dir(os.environ), args, verbosity=verbosity)
    except RadcaliperError:  # a data dir others may change: the command says why
        return None


def _points_plain(args: list[str]) -> bool:
    """Every ``--at`` value is a point and there are not too many (what the command checks)."""
    from itertools import pairwise

    from app.cli.points import points_problem

    values = [b for a, b in pairwise(args) if a == "--at"]
    values += [a.removeprefix("--at=") for a in args if a.startswith("--at=")]
    return not (args and args[-1] == "--at") and points_problem(values) is None


if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, {"app.cli.root": ("app",)}, globals())
