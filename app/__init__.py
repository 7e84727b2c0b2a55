"""radcaliper's application layer: the command line, settings and (later) the review UI.

The only package that wires pipeline stages together, reads settings and talks to users.
"""

from app.settings import Settings

__all__ = ["Settings", "main"]


def main() -> None:
    """Run the ``radcaliper`` command line."""
    from app.cli import main as _main

    _main()
