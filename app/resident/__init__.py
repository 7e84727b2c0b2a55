"""The resident: a process that keeps torch, transformers, MONAI and the model loaded, so that
``radcaliper measure`` starts at once.

A fresh ``measure`` spends most of its life importing (benchmarks/RESULTS.md: torch, transformers'
model classes and MONAI take about 3.9 s of 7.8 on 2 cores, for 2.3 s of inference). With
``radcaliper resident`` running, ``measure`` hands its command to it instead:

- The client sends its ``measure`` arguments, working folder, environment and umask, and whether
  its stdout and stderr are terminals (and their width), over a Unix socket in the data dir.
- The resident runs the same ``measure`` command in its own process, as if in the client's shell:
  that environment (so the same settings and database), that folder, that umask. Whatever the
  command writes is sent back as it is written, and the client exits with the command's status.
  Output, errors, exit statuses and what is stored are those of measuring in the client's own
  process (tested); only the time differs.
- One command at a time; others wait their turn.

Trust. The socket is in the data dir (owner only, ``app.files.owner_only_dir``; a data dir of
another user or that others may write is refused on both sides) and is itself owner only; on
Linux each side also checks that the other runs as the same user (``SO_PEERCRED``). The
resident refuses a command when it runs other code than the client (the installed sources or
packages changed since it started) or speaks another protocol; the client then says so and
measures in its own process. A request must come whole within 10 s (a client that trickles it
in is dropped), and every field is checked (types, ranges: umask 0..0o777, an environment of text
without NUL, an existing folder, ...) before any is applied: a malformed one is refused, and the
resident's own environment, folder and umask are back after every command, whatever happened.
A model's files are looked at for every command (name, size, time and inode of each): a changed
checkpoint is loaded again, never measured with the old weights.

Patient identifiers: the resident's own log says when a command ran, for how long and its exit
status, never a path (a PACS folder name can be a patient's name); the command's own log lines go
to its client, at the client's level.

Modules: ``protocol`` (both sides: the socket, its messages, the code fingerprint), ``client``
(``forward``), ``request`` (a request's checks), ``server`` (``listen``, ``serve``) and ``kept``
(the models kept loaded). The resident runs the command it is given (``server.Command``): the
command line injects it, so this package never imports ``app.cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingestion._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from app.resident.client import forward, forward_once
    from app.resident.kept import KeptModels, KeptVolumes, keeping_models
    from app.resident.protocol import (
        PROTOCOL,
        SOCKET_NAME,
        ResidentError,
        code_fingerprint,
        peer_uid,
        receive_message,
        send_message,
        socket_path,
    )
    from app.resident.server import Command, Listener, listen, serve, serve_connection

__all__ = [
    "PROTOCOL",
    "SOCKET_NAME",
    "Command",
    "KeptModels",
    "KeptVolumes",
    "Listener",
    "ResidentError",
    "code_fingerprint",
    "forward",
    "forward_once",
    "keeping_models",
    "listen",
    "peer_uid",
    "receive_message",
    "send_message",
    "serve",
    "serve_connection",
    "socket_path",
]

# served lazily (PEP 562): 'measure' hands its command over with the client alone, without
# importing the server's side
if not TYPE_CHECKING:  # mypy sees the imports above, so a name not exported is an error
    __getattr__, __dir__ = _lazy_exports(
        __name__,
        {
            "app.resident.client": ("forward", "forward_once"),
            "app.resident.kept": ("KeptModels", "KeptVolumes", "keeping_models"),
            "app.resident.protocol": (
                "PROTOCOL",
                "SOCKET_NAME",
                "ResidentError",
                "code_fingerprint",
                "peer_uid",
                "receive_message",
                "send_message",
                "socket_path",
            ),
            "app.resident.server": ("Command", "Listener", "listen", "serve", "serve_connection"),
        },
        globals(),
    )
