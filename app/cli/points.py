"""``--at X,Y,Z``: a clicked point as text, checked without the command-line library (the
quick hand-off to a resident, ``app.cli.main``, reads it before Typer loads)."""

from __future__ import annotations

import math

__all__ = ["MAX_POINTS", "parsed_point", "points_problem"]

MAX_POINTS = 100  # --at points one command measures at most (about a minute on 2 CPU cores)

_POINT_HELP = "give three finite numbers X,Y,Z: a point in patient coordinates (LPS mm)"


def parsed_point(text: str) -> tuple[float, float, float]:
    """An ``--at`` value ``X,Y,Z`` (spaces around the numbers allowed) as a point; ``ValueError``
    saying what is wrong with it and what to give."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3:
        raise ValueError(f"{text!r} has {len(parts)} number(s); {_POINT_HELP}, e.g. -20.5,14,-60")
    values = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{text!r}: {part!r} is not a number; {_POINT_HELP}") from None
        if not math.isfinite(value):
            raise ValueError(f"{text!r}: {part!r} is not a finite number; {_POINT_HELP}")
        values.append(value)
    return values[0], values[1], values[2]


def points_problem(values: list[str]) -> str | None:
    """What is wrong with these ``--at`` values (more than ``MAX_POINTS``, or one that is not a
    point), or None: the one check of the command and of the quick hand-off."""
    if len(values) > MAX_POINTS:
        return (
            f"{len(values)} points; one command measures at most {MAX_POINTS}: "
            "split them over several commands"
        )
    for text in values:
        try:
            parsed_point(text)
        except ValueError as exc:
            return str(exc)
    return None
