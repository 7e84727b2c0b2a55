"""Logging set-up for the command line: one handler on stderr, level from settings.

Library code only calls ``logging.getLogger(__name__)``; this is the one place that decides
where records go. Log records never carry patient identifiers: modules log counts, UIDs of
series at most, and file paths only at DEBUG level.
"""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler

__all__ = ["configure_logging"]


def configure_logging(level: str) -> None:
    """Send radcaliper's log records to stderr at ``level`` (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_radcaliper", False):
            root.removeHandler(handler)
    handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
    handler._radcaliper = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("pydicom", "nibabel", "PIL"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    # MONAI says at import, as a warning, that NVIDIA's optional GPU JPEG decoder is absent:
    # nothing a user can or needs to act on (pydicom's decoders read every file)
    logging.getLogger("monai.data.nvimgcodec_pydicom_plugin").setLevel(logging.ERROR)
