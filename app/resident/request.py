"""A client's request as the resident reads it: every field checked (types, ranges) before any
is applied; a malformed one is refused naming the field."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

__all__ = ["Malformed", "Request", "is_int", "parsed_request"]

_MAX_WIDTH = 10_000  # the widest terminal a client may say it has
_MAX_VERBOSITY = 16


class Malformed(ValueError):
    """A request whose field has the wrong type or an impossible value (the message names the
    field); refused before anything of it is applied."""


@dataclass(frozen=True)
class Request:
    """A client's command, every field checked (:func:`parsed_request`)."""

    pid: int
    verbosity: int
    args: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    umask: int
    out_tty: bool
    err_tty: bool
    out_width: int
    err_width: int


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _no_nul(value: str) -> bool:
    return "\0" not in value


def parsed_request(message: Mapping[str, object]) -> Request:
    """The request in ``message``; ``Malformed`` naming the first field whose
    type or value is wrong (what a client of this code never sends)."""

    def bad(field: str, why: str) -> Malformed:
        return Malformed(f"a malformed request: {field} {why}")

    pid, verbosity, args = message.get("pid"), message.get("verbosity"), message.get("args")
    cwd, env, umask = message.get("cwd"), message.get("env"), message.get("umask")
    terminals = message.get("terminals")
    if not is_int(pid) or not 0 <= cast(int, pid) < 2**31:
        raise bad("pid", "is not a process id")
    if not is_int(verbosity) or not 0 <= cast(int, verbosity) <= _MAX_VERBOSITY:
        raise bad("verbosity", f"is not a whole number from 0 to {_MAX_VERBOSITY}")
    if not isinstance(args, list) or not all(isinstance(a, str) and _no_nul(a) for a in args):
        raise bad("args", "is not a list of text arguments (without NUL)")
    if not isinstance(cwd, str) or not _no_nul(cwd) or not os.path.isabs(cwd):
        raise bad("cwd", "is not an absolute folder path")
    if not os.path.isdir(cwd):
        raise bad("cwd", "is not an existing folder")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and _no_nul(k + v)
        for k, v in env.items()
    ):
        raise bad("env", "is not a map of variable names (without '=' or NUL) to text values")
    if not is_int(umask) or not 0 <= cast(int, umask) <= 0o777:
        raise bad("umask", "is not a file mode mask from 0 to 0o777")
    if not isinstance(terminals, dict):
        raise bad("terminals", "is not a map")
    ttys = [terminals.get("out_tty"), terminals.get("err_tty")]
    widths = [terminals.get("out"), terminals.get("err")]
    if not all(isinstance(t, bool) for t in ttys):
        raise bad("terminals", "out_tty / err_tty are not true or false")
    if not all(is_int(w) and 1 <= cast(int, w) <= _MAX_WIDTH for w in widths):
        raise bad("terminals", f"width is not a whole number from 1 to {_MAX_WIDTH}")
    return Request(
        pid=cast(int, pid),
        verbosity=cast(int, verbosity),
        args=tuple(cast(list[str], args)),
        cwd=cwd,
        env=cast(dict[str, str], env),
        umask=cast(int, umask),
        out_tty=cast(bool, ttys[0]),
        err_tty=cast(bool, ttys[1]),
        out_width=cast(int, widths[0]),
        err_width=cast(int, widths[1]),
    )
