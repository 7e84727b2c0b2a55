"""What every command shares: the output consoles, exit codes, the settings in the context and
the acting user's name for the audit log."""

from __future__ import annotations

import getpass

import typer
from rich.console import Console

from app.settings import Settings

__all__ = [
    "EXIT_NOTHING",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "cli_actor",
    "command_line",
    "err",
    "out",
    "settings_of",
]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_NOTHING = 2


def settings_of(ctx: typer.Context) -> Settings:
    """The Settings the main callback put in the context (the root context's object)."""
    settings = ctx.find_root().obj
    if not isinstance(settings, Settings):  # pragma: no cover - set by the callback
        raise RuntimeError("settings not initialised")
    return settings


def cli_actor() -> str:
    """The audit log's actor for command-line actions: ``cli:<operating-system user>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name for this uid (containers)
        return "cli:unknown"


def command_line(ctx: typer.Context) -> str:
    """The command as a user would type it again: its path, then every argument and every
    option that differs from its default (for provenance in checkpoints and results)."""
    parts = [ctx.command_path]
    for param in ctx.command.params:  # typer's own click: duck-typed, not isinstance
        value = ctx.params.get(param.name or "")
        kind = getattr(param, "param_type_name", "")
        if kind == "argument":
            parts.append(str(value))
        elif kind == "option" and value != param.default and value is not None:
            flag = max(param.opts, key=len)
            if getattr(param, "is_flag", False):
                if value:
                    parts.append(flag)
                elif param.secondary_opts:
                    parts.append(max(param.secondary_opts, key=len))
            else:
                parts += [flag, str(value)]
    return " ".join(parts)
