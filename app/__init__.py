"""radcaliper's application layer: the command line, settings and (later) the review UI.

The only package that wires pipeline stages together, reads settings and talks to users.
``Settings`` is served lazily (PEP 562): ``radcaliper --help`` does not import pydantic-settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from app.settings import Settings

__all__ = ["Settings", "main"]


def main() -> None:
    """Run the ``radcaliper`` command line."""
    from app.cli import main as _main

    _main()


if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(__name__, {"app.settings": ("Settings",)}, globals())
