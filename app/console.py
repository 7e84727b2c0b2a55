r"""What every command shares: the output consoles, exit codes, the settings in the context,
the acting user's name for the audit log, and how text from outside is printed safely.

Text that radcaliper did not write itself (user names, audit actors and details, reasons, file
names, DICOM descriptions, error messages quoting them) goes through :func:`safe` before it is
put into a line or table printed with rich markup: its markup is escaped (a stored name
``[reverse]root[/reverse]`` prints as those characters) and its control characters (ESC
sequences, carriage returns, bell, bidirectional overrides, ...) are shown as escapes
(``\x1b``, ``\u202e``) instead of reaching the terminal. Both consoles also replace control
characters in whatever they render, as a second line of defence, and never turn ``:name:``
into emoji.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

if TYPE_CHECKING:
    from app.settings import Settings

__all__ = [
    "EXIT_NOTHING",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "cli_actor",
    "command_args",
    "command_line",
    "consoles_writing_to",
    "err",
    "out",
    "printable",
    "safe",
    "settings_of",
]

# C0 and C1 control characters, DEL, and the bidirectional formatting characters that can make
# a terminal show text in another order than it is stored (U+061C, U+200E/F, U+202A-E, U+2066-9)
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# the same without newline and tab: the consoles keep those in the text they render
_RENDERED_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(value: Any) -> str:
    r"""``value`` as one line of plain text: control characters (newline and tab too) shown as
    escapes (``\x1b``, ``\x0a``, ``\u202e``); None is the empty string."""
    if value is None:
        return ""
    return _CONTROLS.sub(_escaped, str(value))


def safe(value: Any) -> str:
    """``value`` ready to go into text printed with rich markup: :func:`printable`, with its
    markup escaped."""
    return escape(printable(value))


class _SafeConsole(Console):
    """A rich console that never passes control characters of the text it renders to the
    terminal (newline and tab excepted), whatever the caller forgot to escape."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(_RENDERED_CONTROLS.sub(_escaped, text), **kwargs)


_OPTIONS: dict[str, Any] = {"soft_wrap": True, "emoji": False}
out = _SafeConsole(**_OPTIONS)
err = _SafeConsole(stderr=True, **_OPTIONS)


@contextlib.contextmanager
def consoles_writing_to(
    stdout: IO[str], stderr: IO[str], out_width: int | None, err_width: int | None
) -> Iterator[None]:
    """:data:`out` and :data:`err` write to these streams inside, each set up as rich sets up a
    console for its stream (a terminal or not, colours from the environment's ``TERM``,
    ``NO_COLOR``, ``FORCE_COLOR``; the width when given), and for ``sys.stdout`` and
    ``sys.stderr`` again after. For ``app.resident``, which writes a client's output. Modules
    hold the two consoles by name, so they are set up again in place."""
    _SafeConsole.__init__(out, file=stdout, width=out_width, **_OPTIONS)
    _SafeConsole.__init__(err, file=stderr, width=err_width, **_OPTIONS)
    try:
        yield
    finally:
        _SafeConsole.__init__(out, **_OPTIONS)
        _SafeConsole.__init__(err, stderr=True, **_OPTIONS)


EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_NOTHING = 2


def settings_of(ctx: typer.Context) -> Settings:
    """The Settings the main callback put in the context (the root context's object)."""
    from app.settings import Settings

    settings = ctx.find_root().obj
    if not isinstance(settings, Settings):  # pragma: no cover - set by the callback
        raise RuntimeError("settings not initialised")
    return settings


def cli_actor() -> str:
    """The audit log's actor for command-line actions: ``cli:<name>`` of the user the process
    runs as (its real uid), ``cli:uid=<number>`` when that uid has no name (containers). Never
    ``$USER`` or ``$LOGNAME``, which anyone can set to someone else's name."""
    uid = os.getuid()
    try:
        return f"cli:{pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"cli:uid={uid}"


def command_args(ctx: typer.Context) -> list[str]:
    """The command's arguments as a user would type them again: every argument, and every
    option that differs from its default (the values as strings; a repeatable option once per
    value)."""
    parts: list[str] = []
    for param in ctx.command.params:  # typer's own click: duck-typed, not isinstance
        value = ctx.params.get(param.name or "")
        kind = getattr(param, "param_type_name", "")
        if kind == "argument":
            parts.append(str(value))
        elif kind == "option" and getattr(param, "multiple", False):
            flag = max(param.opts, key=len)
            for item in value or ():
                parts += [flag, str(item)]
        elif kind == "option" and value != param.default and value is not None:
            flag = max(param.opts, key=len)
            if getattr(param, "is_flag", False):
                if value:
                    parts.append(flag)
                elif param.secondary_opts:
                    parts.append(max(param.secondary_opts, key=len))
            else:
                parts += [flag, str(value)]
    return parts


def command_line(ctx: typer.Context) -> str:
    """The command as a user would type it again: its path, then :func:`command_args` (for
    provenance in checkpoints and results)."""
    return " ".join([ctx.command_path, *command_args(ctx)])
