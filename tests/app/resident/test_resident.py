"""``radcaliper resident`` (issue 26): ``measure`` hands its command to a resident process that
keeps the libraries and the model loaded, with the same output, exit status and stored result as
measuring in its own process; a client of other code is refused, a killed or missing resident
means measuring here, a second resident on the same socket is refused, SIGTERM stops it and
removes its socket. The resident and its clients are real processes on a real Unix socket."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.console import consoles_writing_to, err, out
from app.resident import (
    PROTOCOL,
    KeptModels,
    ResidentError,
    code_fingerprint,
    forward,
    keeping_models,
    listen,
    peer_uid,
    receive_message,
    send_message,
    socket_path,
)
from app.threads import command_started, cpu_times, started_at
from ingestion.phantoms import write_phantoms

runner = CliRunner()
_CLI = (sys.executable, "-m", "app.cli")


@dataclass
class Resident:
    process: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    cwd: Path
    env: dict[str, str]
    study: Path

    def measure(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_CLI, *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )


@pytest.fixture(scope="module")
def resident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resident]:
    root = tmp_path_factory.mktemp("resident")
    (study,) = write_phantoms(root / "studies", n=1, seed=2611)
    data_dir = root / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADCALIPER_")}
    env["RADCALIPER_DATA_DIR"] = str(data_dir)
    log = root / "resident.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*_CLI, "-v", "resident"], cwd=root, env=env, stdout=sink, stderr=sink
        )
    deadline = time.monotonic() + 300
    while "listening at" not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, "the resident did not start in 300 s"
        time.sleep(0.2)
    yield Resident(process, data_dir, log, root, env, study.relative_to(root))
    if process.poll() is None:
        process.kill()
        process.wait()


def test_measure_through_the_resident_is_measuring_here(resident: Resident) -> None:
    dicom = str(resident.study / "dicom")  # relative: the client's working folder counts
    handed = resident.measure("-v", "measure", dicom, "--json", "--no-store")
    assert handed.returncode == 0, handed.stderr
    assert "measured by the resident" in handed.stderr
    here = runner.invoke(
        app,
        ["measure", str(resident.cwd / dicom), "--json", "--no-store", "--no-resident"],
        env={"RADCALIPER_DATA_DIR": str(resident.data_dir)},
    )
    assert here.exit_code == 0, here.output
    assert json.loads(handed.stdout) == json.loads(here.stdout)

    table = resident.measure("measure", dicom, "--no-store")
    assert table.returncode == 0 and "NOT FOR CLINICAL USE" in table.stdout


def test_measure_at_points_through_the_resident_is_measuring_here(resident: Resident) -> None:
    truth = json.loads((resident.cwd / resident.study / "truth.json").read_text())
    corner = truth["geometry"]["origin_lps_mm"]  # a corner voxel: air
    points = [",".join(map(repr, f["center_lps_mm"])) for f in truth["findings"]]
    points.append(f"{corner[0]}, {corner[1]}, {corner[2]}")
    at = [part for point in points for part in ("--at", point)]  # negative numbers among them
    dicom = str(resident.study / "dicom")
    handed = resident.measure("-v", "measure", dicom, "--json", "--no-store", *at)
    assert handed.returncode == 0, handed.stderr
    assert "measured by the resident" in handed.stderr
    here = runner.invoke(
        app,
        ["measure", str(resident.cwd / dicom), "--json", "--no-store", "--no-resident", *at],
        env={"RADCALIPER_DATA_DIR": str(resident.data_dir)},
    )
    assert here.exit_code == 0, here.output
    answer = json.loads(handed.stdout)
    assert answer == json.loads(here.stdout)
    assert [c["at_lps_mm"] for c in answer["clicks"]] == [
        [float(v) for v in point.split(",")] for point in points
    ]
    refused = resident.measure("-v", "measure", dicom, "--at", "1,2")  # refused before handing
    assert refused.returncode == 2 and "'1,2' has 2 number(s)" in refused.stderr
    assert "measured by the resident" not in refused.stderr


def test_the_resident_stores_in_the_clients_database(resident: Resident) -> None:
    dicom = str(resident.study / "dicom")
    env = {**resident.env, "RADCALIPER_DATABASE_URL": "sqlite:///client.sqlite3"}
    stored = subprocess.run(
        [*_CLI, "-v", "measure", dicom],
        cwd=resident.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stored.returncode == 0, stored.stderr
    assert "measured by the resident" in stored.stderr and "stored as run 1" in stored.stderr
    assert (resident.cwd / "client.sqlite3").is_file()  # the client's folder, the client's URL
    again = runner.invoke(
        app,
        ["measure", str(resident.cwd / dicom), "--no-resident"],
        env={"RADCALIPER_DATABASE_URL": f"sqlite:///{resident.cwd / 'client.sqlite3'}"},
    )
    assert again.exit_code == 0, again.output
    assert "already stored as run 1" in again.stderr


def test_errors_through_the_resident_are_the_commands(
    resident: Resident, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = resident.measure("measure", "no-such-study")
    assert missing.returncode == 2
    assert "no usable CT series under no-such-study" in missing.stderr
    not_a_model = resident.measure(
        "measure", str(resident.study / "dicom"), "--model", str(resident.cwd), "--no-store"
    )
    assert not_a_model.returncode == 2 and "radcaliper.json is missing" in not_a_model.stderr
    no_folder = resident.measure(
        "measure", str(resident.study / "dicom"), "--model", "no-such-model", "--no-store"
    )
    monkeypatch.chdir(resident.cwd)  # the same folder, the same message
    here = runner.invoke(
        app,
        [
            "measure",
            str(resident.study / "dicom"),
            "--model",
            "no-such-model",
            "--no-store",
            "--no-resident",
        ],
        env={"RADCALIPER_DATA_DIR": str(resident.data_dir)},
    )
    assert no_folder.returncode == here.exit_code == 2
    assert " ".join(no_folder.stderr.split()) == " ".join(here.stderr.split())
    assert "Traceback" not in missing.stderr + not_a_model.stderr + no_folder.stderr


def test_a_second_resident_on_the_socket_is_refused(resident: Resident) -> None:
    second = resident.measure("resident")
    assert second.returncode == 2 and "already listens" in second.stderr


def test_a_resident_refuses_other_code_and_other_protocols(resident: Resident) -> None:
    for change, reason in (({"code": "0" * 64}, "other radcaliper code"), ({"protocol": 0}, "")):
        request = {
            "protocol": PROTOCOL,
            "code": code_fingerprint(),
            "args": ["x"],
            "verbosity": 0,
            "cwd": str(resident.cwd),
            "env": resident.env,
            "umask": 0o077,
            "terminals": {},
            **change,
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(socket_path(resident.data_dir)))
            send_message(sock, request)
            answer = receive_message(sock)
        assert answer is not None and "refused" in answer and reason in str(answer["refused"])


def test_a_client_that_never_asks_keeps_no_one_waiting(resident: Resident) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(socket_path(resident.data_dir)))  # and sends nothing
        handed = resident.measure("-v", "measure", "no-such-study")
    assert handed.returncode == 2 and "measured by the resident" in handed.stderr


def _request(resident: Resident, **change: object) -> dict[str, object]:
    """A request ``measure no-such-study`` would send, with ``change``."""
    return {
        "protocol": PROTOCOL,
        "code": code_fingerprint(),
        "pid": os.getpid(),
        "verbosity": 0,
        "args": ["no-such-study"],
        "cwd": str(resident.cwd),
        "env": resident.env,
        "umask": 0o022,
        "terminals": {"out_tty": False, "err_tty": False, "out": 80, "err": 80},
        **change,
    }


def _ask(resident: Resident, request: dict[str, object]) -> dict[str, object] | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(socket_path(resident.data_dir)))
        send_message(sock, request)
        return receive_message(sock)


def _own_state(pid: int) -> tuple[str, str]:
    """A process's working folder and umask, as the system sees them."""
    status = Path(f"/proc/{pid}/status").read_text()
    umask = next(line for line in status.splitlines() if line.startswith("Umask:"))
    return os.readlink(f"/proc/{pid}/cwd"), umask


def test_a_malformed_request_is_refused_and_the_resident_goes_on(
    resident: Resident, tmp_path: Path
) -> None:
    """Issue 41, item 6: each field is checked before any is applied; the resident answers,
    keeps running, its folder and umask as they were, and serves the next command."""
    before = _own_state(resident.process.pid)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bad = [
        # applied in part by the old resident (folder, umask, environment cleared), then refused
        ({"env": {"A=B": "x"}, "cwd": str(elsewhere), "umask": 0o002}, "env"),
        ({"umask": 2**40}, "umask"),  # OverflowError: the old resident died
        ({"umask": -1}, "umask"),
        ({"umask": 0o1000}, "umask"),
        ({"umask": True}, "umask"),
        ({"env": {**resident.env, "RADCALIPER_LOG_LEVEL": 1}}, "env"),
        ({"env": {"PATH": "a\0b"}}, "env"),
        ({"env": ["PATH"]}, "env"),
        ({"cwd": str(tmp_path / "no-such-folder"), "umask": 0o002}, "cwd"),
        ({"cwd": "relative"}, "cwd"),
        ({"args": ["no-such-study", 3]}, "args"),
        ({"args": "no-such-study"}, "args"),
        ({"verbosity": "2"}, "verbosity"),
        ({"terminals": {"out_tty": False, "err_tty": False, "out": 2**40, "err": 80}}, "width"),
        ({"terminals": {"out_tty": "yes", "err_tty": False, "out": 80, "err": 80}}, "tty"),
        ({"pid": "me"}, "pid"),
    ]
    for change, field in bad:
        answer = _ask(resident, _request(resident, **change))
        assert resident.process.poll() is None, (change, resident.log.read_text())
        assert answer is not None and "refused" in answer, (change, answer)
        assert field in str(answer["refused"]), (change, answer)
        assert _own_state(resident.process.pid) == before, change
    nested = b"[" * 100_000 + b"]" * 100_000  # deeper than json.loads can go
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(socket_path(resident.data_dir)))
        sock.sendall(len(nested).to_bytes(4, "big") + nested)
        assert sock.recv(1) == b""  # dropped
    assert resident.process.poll() is None, resident.log.read_text()
    good = resident.measure("-v", "measure", "no-such-study")
    assert good.returncode == 2 and "measured by the resident" in good.stderr, good.stderr
    assert _own_state(resident.process.pid) == before


def _never_run(argv: list[str]) -> int:
    raise AssertionError(f"a refused request ran {argv}")


def test_a_refused_request_leaves_the_environment_folder_and_umask_as_they_were(
    tmp_path: Path,
) -> None:
    """The same in this process (its environment can be read): the resident's side of one
    connection, on a real socket pair."""
    from app.resident import serve_connection

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_umask = os.umask(0o022)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        for change in ({"env": {"A=B": "x"}}, {"env": {"PATH": 1}}, {"umask": 2**40}):
            request = {
                "protocol": PROTOCOL,
                "code": code_fingerprint(),
                "pid": os.getpid(),
                "verbosity": 0,
                "args": ["no-such-study"],
                "cwd": str(elsewhere),
                "env": {"ONLY": "this"},
                "umask": 0o002,
                "terminals": {"out_tty": False, "err_tty": False, "out": 80, "err": 80},
                **change,
            }
            client, server = socket.socketpair(socket.AF_UNIX)
            with client, server:
                send_message(client, request)
                serve_connection(server, code_fingerprint(), since=cpu_times(), run=_never_run)
                answer = receive_message(client)
            assert answer is not None and "refused" in answer, (change, answer)
            assert dict(os.environ) == saved_env, change
            assert os.getcwd() == saved_cwd, change
            mask = os.umask(0o022)
            assert mask == 0o022, change
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        os.umask(saved_umask)


def test_a_client_that_trickles_its_request_is_dropped_at_the_deadline(
    resident: Resident,
) -> None:
    """One byte every 2 s never waits 10 s for a read; the request as a whole has 10 s."""
    data = json.dumps(_request(resident)).encode()
    payload = len(data).to_bytes(4, "big") + data
    dropped: list[float] = []

    def trickle() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(socket_path(resident.data_dir)))
            began = time.monotonic()
            for byte in payload:
                try:
                    sock.send(bytes([byte]))
                    readable, _, _ = select.select([sock], [], [], 2.0)
                    if readable and sock.recv(1) == b"":
                        break  # the resident closed this connection
                except OSError:
                    break
                if time.monotonic() - began > 60:
                    break
            dropped.append(time.monotonic() - began)

    trickler = threading.Thread(target=trickle)
    trickler.start()
    time.sleep(1.0)  # the trickler is the resident's client now
    began = time.monotonic()
    served = resident.measure("-v", "measure", "no-such-study")
    waited = time.monotonic() - began
    trickler.join()
    assert served.returncode == 2 and "measured by the resident" in served.stderr
    assert dropped[0] < 10 + 4, dropped
    assert waited < 10 + 20, waited


def test_sigterm_stops_the_resident_and_removes_its_socket(resident: Resident) -> None:
    # the module's last test: the fixture's resident stops here
    path = socket_path(resident.data_dir)
    assert path.exists()
    resident.process.send_signal(signal.SIGTERM)
    assert resident.process.wait(timeout=30) == 0, resident.log.read_text(errors="replace")
    assert not path.exists()
    assert forward(resident.data_dir, ["x"]) is None  # no resident: measure here


def test_a_killed_resident_means_measuring_here(tmp_path: Path) -> None:
    # a socket file whose process is gone
    listener = listen(tmp_path)
    listener.sock.close()
    assert forward(tmp_path, ["x"]) is None
    # a resident that dies while it measures
    listener = listen(tmp_path)  # replaces the dead one's socket

    def die_at_the_first_command() -> None:
        conn, _ = listener.sock.accept()
        with conn:
            receive_message(conn)

    dying = threading.Thread(target=die_at_the_first_command)
    dying.start()
    stderr = io.StringIO()
    with consoles_writing_to(io.StringIO(), stderr, 200, 200):
        assert forward(tmp_path, ["x"]) is None
    dying.join()
    listener.close()
    assert "stopped while measuring; measuring in this process" in stderr.getvalue()
    assert not socket_path(tmp_path).exists()


def test_the_socket_is_the_owners_only(tmp_path: Path) -> None:
    listener = listen(tmp_path / "data")
    try:
        assert (socket_path(tmp_path / "data").stat().st_mode & 0o777) == 0o600
        assert ((tmp_path / "data").stat().st_mode & 0o777) == 0o700
        left, right = socket.socketpair(socket.AF_UNIX)
        with left, right:
            assert peer_uid(left) in (None, os.geteuid())
    finally:
        listener.close()
    with pytest.raises(ResidentError, match="too long for a Unix socket"):
        listen(tmp_path / ("d" * 120))


def test_kept_models_are_loaded_again_when_their_files_change(tmp_path: Path) -> None:
    (tmp_path / "weights").write_bytes(b"1")
    loads: list[int] = []
    kept_model = KeptModels[int]().get

    def load() -> int:
        loads.append(1)
        return len(loads)

    assert kept_model(tmp_path, True, load) == 1 and kept_model(tmp_path, True, load) == 2
    with keeping_models():
        assert kept_model(tmp_path, True, load) == 3
        assert kept_model(tmp_path, True, load) == 3  # kept
        assert kept_model(tmp_path, False, load) == 4  # the other variant
        (tmp_path / "weights").write_bytes(b"22")  # another size
        assert kept_model(tmp_path, True, load) == 5
        (tmp_path / "more").write_bytes(b"")  # a file added
        assert kept_model(tmp_path, True, load) == 6
        (tmp_path / "click").mkdir()  # a click model's folder
        (tmp_path / "click" / "weights").write_bytes(b"1")
        assert kept_model(tmp_path, True, load) == 7
        (tmp_path / "click" / "weights").write_bytes(b"22")  # changed inside it
        assert kept_model(tmp_path, True, load) == 8
        (tmp_path / "train_state").mkdir()  # training state is not the model
        (tmp_path / "train_state" / "state.json").write_bytes(b"{}")
        assert kept_model(tmp_path, True, load) == 8
    assert kept_model(tmp_path, True, load) == 9  # forgotten after


def test_consoles_write_where_they_are_told_and_back() -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    with consoles_writing_to(stdout, stderr, 40, 60):
        out.print("to out")
        err.print("to err")
        assert (out.width, err.width) == (40, 60)
    assert stdout.getvalue() == "to out\n" and stderr.getvalue() == "to err\n"
    assert out.file is sys.stdout and err.file is sys.stderr


def test_a_command_counts_other_work_from_where_it_is_told() -> None:
    sample = cpu_times()
    time.sleep(0.01)
    with started_at(sample):
        assert command_started() is sample
    assert command_started().wall > sample.wall


def test_usage_errors_in_the_resident_exit_as_the_command_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Typer carries its own click: a usage error the resident meets is shown and exits 2 (as
    in the client's own process), not reported as a failure of the resident."""
    from typer.main import get_command

    from app.cli.resident import command_runner

    run = command_runner(get_command(app))
    assert run(["measure", "--no-such-option"]) == 2
    shown = capsys.readouterr()
    assert "No such option" in shown.out + shown.err
    assert "failed in the resident" not in shown.out + shown.err
    assert run(["measure", "--help"]) == 0
    assert "Usage" in capsys.readouterr().out
