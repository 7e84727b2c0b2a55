"""The resident's side: listen at the data dir's socket and answer clients one at a time,
running each one's ``measure`` as in its own shell (its environment, folder and umask) with the
command the command line injects (:data:`Command`), its output relayed as it is written."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from app.resident.kept import serving
from app.resident.protocol import (
    PROTOCOL,
    ResidentError,
    code_fingerprint,
    current_umask,
    is_socket,
    peer_uid,
    receive_message,
    same_user,
    send_message,
    socket_path,
)
from app.resident.request import Malformed, Request, is_int, parsed_request
from app.threads import CpuTimes, cpu_times

__all__ = ["Command", "Listener", "listen", "serve", "serve_connection"]

logger = logging.getLogger(__name__)

Command = Callable[[list[str]], int]
"""Runs ``radcaliper ARGV`` in this process and returns its exit status (the command line
injects it: ``app.cli.resident``)."""

_REQUEST_DEADLINE_S = 10.0  # for a client's whole request, however it trickles in
_SOCKET_PATH_MAX = 107  # sun_path's size on Linux, less its terminating NUL


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
    if is_socket(path):
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


@contextlib.contextmanager
def _as_client(request: Request) -> Iterator[None]:
    """This process with the client's environment, working folder and umask inside; with
    ``COLUMNS`` set to the client's stderr width (the log's console takes it from there). Its
    own are back after, whatever happened, also when one could not be taken (``OSError``)."""
    saved_env, saved_cwd, saved_umask = dict(os.environ), os.getcwd(), current_umask()
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


def _answer(
    conn: socket.socket, message: Mapping[str, object], code: str, since: CpuTimes, run: Command
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
        request = parsed_request(message)
    except Malformed as exc:
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
        status = run(argv)
    send_message(conn, {"exit": status, "pid": os.getpid()})
    return status


def serve(
    listener: Listener,
    *,
    idle_exit_s: float | None,
    run: Command,
) -> None:
    """Answer clients one at a time, each with ``run``, until stopped (SIGINT, SIGTERM: after
    the command it runs) or idle for ``idle_exit_s`` seconds (None: never)."""
    with serving():
        _serve_until_stopped(listener, idle_exit_s, run)


def _serve_until_stopped(listener: Listener, idle_exit_s: float | None, run: Command) -> None:
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
                serve_connection(conn, code, since=previous, run=run)
            previous, latest = latest, cpu_times()
            idle_since = time.monotonic()


def serve_connection(conn: socket.socket, code: str, *, since: CpuTimes, run: Command) -> None:
    """Answer the client on ``conn`` (the resident's side of one connection; ``code``: this
    process's :func:`code_fingerprint`). Its request must come whole within 10 s, however it
    trickles in, and every field is checked before any is applied (a malformed one is
    refused): nothing a client sends stops the resident or changes its own environment,
    folder or umask."""
    if not same_user(conn):
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
        status = _answer(conn, message, code, since, run)
    except OSError as exc:  # the client went away before the end
        logger.info("a client went away: %s", exc)
        return
    except Exception:  # a bug: this client gets nothing more, the next ones are served
        logger.exception("a command failed in the resident")
        return
    pid = message.get("pid") if is_int(message.get("pid")) else "?"
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
