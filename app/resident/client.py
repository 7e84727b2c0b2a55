"""The client of a resident: ``radcaliper measure`` hands its command to the resident of its data
dir and relays what it answers (``forward``)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from app.resident.kept import serving_here
from app.resident.protocol import (
    PROTOCOL,
    code_fingerprint,
    current_umask,
    is_socket,
    receive_message,
    same_user,
    send_message,
    socket_path,
)
from db.private_paths import check_private_path

__all__ = ["environment_data_dir", "forward", "forward_once"]

logger = logging.getLogger(__name__)


_tried = False  # this process already asked a resident (forward_once)


def environment_data_dir(environ: Mapping[str, str]) -> Path:
    """The data dir ``app.settings.Settings`` reads from ``environ`` (``RADCALIPER_DATA_DIR``,
    any case, as pydantic-settings reads it; else the user data dir), without loading pydantic:
    where the quick hand-off of ``app.cli.main`` looks for a resident."""
    from platformdirs import user_data_path

    for name, value in environ.items():
        if name.upper() == "RADCALIPER_DATA_DIR" and value:
            return Path(value)
    return user_data_path("radcaliper", appauthor=False)


def forward_once(data_dir: Path, args: list[str], *, verbosity: int = 0) -> int | None:
    """:func:`forward`, once per process: a client that already asked a resident
    (``app.cli.main``'s quick hand-off) and was told to measure here does not ask again, nor
    warn twice. With no resident to ask, or an error raised (the command reports it), it is
    left untried."""
    global _tried
    if _tried:
        return None
    asks = is_socket(socket_path(data_dir)) and not serving_here()  # else nothing to ask
    status = forward(data_dir, args, verbosity=verbosity)
    _tried = asks
    return status


def forward(data_dir: Path, args: list[str], *, verbosity: int = 0) -> int | None:
    """Run ``radcaliper measure ARGS`` in the resident of ``data_dir`` when one listens: its
    output is written here as it comes, and its exit status returned. None when there is no
    resident, or it refused (a warning says why): measure in this process then.

    Raises:
        ConfigurationError: the data dir (the socket's folder) belongs to another user, or
            others may change it (``db.private_paths``).
    """
    if serving_here():
        return None
    check_private_path(data_dir, "data dir")  # the socket folder: ours, nobody else's
    path = socket_path(data_dir)
    if not is_socket(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            sock.settimeout(5.0)
            sock.connect(str(path))
        except OSError as exc:  # a socket left by a resident that was killed
            logger.info("no resident answers at %s (%s): measuring in this process", path, exc)
            return None
        if not same_user(sock):
            logger.warning("%s belongs to another user's process: measuring in this process", path)
            return None
        sock.settimeout(None)
        request = {
            "protocol": PROTOCOL,
            "code": code_fingerprint(),
            "pid": os.getpid(),
            "verbosity": verbosity,
            "args": args,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "umask": current_umask(),
            "terminals": _terminals(),
        }
        try:
            send_message(sock, request)
            return _relay_answer(sock, path)
        except OSError as exc:
            _warn_measuring_here(f"the resident at {path} stopped answering ({exc})")
            return None


def _terminals() -> dict[str, object]:
    """Whether this process's stdout and stderr are terminals, and the widths rich gives them
    here (what the resident's consoles are set up with)."""
    from app.console import err, out

    return {
        "out_tty": out.is_terminal,
        "err_tty": err.is_terminal,
        "out": out.width,
        "err": err.width,
    }


def _relay_answer(sock: socket.socket, path: Path) -> int | None:
    started = time.monotonic()
    while True:
        message = receive_message(sock)
        if message is None:
            _warn_measuring_here(f"the resident at {path} stopped while measuring")
            return None
        if "refused" in message:
            _warn_measuring_here(f"the resident at {path} refused: {message['refused']}")
            return None
        if isinstance(text := message.get("out"), str):
            sys.stdout.write(text)
            sys.stdout.flush()
        elif isinstance(text := message.get("err"), str):
            sys.stderr.write(text)
            sys.stderr.flush()
        elif isinstance(status := message.get("exit"), int):
            logger.info(
                "measured by the resident (pid %s) in %.1f s",
                message.get("pid"),
                time.monotonic() - started,
            )
            return status


def _warn_measuring_here(why: str) -> None:
    from app.console import err, safe

    err.print(
        f"[yellow]warning:[/yellow] {safe(why)}; measuring in this process",
        highlight=False,
    )
