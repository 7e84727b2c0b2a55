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

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point: run the CLI and translate radcaliper errors."""
    from app.cli.root import main as _main

    _main()


if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, {"app.cli.root": ("app",)}, globals())
