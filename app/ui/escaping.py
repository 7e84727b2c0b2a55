"""Text from outside (user names, model names, identifiers from the database or a request)
shown in the UI's Markdown as the characters it is: :func:`markdown_text`."""

from __future__ import annotations

import re

from app.console import printable

__all__ = ["markdown_text"]

# ASCII punctuation with a meaning in Markdown, HTML or Gradio's LaTeX ($$ ... $$)
_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~&$=:\"'])")


def markdown_text(value: object) -> str:
    """``value`` for a Markdown component: every special character backslash-escaped (no link,
    image, emphasis or HTML can come from it), control characters shown as escapes."""
    return _SPECIAL.sub(r"\\\1", printable(value))
