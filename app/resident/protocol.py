"""Both sides of the resident's socket: where it listens, its messages (a JSON object after its
length), the peer's user and the code fingerprint that a resident and its client must share."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import sys
import sysconfig
import time
from collections.abc import Mapping
from pathlib import Path

from ingestion.errors import RadcaliperError

__all__ = [
    "PROTOCOL",
    "SOCKET_NAME",
    "ResidentError",
    "code_fingerprint",
    "current_umask",
    "is_socket",
    "peer_uid",
    "receive_message",
    "same_user",
    "send_message",
    "socket_path",
    "source_files",
]

logger = logging.getLogger(__name__)

PROTOCOL = 1
SOCKET_NAME = "resident.sock"
_MAX_FRAME = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_PACKAGES = ("app", "model", "ingestion", "db")


class ResidentError(RadcaliperError):
    """A resident cannot start here (the message says why and what to do)."""


# ---------------------------------------------------------------------------------------------
# both sides


def socket_path(data_dir: Path) -> Path:
    """Where the resident of this data dir listens."""
    return data_dir / SOCKET_NAME


def send_message(sock: socket.socket, message: Mapping[str, object]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _receive_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes | None:
    chunks, left = [], size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the deadline passed")
            sock.settimeout(remaining)
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive_message(
    sock: socket.socket, *, deadline: float | None = None
) -> dict[str, object] | None:
    """The next message (a JSON object after its length, 4 bytes big-endian), or None when
    the other side closed or sent something that is not one. With ``deadline`` (a
    ``time.monotonic()`` value) the whole message must have come by then: ``TimeoutError``
    otherwise, however the bytes trickle in."""
    header = _receive_exactly(sock, _HEADER.size, deadline)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > _MAX_FRAME:
        return None
    data = _receive_exactly(sock, size, deadline)
    if data is None:
        return None
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
        return None
    return message if isinstance(message, dict) else None


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end of a connected Unix socket (None where the
    system does not say: not Linux)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    credentials = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return int(uid)


def same_user(sock: socket.socket) -> bool:
    uid = peer_uid(sock)
    return uid is None or uid == os.geteuid()


def source_files() -> list[Path]:
    """radcaliper's ``.py`` files (its packages under the folder that holds ``app/``)."""
    root = Path(__file__).resolve().parents[2]  # app/resident/protocol.py -> the sources' root
    return [path for package in _PACKAGES for path in sorted((root / package).rglob("*.py"))]


def code_fingerprint() -> str:
    """What the process runs: the interpreter, radcaliper's sources (name, size and time of every
    ``.py`` file of its packages, :func:`source_files`) and the time the installed packages'
    folder last changed (an install or upgrade). A resident serves only clients with its own
    fingerprint."""
    digest = hashlib.sha256(sys.executable.encode())
    root = Path(__file__).resolve().parents[2]
    for path in source_files():
        info = path.stat()
        digest.update(f"{path.relative_to(root)}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    with contextlib.suppress(OSError):
        digest.update(str(Path(sysconfig.get_paths()["purelib"]).stat().st_mtime_ns).encode())
    return digest.hexdigest()


def is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def current_umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
