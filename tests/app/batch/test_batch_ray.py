"""``radcaliper batch --engine ray`` (issue 25): the same batch on a Ray cluster.

- A Ray instance on this machine (2 CPUs) stores exactly the rows the local engine stores for a
  tree of phantom studies with corrupt files, scouts, reformats and duplicates mixed in, and
  writes the same report.
- A two-node cluster on this machine (``ray start --head`` and a second ``ray start
  --address``, both on 127.0.0.1) with PostgreSQL: an SQLite file is refused; a measuring worker
  killed mid-study loses and duplicates nothing; a driver killed half way resumes.
- Without Ray the engine says how to install it; the suite itself needs no Ray for the rest.

The batches run as separate processes, as a user runs them (Ray keeps global state in the
process that connects). ``ray stop`` at the end stops every Ray process of this user.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from app.batch.ray_engine import worker_url
from app.cli import app
from db.engine import Store
from db.models import Run
from ingestion.errors import ConfigurationError

from tests.support.batch import Tree, build_tree, stored_rows

REPOSITORY = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).with_name("ray"))
runner = CliRunner()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")
    return build_tree(tmp_path_factory.mktemp("pacs"), n=8)


def _report(path: Path) -> dict[str, Any]:
    """The report without what differs from run to run: times, folders, database ids."""
    report = json.loads(path.read_text())
    for key in ("seconds", "started_at", "work_dir"):
        report["summary"].pop(key)
    for study in report["studies"]:
        study.pop("seconds")
        study.pop("run_ids")
    return report


@pytest.fixture(scope="module")
def reference(
    tree: Tree, postgres_factory: Callable[[], Store], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, list[tuple[object, ...]]], dict[str, Any]]:
    """What the local engine stores (PostgreSQL) and reports for the tree."""
    store = postgres_factory()
    out = tmp_path_factory.mktemp("local")
    result = runner.invoke(
        app,
        [
            *("batch", str(tree.root), "--db", store.url, "--work", str(out / "work")),
            *("--workers", "1", "--report", str(out / "report")),
        ],
    )
    assert result.exit_code == 1, result.output  # the corrupt files
    return stored_rows(store), _report(out / "report.json")


def _command(tree: Tree, store: Store, work: Path, *options: str) -> list[str]:
    return [
        *(sys.executable, "-m", "app.cli", "-v", "batch", str(tree.root)),
        *("--db", store.url, "--work", str(work), "--engine", "ray", *options),
    ]


def _run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _batch(
    tree: Tree, store: Store, work: Path, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return _run(_command(tree, store, work, *options), env)


def _words(log: str) -> str:
    """The log's words one space apart (the log wraps long lines)."""
    return " ".join(log.split())


def _runs(store: Store) -> int:
    with store.reader() as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def test_a_local_ray_instance_stores_and_reports_what_the_local_engine_does(
    tree: Tree,
    reference: tuple[dict[str, list[tuple[object, ...]]], dict[str, Any]],
    postgres_factory: Callable[[], Store],
    tmp_path: Path,
) -> None:
    rows, report = reference
    store = postgres_factory()
    done = _batch(tree, store, tmp_path / "work", "--workers", "1", "--report", str(tmp_path / "r"))
    assert done.returncode == 1, done.stderr[-4000:]
    assert "Traceback" not in done.stderr and "PHANTOM-" not in done.stderr
    started = r"ray: 1 node\(s\), \d+ CPU\(s\), 0 GPU\(s\); 1 measuring worker"
    assert re.search(started, _words(done.stderr)), done.stderr[-4000:]
    n = len(tree.study_uids)
    assert f"{n} studies under {tree.root}: {n} stored" in done.stdout
    assert stored_rows(store) == rows
    assert _report(tmp_path / "r.json") == report


def test_joining_no_cluster_is_exit_2_with_the_reason(tree: Tree, tmp_path: Path) -> None:
    """``--address auto`` with no Ray cluster on this machine (the two-node one starts later)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = _run(
        [
            *(sys.executable, "-m", "app.cli", "batch", str(tree.root), "--engine", "ray"),
            *("--address", "auto", "--db", f"sqlite:///{tmp_path / 's.sqlite3'}"),
            *("--work", str(tmp_path / "work")),
        ],
        env,
    )
    assert done.returncode == 2, done.stderr[-4000:]
    assert "cannot join the Ray cluster at auto" in _words(done.stderr)
    assert "Traceback" not in done.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ray_batch(tmp_path: Path, address: str, *options: str) -> tuple[float, str, int]:
    """``batch --engine ray --address ADDRESS`` on an empty tree: seconds, stderr, status."""
    (tmp_path / "pacs").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    began = time.monotonic()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "app.cli", "batch", str(tmp_path / "pacs")),
            *("--engine", "ray", "--address", address, *options),
            *("--db", f"sqlite:///{tmp_path / 's.sqlite3'}", "--work", str(tmp_path / "work")),
        ],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # the old batch tried for over 4 minutes
        check=False,
    )
    return time.monotonic() - began, done.stderr, done.returncode


def test_joining_an_address_where_nothing_listens_ends_at_once(tmp_path: Path) -> None:
    """Issue 41, item 7: ``--address 127.0.0.1:1`` (nothing listens) hung for over 4 minutes."""
    port = _free_port()  # and closed again: nothing listens there
    seconds, stderr, status = _ray_batch(tmp_path, f"127.0.0.1:{port}")
    assert status == 2, stderr[-4000:]
    flat = _words(stderr)
    assert f"cannot join the Ray cluster at 127.0.0.1:{port}" in flat and "refused" in flat
    assert "Traceback" not in stderr
    assert seconds < 30, seconds  # the process's start-up included; Ray is never asked


def test_joining_an_address_that_does_not_answer_as_ray_times_out(tmp_path: Path) -> None:
    """Something takes the connection but is no Ray cluster (a database port given by
    mistake): the connection is given up after --connect-timeout seconds."""
    with socket.socket() as silent:
        silent.bind(("0.0.0.0", 0))  # Ray connects to this machine's address, not 127.0.0.1
        silent.listen(16)
        port = silent.getsockname()[1]
        seconds, stderr, status = _ray_batch(
            tmp_path, f"127.0.0.1:{port}", "--connect-timeout", "3"
        )
    assert status == 2, stderr[-4000:]
    flat = _words(stderr)
    assert f"cannot join the Ray cluster at 127.0.0.1:{port}" in flat
    assert "no Ray cluster answered within 3 s" in flat and "Traceback" not in stderr
    assert seconds < 3 + 25, seconds


def test_a_connect_timeout_must_be_a_positive_number(tmp_path: Path) -> None:
    for value in ("0", "-1", "inf", "nan"):
        done = runner.invoke(
            app,
            [
                *("batch", str(tmp_path), "--engine", "ray", "--address", "127.0.0.1:1"),
                *("--connect-timeout", value),
            ],
        )
        assert done.exit_code == 2 and "--connect-timeout" in done.output, (value, done.output)
        assert "No such option" not in done.output


@dataclass(frozen=True)
class Cluster:
    address: str
    env: dict[str, str]  # the environment that holds the cluster's token


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    """A Ray cluster of two nodes on 127.0.0.1 (2 CPUs each) with token authentication, as
    Ray's default is."""
    port = _free_port()
    base = Path(f"/tmp/rc-ray-{uuid.uuid4().hex[:6]}")  # short: Ray's socket paths are limited
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    common = (
        *("--node-ip-address=127.0.0.1", "--num-cpus=2", "--disable-usage-stats"),
        "--object-store-memory=500000000",
    )
    head = ("--head", f"--port={port}", f"--temp-dir={base}", "--include-dashboard=false")
    try:
        for role in (head, (f"--address=127.0.0.1:{port}",)):
            started = subprocess.run(
                [RAY, "start", *role, *common],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=False,
            )
            assert started.returncode == 0, started.stderr[-4000:]
        yield Cluster(f"127.0.0.1:{port}", env)
    finally:
        subprocess.run(
            [RAY, "stop", "--force"], capture_output=True, env=env, timeout=120, check=False
        )
        shutil.rmtree(base, ignore_errors=True)


def _measuring(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


def test_a_two_node_cluster_with_postgresql_survives_a_killed_worker_and_driver(
    tree: Tree,
    reference: tuple[dict[str, list[tuple[object, ...]]], dict[str, Any]],
    postgres_factory: Callable[[], Store],
    two_nodes: Cluster,
    tmp_path: Path,
) -> None:
    rows, _ = reference
    n = len(tree.study_uids)
    address = ("--address", two_nodes.address)
    env = two_nodes.env

    # an SQLite file cannot be written from the other node
    sqlite = tmp_path / "store.sqlite3"
    refused = _run(
        [
            *(sys.executable, "-m", "app.cli", "batch", str(tree.root)),
            *("--db", f"sqlite:///{sqlite}", "--work", str(tmp_path / "w0")),
            *("--engine", "ray", *address),
        ],
        env,
    )
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert "Ray cluster has 2 nodes" in _words(refused.stderr), refused.stderr[-4000:]
    assert "Traceback" not in refused.stderr

    # a measuring worker killed while it measures: retried, stored once, nothing lost
    store = postgres_factory()
    log = tmp_path / "killed-worker.log"
    with log.open("w") as output:
        report = ("--report", str(tmp_path / "r1"))
        process = subprocess.Popen(
            _command(tree, store, tmp_path / "w1", "--workers", "2", *address, *report),
            cwd=REPOSITORY,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        killed = None
        deadline = time.monotonic() + 300
        while killed is None and process.poll() is None and time.monotonic() < deadline:
            busy = _measuring("ray::MeasuringWorker.measure")
            if busy and _runs(store) >= 1:
                os.kill(busy[0], signal.SIGKILL)
                killed = busy[0]
            time.sleep(0.05)
        assert process.wait(timeout=600) == 1, log.read_text()[-4000:]
    assert killed is not None, "no worker was caught measuring"
    assert "ray: 2 node(s), 4 CPU(s), 0 GPU(s); 2 measuring worker(s)" in _words(log.read_text())
    summary = json.loads((tmp_path / "r1.json").read_text())["summary"]
    assert summary["studies"]["failed"] == 0
    assert summary["studies"]["stored"] + summary["studies"]["already_stored"] == n
    assert stored_rows(store) == rows

    # the driver killed half way; the same command again resumes
    store = postgres_factory()
    log = tmp_path / "killed-driver.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            _command(tree, store, tmp_path / "w2", "--workers", "2", *address),
            cwd=REPOSITORY,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while _runs(store) < n // 2:
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the batch did not get half way"
            time.sleep(0.05)
        process.kill()
        process.wait(timeout=60)
    stored_then = _runs(store)
    assert stored_then < n, "killed too late to test anything"
    report = ("--report", str(tmp_path / "r2"))
    resumed = _batch(tree, store, tmp_path / "w2", "--workers", "2", *address, *report, env=env)
    assert resumed.returncode == 1, resumed.stderr[-4000:]
    summary = json.loads((tmp_path / "r2.json").read_text())["summary"]
    assert summary["studies"]["failed"] == 0
    assert summary["studies"]["already_stored"] >= stored_then
    assert summary["studies"]["stored"] + summary["studies"]["already_stored"] == n
    assert stored_rows(store) == rows


def test_without_ray_the_engine_says_how_to_install_it(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['ray'] = None; from app.cli import main; "
        f"sys.argv = ['radcaliper', 'batch', {str(tmp_path)!r}, '--engine', 'ray']; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPOSITORY, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'radcaliper[ray]'" in done.stderr and "Traceback" not in done.stderr


def test_ray_options_belong_to_the_ray_engine(tmp_path: Path) -> None:
    done = runner.invoke(app, ["batch", str(tmp_path), "--address", "auto"])
    assert done.exit_code == 2
    assert "--address, --gpus-per-worker and --connect-timeout are options of --engine ray" in (
        done.stderr
    )
    done = runner.invoke(app, ["batch", str(tmp_path), "--engine", "ray", "--measurers", "2"])
    assert done.exit_code == 2
    assert "--measurers is an option of --engine local" in done.stderr


def test_the_workers_open_postgresql_as_is_and_an_sqlite_file_on_one_node_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class _Store:
        def __init__(self, url: str) -> None:
            self.url = url

    postgres = "postgresql://radcaliper:secret@db.example:5432/radcaliper"
    assert worker_url(_Store(postgres), nodes=3) == postgres  # type: ignore[arg-type]
    monkeypatch.chdir(tmp_path)
    relative = worker_url(_Store("sqlite:///store.sqlite3"), nodes=1)  # type: ignore[arg-type]
    assert relative == f"sqlite:///{tmp_path / 'store.sqlite3'}"  # workers start elsewhere
    with pytest.raises(ConfigurationError, match=r"cluster has 2 nodes.*PostgreSQL"):
        worker_url(_Store("sqlite:///store.sqlite3"), nodes=2)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="in-memory"):
        worker_url(_Store("sqlite://"), nodes=1)  # type: ignore[arg-type]


def test_the_deploy_files_install_this_version_and_run_options_the_batch_has() -> None:
    """deploy/ray: the wheel and image of this version, Ray's version in the image and the
    cluster alike, and a batch command line whose every option exists."""
    import tomllib

    import typer
    import yaml

    version = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["version"]
    wheel = f"radcaliper-{version}-py3-none-any.whl"
    deploy = REPOSITORY / "deploy" / "ray"
    dockerfile = (deploy / "Dockerfile").read_text()
    assert wheel in dockerfile and wheel in (deploy / "cluster.yaml").read_text()
    cluster, job = yaml.safe_load_all((deploy / "kuberay.yaml").read_text())
    assert f"FROM rayproject/ray:{cluster['spec']['rayVersion']}-" in dockerfile
    pods = [cluster["spec"]["headGroupSpec"]] + cluster["spec"]["workerGroupSpecs"]
    images = {c["image"] for pod in pods for c in pod["template"]["spec"]["containers"]}
    assert images == {f"registry.example/radcaliper:{version}"}
    assert job["kind"] == "RayJob"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    words = job["spec"]["entrypoint"].split()
    assert words[:2] == ["radcaliper", "batch"] and "--engine ray" in " ".join(words)
    batch = typer.main.get_command(app).commands["batch"]  # type: ignore[attr-defined]
    options = {name for p in batch.params for name in p.opts}
    used = {w for w in words if w.startswith("--")}
    assert used <= options, used - options
