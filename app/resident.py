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
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import signal
import socket
import stat
import struct
import sys
import sysconfig
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar, cast

from app.threads import CpuTimes, cpu_times
from db.private_paths import check_private_path
from ingestion.errors import RadcaliperError

__all__ = [
    "PROTOCOL",
    "SOCKET_NAME",
    "Listener",
    "ResidentError",
    "code_fingerprint",
    "forward",
    "keeping_models",
    "kept_model",
    "listen",
    "peer_uid",
    "receive_message",
    "send_message",
    "serve",
    "serve_connection",
    "socket_path",
]

logger = logging.getLogger(__name__)

PROTOCOL = 1
SOCKET_NAME = "resident.sock"
_MAX_FRAME = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_KEPT_MODELS = 2  # models a resident keeps loaded at most (the least recently used goes)
_REQUEST_DEADLINE_S = 10.0  # for a client's whole request, however it trickles in
_MAX_WIDTH = 10_000  # the widest terminal a client may say it has
_MAX_VERBOSITY = 16
_SOCKET_PATH_MAX = 107  # sun_path's size on Linux, less its terminating NUL
_PACKAGES = ("app", "model", "ingestion", "db")

T = TypeVar("T")


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


def _same_user(sock: socket.socket) -> bool:
    uid = peer_uid(sock)
    return uid is None or uid == os.geteuid()


def code_fingerprint() -> str:
    """What the process runs: the interpreter, radcaliper's sources (name, size and time of every
    ``.py`` file of its packages) and the time the installed packages' folder last changed (an
    install or upgrade). A resident serves only clients with its own fingerprint."""
    digest = hashlib.sha256(sys.executable.encode())
    root = Path(__file__).resolve().parent.parent
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            info = path.stat()
            digest.update(f"{path.relative_to(root)}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    with contextlib.suppress(OSError):
        digest.update(str(Path(sysconfig.get_paths()["purelib"]).stat().st_mtime_ns).encode())
    return digest.hexdigest()


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# the client: radcaliper measure


def forward(data_dir: Path, args: list[str], *, verbosity: int = 0) -> int | None:
    """Run ``radcaliper measure ARGS`` in the resident of ``data_dir`` when one listens: its
    output is written here as it comes, and its exit status returned. None when there is no
    resident, or it refused (a warning says why): measure in this process then.

    Raises:
        ConfigurationError: the data dir (the socket's folder) belongs to another user, or
            others may change it (``db.private_paths``).
    """
    if _serving:
        return None
    check_private_path(data_dir, "data dir")  # the socket folder: ours, nobody else's
    path = socket_path(data_dir)
    if not _is_socket(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            sock.settimeout(5.0)
            sock.connect(str(path))
        except OSError as exc:  # a socket left by a resident that was killed
            logger.info("no resident answers at %s (%s): measuring in this process", path, exc)
            return None
        if not _same_user(sock):
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
            "umask": _umask(),
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


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


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


# ---------------------------------------------------------------------------------------------
# the resident


_serving = False  # True in a resident: its own measure never forwards
_kept: OrderedDict[tuple[Path, bool], tuple[tuple[tuple[str, int, int, int], ...], object]]
_kept = OrderedDict()
_keeping = False


@contextlib.contextmanager
def keeping_models() -> Iterator[None]:
    """:func:`kept_model` keeps what it loads inside (a resident; elsewhere each command loads
    its model once anyway); forgotten after."""
    global _keeping
    _keeping = True
    try:
        yield
    finally:
        _keeping = False
        _kept.clear()


def _files_signature(directory: Path) -> tuple[tuple[str, int, int, int], ...]:
    entries = []
    for path in sorted(directory.iterdir()):
        with contextlib.suppress(OSError):
            info = path.stat()
            entries.append((path.name, info.st_size, info.st_mtime_ns, info.st_ino))
    return tuple(entries)


def kept_model(directory: Path, variant: bool, load: Callable[[], T]) -> T:
    """``load()``'s model of ``directory`` (one of its two ``variant``\\ s), loaded again only
    when a file of the directory changed (name, size, time, inode), in a process that
    :func:`keeping_models`; elsewhere just ``load()``."""
    if not _keeping:
        return load()
    try:
        key, signature = (directory.resolve(), variant), _files_signature(directory)
    except OSError:  # not a folder: the loader says why, as it does outside a resident
        return load()
    kept = _kept.get(key)
    if kept is not None and kept[0] == signature:
        _kept.move_to_end(key)
        return cast(T, kept[1])
    if kept is not None:
        logger.info("the model's files changed: loading it again")
    model = load()
    _kept[key] = (signature, model)
    _kept.move_to_end(key)
    while len(_kept) > _KEPT_MODELS:
        _kept.popitem(last=False)
    return model


@dataclass
class Listener:
    """A resident's listening socket (:func:`listen`); :meth:`close` removes the socket file
    when it is still this one."""

    sock: socket.socket
    path: Path
    inode: int

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            if self.path.lstat().st_ino == self.inode:
                self.path.unlink()


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def listen(data_dir: Path) -> Listener:
    """Listen at the data dir's socket (created owner only). ``ResidentError`` when a resident
    already listens there, or the path is too long for a Unix socket; ``ConfigurationError``
    for a data dir that another user owns or may change (``app.files.owner_only_dir``)."""
    from app.files import owner_only_dir

    path = socket_path(data_dir)
    if len(os.fsencode(path)) > _SOCKET_PATH_MAX:
        raise ResidentError(
            f"{path} is too long for a Unix socket ({len(os.fsencode(path))} bytes, at most "
            f"{_SOCKET_PATH_MAX}): set RADCALIPER_DATA_DIR to a shorter folder"
        )
    owner_only_dir(data_dir)
    if _is_socket(path):
        if _answers(path):
            raise ResidentError(f"a resident already listens at {path}")
        path.unlink()  # left by a resident that was killed
    elif path.exists():
        raise ResidentError(f"{path} exists and is not a socket: move it away")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ResidentError(f"cannot listen at {path}: {exc.strerror or exc}") from exc
    finally:
        os.umask(mask)
    sock.listen(16)
    return Listener(sock, path, path.lstat().st_ino)


class _Relay(io.TextIOBase):
    """A text stream whose writes go to the client as ``{name: text}`` messages; it is a
    terminal when the client's stream is one. Once the client is gone, writes are dropped
    (the command still finishes: what it stores stays consistent)."""

    def __init__(self, sock: socket.socket, name: str, terminal: bool) -> None:
        super().__init__()
        self._sock, self._name, self._terminal = sock, name, terminal
        self.gone = False

    def isatty(self) -> bool:
        return self._terminal

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text and not self.gone:
            try:
                send_message(self._sock, {self._name: text})
            except OSError:
                self.gone = True
        return len(text)


class _Malformed(ValueError):
    """A request whose field has the wrong type or an impossible value (the message names the
    field); refused before anything of it is applied."""


@dataclass(frozen=True)
class _Request:
    """A client's command, every field checked (:func:`_parsed`)."""

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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _no_nul(value: str) -> bool:
    return "\0" not in value


def _parsed(message: Mapping[str, object]) -> _Request:
    """The request in ``message``; ``_Malformed`` naming the first field whose
    type or value is wrong (what a client of this code never sends)."""

    def bad(field: str, why: str) -> _Malformed:
        return _Malformed(f"a malformed request: {field} {why}")

    pid, verbosity, args = message.get("pid"), message.get("verbosity"), message.get("args")
    cwd, env, umask = message.get("cwd"), message.get("env"), message.get("umask")
    terminals = message.get("terminals")
    if not _is_int(pid) or not 0 <= cast(int, pid) < 2**31:
        raise bad("pid", "is not a process id")
    if not _is_int(verbosity) or not 0 <= cast(int, verbosity) <= _MAX_VERBOSITY:
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
    if not _is_int(umask) or not 0 <= cast(int, umask) <= 0o777:
        raise bad("umask", "is not a file mode mask from 0 to 0o777")
    if not isinstance(terminals, dict):
        raise bad("terminals", "is not a map")
    ttys = [terminals.get("out_tty"), terminals.get("err_tty")]
    widths = [terminals.get("out"), terminals.get("err")]
    if not all(isinstance(t, bool) for t in ttys):
        raise bad("terminals", "out_tty / err_tty are not true or false")
    if not all(_is_int(w) and 1 <= cast(int, w) <= _MAX_WIDTH for w in widths):
        raise bad("terminals", f"width is not a whole number from 1 to {_MAX_WIDTH}")
    return _Request(
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


@contextlib.contextmanager
def _as_client(request: _Request) -> Iterator[None]:
    """This process with the client's environment, working folder and umask inside; with
    ``COLUMNS`` set to the client's stderr width (the log's console takes it from there). Its
    own are back after, whatever happened, also when one could not be taken (``OSError``)."""
    saved_env, saved_cwd, saved_umask = dict(os.environ), os.getcwd(), _umask()
    try:
        os.chdir(request.cwd)  # OSError when it cannot be entered: refused
        os.umask(request.umask)
        os.environ.clear()
        os.environ.update(request.env)
        os.environ["COLUMNS"] = str(request.err_width)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.umask(saved_umask)
        os.chdir(saved_cwd)


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were, after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _client_threads(env: Mapping[str, str], default: int) -> int:
    """torch's default threads in the client's process: its ``OMP_NUM_THREADS``, else ours."""
    with contextlib.suppress(KeyError, ValueError):
        threads = int(env["OMP_NUM_THREADS"])
        if threads > 0:
            return min(threads, default)
    return default


def _invoke(argv: list[str]) -> int:
    """Run ``radcaliper ARGV`` in this process; its exit status."""
    import click
    import typer.main

    from app.cli import app
    from app.console import err

    command = typer.main.get_command(app)
    try:
        status = command.main(args=argv, prog_name="radcaliper", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.Abort:
        err.print("Aborted.")
        return 1
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except Exception:  # a bug: the client gets one line, the resident's log the traceback
        logger.exception("measure failed in the resident")
        err.print("[red]error:[/red] measuring failed in the resident; see its log")
        return 1
    return status if isinstance(status, int) else 0


def _answer(
    conn: socket.socket, message: Mapping[str, object], code: str, since: CpuTimes
) -> int | None:
    """Run one client's command on ``conn``; its exit status (None: refused)."""
    if message.get("protocol") != PROTOCOL:
        send_message(conn, {"refused": "it speaks another protocol (another radcaliper version)"})
        return None
    if message.get("code") != code:
        send_message(
            conn,
            {
                "refused": "it runs other radcaliper code than this command (installed or "
                "changed since it started): restart it"
            },
        )
        return None
    try:
        request = _parsed(message)
    except _Malformed as exc:
        send_message(conn, {"refused": str(exc)})
        return None

    import torch

    from app.console import consoles_writing_to
    from app.threads import started_at, torch_threads

    out = _Relay(conn, "out", request.out_tty)
    err = _Relay(conn, "err", request.err_tty)
    argv = ["-v"] * min(request.verbosity, 2) + ["measure", *request.args]
    with contextlib.ExitStack() as inside:
        try:
            inside.enter_context(_as_client(request))
        except OSError as exc:
            reason = f"its working folder cannot be entered ({exc.strerror or exc})"
            send_message(conn, {"refused": reason})
            return None
        threads = _client_threads(os.environ, torch.get_num_threads())
        inside.enter_context(_logging_kept())  # the command sets up its own log
        inside.enter_context(contextlib.redirect_stdout(out))
        inside.enter_context(contextlib.redirect_stderr(err))
        inside.enter_context(
            consoles_writing_to(
                cast(IO[str], out), cast(IO[str], err), request.out_width, request.err_width
            )
        )
        inside.enter_context(started_at(since))
        inside.enter_context(torch_threads(threads))
        status = _invoke(argv)
    send_message(conn, {"exit": status, "pid": os.getpid()})
    return status


def serve(
    listener: Listener,
    *,
    idle_exit_s: float | None,
) -> None:
    """Answer clients one at a time until stopped (SIGINT, SIGTERM: after the command it runs)
    or idle for ``idle_exit_s`` seconds (None: never)."""
    global _serving
    _serving = True
    try:
        _serve_until_stopped(listener, idle_exit_s)
    finally:
        _serving = False


def _serve_until_stopped(listener: Listener, idle_exit_s: float | None) -> None:
    code = code_fingerprint()
    previous, latest = cpu_times(), cpu_times()
    idle_since = time.monotonic()
    listener.sock.settimeout(1.0)
    with _stopping_on_signals() as stop:
        while not stop.requested:
            try:
                conn, _ = listener.sock.accept()
            except TimeoutError:
                # other work's CPU use is counted over the last second or two before a command
                previous, latest = latest, cpu_times()
                if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                    logger.warning("idle for %g minutes: stopping", idle_exit_s / 60)
                    return
                continue
            with conn:
                serve_connection(conn, code, since=previous)
            previous, latest = latest, cpu_times()
            idle_since = time.monotonic()


def serve_connection(conn: socket.socket, code: str, *, since: CpuTimes) -> None:
    """Answer the client on ``conn`` (the resident's side of one connection; ``code``: this
    process's :func:`code_fingerprint`). Its request must come whole within 10 s, however it
    trickles in, and every field is checked before any is applied (a malformed one is
    refused): nothing a client sends stops the resident or changes its own environment,
    folder or umask."""
    if not _same_user(conn):
        logger.warning("refused a connection from another user (uid %s)", peer_uid(conn))
        return
    try:  # a client that never sends, or trickles, keeps no one waiting
        message = receive_message(conn, deadline=time.monotonic() + _REQUEST_DEADLINE_S)
    except TimeoutError:
        logger.warning(
            "dropped a client whose request did not come within %g s", _REQUEST_DEADLINE_S
        )
        return
    except OSError:
        message = None
    if message is None:  # a probe (another resident starting) or a client that went away
        return
    conn.settimeout(None)
    started = time.monotonic()
    try:
        status = _answer(conn, message, code, since)
    except OSError as exc:  # the client went away before the end
        logger.info("a client went away: %s", exc)
        return
    except Exception:  # a bug: this client gets nothing more, the next ones are served
        logger.exception("a command failed in the resident")
        return
    pid = message.get("pid") if _is_int(message.get("pid")) else "?"
    if status is None:
        logger.warning("refused a command from pid %s", pid)
        return
    logger.info("measured for pid %s in %.1f s: exit %d", pid, time.monotonic() - started, status)


class _Stop:
    """Set by SIGINT or SIGTERM: the resident stops after the command it runs (a second signal
    stops it at once; what the command stored is whole or nothing)."""

    requested = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        logger.warning("stopping (after the command it runs, if any)")


@contextlib.contextmanager
def _stopping_on_signals() -> Iterator[_Stop]:
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
