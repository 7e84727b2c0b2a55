"""``app.console.command_args``: a command's arguments as a user would type them again (what
``measure`` hands to a resident): a repeatable option once per value, in order, and not at all
when it is not given."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.testing import CliRunner

from app.console import command_args


def _typed_again(*argv: str) -> list[str]:
    said: list[list[str]] = []
    app = typer.Typer()

    @app.command()
    def measure(
        ctx: typer.Context,
        path: str,
        as_json: Annotated[bool, typer.Option("--json")] = False,
        at: Annotated[list[str] | None, typer.Option("--at")] = None,
    ) -> None:
        said.append(command_args(ctx))

    result = CliRunner().invoke(app, list(argv))
    assert result.exit_code == 0, result.output
    return said[0]


def test_a_repeatable_option_is_typed_once_per_value() -> None:
    assert _typed_again("s") == ["s"]
    again = _typed_again("s", "--at", "-1,2,3", "--json", "--at", "4, 5, 6")
    assert again == ["s", "--json", "--at", "-1,2,3", "--at", "4, 5, 6"]
    assert _typed_again(*again) == again  # what is handed over parses to the same command
