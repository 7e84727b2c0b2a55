"""``radcaliper batch --engine ray``: the same batch spread over a Ray cluster (README "Batch on
a Ray cluster").

The batch process (the *driver*) still walks the tree, plans and skips studies, keeps the work
index and the resume state and writes the report (``app.batch.run``); :class:`RayEngine` runs the
rest on the cluster:

- the **header reads** of the scan, as tasks of :data:`SCAN_CHUNK` files each;
- each study's **load**, as a task that returns the outline (what the driver decides from) and
  the volumes separately: the pixels go from the loading node to the measuring one, never
  through the driver;
- the **measuring and storing**, in actors (*measuring workers*) that load the model once, on
  CPUs or ``gpus_per_worker`` GPUs each, and store each study in one transaction
  (``app.batch.measure``), straight into the database.

Faults: a load task whose process dies is retried (Ray's task retries); a measuring worker that
dies is restarted, on any node, and its study retried. Storing is idempotent (unique runs), so a
study measured twice is stored once. A driver killed and started again resumes from its state
and the store, as the local engine does.

Every node must see the tree, the model directory and the database at the same addresses: a
shared file system and a database server (PostgreSQL). An SQLite file is refused on a cluster of
more than one node. Ray is an optional dependency (``pip install 'radcaliper[ray]'``), imported
only here, and only when the engine is made.

Joining a cluster (``--address``) takes at most ``--connect-timeout`` seconds (30): an address
where nothing listens is refused at once, and Ray's own connection, which retries for minutes
where no Ray cluster answers, is given up at the deadline (``ConfigurationError``).
"""

from __future__ import annotations

import importlib
import logging
import math
import signal
import socket
import sys
import threading
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

from app.batch.measure import StudyStored, measure_and_store_study, open_worker, unexpected
from app.batch.options import BatchOptions, Loaded, MeasuredStudy, ModelIdentity
from app.batch.worker import LoadedSeries, LoadOutline, StudyJob, load_study
from app.threads import usable_cpus
from db.engine import Store, in_memory
from ingestion.catalog import FileRecord, catalog_file
from ingestion.errors import ConfigurationError

__all__ = [
    "RAY_MISSING",
    "SCAN_CHUNK",
    "RayEngine",
    "RayOptions",
    "import_ray",
    "worker_url",
]

logger = logging.getLogger(__name__)

RAY_MISSING = (
    "the ray engine needs Ray, which is not installed: pip install 'radcaliper[ray]' "
    "(or run the batch with the default --engine local)"
)
SCAN_CHUNK = 64  # files per header-reading task
RETRIES = 3  # a load task or a measuring worker whose process dies, before the study fails


def import_ray() -> ModuleType:
    """The ``ray`` module, or ``ConfigurationError`` saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigurationError(RAY_MISSING) from None


@dataclass(frozen=True)
class RayOptions:
    """Where and how to run on Ray (the command line's options)."""

    address: str | None = None  # None: a Ray instance on this machine; "auto"; "ray://HOST:PORT"
    workers: int | None = None  # measuring workers; None: one per GPU group, else CPUs // 2
    gpus_per_worker: float = 0.0
    cpus_per_worker: int = 1  # CPUs a measuring worker holds (and torch's threads in it)
    connect_timeout_s: float = 30.0  # joining ``address``: given up after this long

    def __post_init__(self) -> None:
        if not (math.isfinite(self.connect_timeout_s) and self.connect_timeout_s > 0):
            raise ValueError(
                f"--connect-timeout must be a number of seconds > 0, got {self.connect_timeout_s}"
            )
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"measuring workers must be >= 1, got {self.workers}")
        if self.gpus_per_worker < 0 or not math.isfinite(self.gpus_per_worker):
            raise ValueError(f"--gpus-per-worker must be >= 0, got {self.gpus_per_worker}")
        if self.cpus_per_worker < 1:
            raise ValueError(f"CPUs per measuring worker must be >= 1, got {self.cpus_per_worker}")


def worker_url(store: Store, nodes: int) -> str:
    """The database URL the measuring workers open: PostgreSQL as is; an SQLite file by its
    absolute path on a one-node cluster, refused on more (``ConfigurationError``)."""
    from sqlalchemy.engine import make_url

    url = make_url(store.url)
    if url.get_backend_name() != "sqlite":
        return store.url
    database = url.database or ""
    if in_memory(url):
        raise ConfigurationError(
            "the ray engine needs a database the measuring workers can open: an in-memory "
            "SQLite database cannot be shared; use a file or PostgreSQL"
        )
    if nodes > 1:
        raise ConfigurationError(
            f"the database is an SQLite file ({database}) and the Ray cluster has {nodes} "
            "nodes: measuring workers on other nodes cannot write to it. Use PostgreSQL "
            "(--db postgresql://USER@HOST/DB, or RADCALIPER_DATABASE_URL), or run on one node"
        )
    return url.set(database=str(Path(database).resolve())).render_as_string(hide_password=False)


# --- what runs on the cluster (module functions: Ray ships them by reference) ----------------

_logging_level: int | None = None


def _worker_logging(level: int) -> None:
    """Log in a Ray worker process as the batch does (once per process)."""
    global _logging_level
    if _logging_level != level:
        from app.logs import configure_logging

        configure_logging(logging.getLevelName(level))
        _logging_level = level


def _read_headers(paths: list[Path], level: int) -> list[FileRecord]:
    _worker_logging(level)
    return [catalog_file(path) for path in paths]


def _load(job: StudyJob, level: int) -> tuple[LoadOutline, tuple[LoadedSeries, ...]]:
    _worker_logging(level)
    load = load_study(job)
    return load.outline(), load.loaded


class MeasuringWorker:
    """A Ray actor: the model, loaded once, and a connection to the database."""

    def __init__(
        self,
        model_dir: str,
        db_url: str,
        actor: str,
        pseudonym_key: str | None,
        threads: int,
        level: int,
    ) -> None:
        _worker_logging(level)
        self.measurer, self.store = open_worker(Path(model_dir), db_url, threads)
        self.actor = actor
        self.pseudonym_key = pseudonym_key

    def identity(self) -> tuple[str, str, str]:
        """Name, version and checkpoint hash of the model this worker loaded."""
        info = self.measurer.info
        return info.name, info.version, self.measurer.checkpoint_hash

    def measure(self, loaded: tuple[LoadedSeries, ...], positions: tuple[int, ...]) -> StudyStored:
        return measure_and_store_study(
            self.measurer,
            self.store,
            [loaded[i] for i in positions],
            actor=self.actor,
            pseudonym_key=self.pseudonym_key,
        )


# --- the engine (in the driver) ------------------------------------------------------------


class _RemoteMethod(Protocol):
    """An actor's method as Ray shows it to the driver: ``.remote(...)`` gives a reference."""

    def remote(self, *args: object) -> Hashable: ...


class _WorkerHandle(Protocol):
    """A :class:`MeasuringWorker` actor's handle in the driver."""

    @property
    def identity(self) -> _RemoteMethod: ...

    @property
    def measure(self) -> _RemoteMethod: ...


class RayEngine:
    """``app.batch.BatchEngine`` on a Ray cluster; a context manager that connects (or starts a
    Ray instance on this machine), starts the measuring workers, checks that each loaded the
    driver's model, and disconnects."""

    def __init__(
        self,
        options: BatchOptions,
        store: Store,
        model: ModelIdentity,
        ray_options: RayOptions,
    ) -> None:
        self.options = options
        self.store = store
        self.model = model
        self.ray_options = ray_options
        self.ray = import_ray()
        # made once: each ray.remote() is a new function that Ray exports to the cluster again
        self.load_task = self.ray.remote(_load).options(num_returns=2, max_retries=RETRIES)
        self.read_task = self.ray.remote(_read_headers).options(max_retries=RETRIES)
        self.level = logging.getLogger().getEffectiveLevel()
        self.started = False
        self.workers: list[_WorkerHandle] = []
        self.busy: list[int] = []  # studies in flight per worker
        self.pending: dict[Hashable, tuple[int, str]] = {}  # ref -> (key, "load" | "measure")
        self.volumes: dict[int, Hashable] = {}  # key -> ref of its loaded series
        self.on_worker: dict[int, int] = {}  # key -> the worker measuring it
        self.nodes = 0
        self.cpus = 0.0

    # --- connecting ----------------------------------------------------------------------------

    def __enter__(self) -> RayEngine:
        ray = self.ray
        opts = self.ray_options
        if not ray.is_initialized():
            if opts.address is None:
                # this machine: CPUs for the measuring workers and at least one to load
                workers = opts.workers or max(1, usable_cpus() // 2)
                cpus = max(usable_cpus(), workers * opts.cpus_per_worker + 1)
                ray.init(
                    address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=True
                )
            else:
                _join(ray, opts.address, opts.connect_timeout_s)
            self.started = True
        try:
            self._start_workers()
        except BaseException:
            self.close()
            self._disconnect()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._disconnect()

    def _disconnect(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False

    def _start_workers(self) -> None:
        ray = self.ray
        opts = self.ray_options
        self.nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        resources = ray.cluster_resources()
        self.cpus = float(resources.get("CPU", 0))
        gpus = float(resources.get("GPU", 0))
        url = worker_url(self.store, self.nodes)
        count = opts.workers or self._default_workers(gpus)
        if opts.gpus_per_worker and count * opts.gpus_per_worker > gpus:
            raise ConfigurationError(
                f"{count} measuring worker(s) of {opts.gpus_per_worker:g} GPU(s) need "
                f"{count * opts.gpus_per_worker:g} GPUs; the Ray cluster has {gpus:g}"
            )
        if count * opts.cpus_per_worker >= self.cpus:
            raise ConfigurationError(
                f"{count} measuring worker(s) of {opts.cpus_per_worker} CPU(s) leave none of the "
                f"Ray cluster's {self.cpus:g} CPUs to read and load studies: use fewer --workers"
            )
        actor_class = ray.remote(MeasuringWorker).options(
            num_cpus=opts.cpus_per_worker,
            num_gpus=opts.gpus_per_worker,
            max_restarts=RETRIES,
            max_task_retries=RETRIES,
            scheduling_strategy="SPREAD",
        )
        self.workers = [
            actor_class.remote(
                str(self.model.directory),
                url,
                self.options.actor,
                self.options.pseudonym_key,
                opts.cpus_per_worker,
                self.level,
            )
            for _ in range(count)
        ]
        self.busy = [0] * count
        expected = (self.model.info.name, self.model.info.version, self.model.checkpoint_hash)
        for worker in self.workers:
            try:
                found = ray.get(worker.identity.remote())
            except ray.exceptions.RayError as exc:
                raise ConfigurationError(
                    f"a measuring worker could not start: {_cause(exc)} (every node needs the "
                    f"model at {self.model.directory} and the database)"
                ) from None
            if tuple(found) != expected:
                raise ConfigurationError(
                    f"a measuring worker loaded another model from {self.model.directory} "
                    f"({found[0]} {found[1]}, checkpoint {found[2][:12]}) than this process "
                    f"({expected[0]} {expected[1]}, checkpoint {expected[2][:12]}): every node "
                    "needs the same checkpoint at the same path"
                )
        logger.info(
            "ray: %d node(s), %g CPU(s), %g GPU(s); %d measuring worker(s)",
            self.nodes,
            self.cpus,
            gpus,
            count,
        )

    def _default_workers(self, gpus: float) -> int:
        per = self.ray_options.gpus_per_worker
        if per:
            return max(1, int(gpus // per))
        return max(1, int(self.cpus // (2 * self.ray_options.cpus_per_worker)))

    # --- app.batch.BatchEngine -----------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return 2 * len(self.workers) + 2

    scan_chunk = SCAN_CHUNK

    def read_headers(self, chunks: Iterator[list[Path]]) -> Iterator[list[FileRecord]]:
        ray = self.ray
        window = max(2, int(2 * self.cpus))
        inflight: dict[Hashable, list[Path]] = {}

        def finished() -> Iterator[list[FileRecord]]:
            done, _ = ray.wait(list(inflight), num_returns=1)
            for ref in done:
                paths = inflight.pop(ref)
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayError as exc:  # the reading process died: read here
                    logger.warning("a header-reading task failed (%s); read here", _cause(exc))
                    yield [catalog_file(path) for path in paths]

        for chunk in chunks:
            inflight[self.read_task.remote(chunk, self.level)] = chunk
            if len(inflight) >= window:
                yield from finished()
        while inflight:
            yield from finished()

    def load(self, key: int, job: StudyJob) -> None:
        outline, volumes = self.load_task.remote(job, self.level)
        self.pending[outline] = (key, "load")
        self.volumes[key] = volumes

    def measure(self, key: int, series: tuple[int, ...]) -> None:
        worker = min(range(len(self.workers)), key=self.busy.__getitem__)
        self.busy[worker] += 1
        self.on_worker[key] = worker
        ref = self.workers[worker].measure.remote(self.volumes.pop(key), series)
        self.pending[ref] = (key, "measure")

    def release(self, key: int) -> None:
        self.volumes.pop(key, None)

    def next_event(self) -> Loaded | MeasuredStudy:
        ray = self.ray
        done, _ = ray.wait(list(self.pending), num_returns=1)
        ref = done[0]
        key, kind = self.pending.pop(ref)
        if kind == "load":
            try:
                outline: LoadOutline = ray.get(ref)
            except ray.exceptions.RayError as exc:
                return Loaded(key, None, f"while loading: {_cause(exc)}")
            return Loaded(key, outline)
        self.busy[self.on_worker.pop(key)] -= 1
        try:
            stored: StudyStored = ray.get(ref)
        except ray.exceptions.RayError as exc:
            reason = (
                f"the measuring worker failed {RETRIES + 1} times on this study ({_cause(exc)}); "
                "run the batch again to retry it"
            )
            return MeasuredStudy(key, None, reason)
        return MeasuredStudy(key, stored)

    def close(self) -> None:
        ray = self.ray
        for ref, (_, kind) in list(self.pending.items()):
            if kind == "load":
                ray.cancel(ref, force=True)
        self.pending.clear()
        self.volumes.clear()
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []


def _join(ray: ModuleType, address: str, timeout_s: float) -> None:
    """``ray.init(address)`` within ``timeout_s`` seconds, else ``ConfigurationError``: first a
    TCP connection to HOST:PORT (an address where nothing listens is said at once), then Ray's
    own connection in a thread given up at the deadline (Ray retries for minutes where no Ray
    cluster answers, in calls that cannot be interrupted)."""
    deadline = time.monotonic() + timeout_s
    target = _host_port(address)
    if target is not None:
        try:
            socket.create_connection(target, timeout=timeout_s).close()
        except OSError as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
            raise ConfigurationError(
                f"cannot join the Ray cluster at {address}: nothing answers at "
                f"{target[0]}:{target[1]} ({reason}); check --address and that 'ray start "
                "--head' runs there"
            ) from None
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=True)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    if threading.current_thread() is threading.main_thread():
        # what ray.init does in the main thread: SIGTERM ends the driver through sys.exit,
        # so that Ray disconnects
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
    quiet = _Without("SIGTERM handler is not set")  # Ray's warning in a thread: set above
    logging.getLogger("ray._private.worker").addFilter(quiet)
    try:
        thread = threading.Thread(target=connect, name="radcaliper-ray-connect", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        logging.getLogger("ray._private.worker").removeFilter(quiet)
    if not outcome:  # the thread goes on trying until the process ends
        raise ConfigurationError(
            f"cannot join the Ray cluster at {address}: no Ray cluster answered within "
            f"{timeout_s:g} s (--connect-timeout); check --address (the head's port, 6379 by "
            "default, or ray://HOST:10001 for Ray Client)"
        )
    error = outcome[0]
    if isinstance(error, ConnectionError | ValueError | RuntimeError):
        raise ConfigurationError(
            f"cannot join the Ray cluster at {address}: {_first_line(error)}"
        ) from None
    if error is not None:
        raise error


def _host_port(address: str) -> tuple[str, int] | None:
    """HOST and PORT of ``HOST:PORT`` or ``ray://HOST:PORT`` (None for "auto" and anything
    else, which Ray reads itself)."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


class _Without(logging.Filter):
    """Drops log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _cause(exc: BaseException) -> str:
    """The error inside a Ray error (a task's own exception), in one line."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return unexpected(cause)
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
