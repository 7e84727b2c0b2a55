"""Benchmark: ``radcaliper audit verify`` on a database with 1 million measurements.

Usage (from the repository root, in the project's virtualenv; PostgreSQL as for the tests)::

    python benchmarks/bench_audit.py [--measurements 1000000] [--backends sqlite,postgresql]
                                     [--appended 20] [--cache runs/bench_audit] [--refill]

For each backend:

1. **Fill** (once; cached): a fresh database migrated to the current schema gets
   ``--measurements`` measurements as ``radcaliper measure`` stores them, written in bulk with
   SQLAlchemy Core ``executemany``: one study, series and run per study with 2-4 findings (a
   vessel's diameter, a lesion's long and short axes), a ``run.stored`` event recording the
   study, series, run and findings, one ``measurement.created`` event per measurement, and 5 %
   of the measurements accepted by a reviewer (a review row, its ``review.accept`` event and the
   measurement's ``measurement.accepted`` event). The events form a *valid* chain: their hashes
   come from ``db.audit.event_hash`` and their row states from the ``db.audit.coverage`` state
   functions, exactly as the store writes them. The SQLite file is kept under ``--cache``
   (``runs/`` is not tracked); the PostgreSQL database is kept as
   ``radcaliper_bench_audit_<N>_v<fill version>``.
   ``--refill`` makes them again.
2. **Full verify**: after one pass over the database (so that every run sees a warm page
   cache), ``radcaliper audit verify`` on the cached database (it only reads), as a child
   process (interpreter start and imports included), with its default of two processes on a
   machine with 2 CPUs or more, then again with ``--processes 1``. Wall time; peak RSS of the
   ``radcaliper`` process (its VmHWM); and, since a full verify forks a second process that
   shares its pages, the peak of the process tree's summed PSS (a shared page counted once)
   and summed RSS (counted in both). Memory is sampled from ``/proc`` every 20 ms (Linux).
   Targets: <= 20 s and <= 300 MB.
3. **Since the head**: on a copy of the cached database, ``--appended`` events are added
   through the API (reviews of measurements: a review event and a measurement event each),
   then ``radcaliper audit verify --since-head HEAD`` with the head the full verify printed:
   wall time and memory.

The table is printed as markdown with the command, the date, the machine and its load average.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import load, machine
from sqlalchemy import Table, insert, select, text, update

from db.audit import GENESIS, event_hash
from db.audit.coverage import (
    measurement_state,
    review_state,
    states_detail,
)
from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import (
    AuditEvent,
    AuditHead,
    Finding,
    Measurement,
    Review,
    ReviewAction,
    Run,
    Series,
    Study,
    User,
)
from db.review import review_measurement

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
ROOT = Path(__file__).resolve().parents[1]
START = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
FILL_VERSION = 2  # part of the cache's name: change it when the fill changes (2: schema 0004)
TARGET_S = 20.0
TARGET_MB = 300.0
REVIEWED = 0.05  # share of measurements accepted by a reviewer
SLICES = 40  # SOP instance UIDs per series
FLUSH_MEASUREMENTS = 20_000
Row = dict[str, Any]


@dataclass
class _Chain:
    """The end of the audit chain being written, and the events not yet inserted."""

    last_id: int = 0
    last_hash: str = GENESIS
    pending: list[Row] | None = None

    def append(
        self,
        at: datetime,
        actor: str,
        action: str,
        object_type: str,
        object_id: int | None,
        details: dict[str, Any],
    ) -> None:
        event_id = self.last_id + 1
        digest = event_hash(
            self.last_hash, event_id, at, actor, action, object_type, object_id, details
        )
        if self.pending is None:
            self.pending = []
        self.pending.append(
            {"id": event_id, "at": at, "actor": actor, "action": action,
             "object_type": object_type, "object_id": object_id, "details": details,
             "prev_hash": self.last_hash, "hash": digest}
        )  # fmt: skip
        self.last_id, self.last_hash = event_id, digest


@dataclass
class _Batch:
    """Rows not yet inserted, table by table (in foreign-key order)."""

    studies: list[Row]
    series: list[Row]
    runs: list[Row]
    findings: list[Row]
    measurements: list[Row]
    reviews: list[Row]

    @classmethod
    def empty(cls) -> _Batch:
        return cls([], [], [], [], [], [])

    def tables(self) -> Iterator[tuple[Table, list[Row]]]:
        yield Study.__table__, self.studies  # type: ignore[misc]
        yield Series.__table__, self.series  # type: ignore[misc]
        yield Run.__table__, self.runs  # type: ignore[misc]
        yield Finding.__table__, self.findings  # type: ignore[misc]
        yield Measurement.__table__, self.measurements  # type: ignore[misc]
        yield Review.__table__, self.reviews  # type: ignore[misc]


def _state(row: Row) -> SimpleNamespace:
    """A row as the state functions read it (attributes)."""
    return SimpleNamespace(**row)


def _users(store: Store, chain: _Chain) -> list[Row]:
    users = [
        {"id": k + 1, "name": name, "role": role, "password_hash": None, "active": True,
         "created_at": START}
        for k, (name, role) in enumerate([("ida", "auditor"), ("alice", "reviewer"),
                                          ("bob", "reviewer")])
    ]  # fmt: skip
    for user in users:
        chain.append(
            START, "cli:bench", "user.added", "user", user["id"],
            {"name": user["name"], "role": user["role"], "password": False,
             "rows": states_detail({"users": [_state(user)]})},
        )  # fmt: skip
    with store.writer() as session:
        session.execute(insert(User), users)
        session.commit()
    return users


class _Filler:
    """Writes studies with their rows and a valid audit chain, in bulk."""

    def __init__(self, store: Store, rng: random.Random) -> None:
        self.store, self.rng = store, rng
        with store.reader() as session:  # the schema's own event (its creation) comes first
            head = session.execute(select(AuditHead.last_id, AuditHead.last_hash)).one()
        self.chain = _Chain(head.last_id, head.last_hash)
        self.batch = _Batch.empty()
        self.ids = {"study": 0, "finding": 0, "measurement": 0, "review": 0}
        self.made = 0

    def fill(self, target: int) -> int:
        reviewers = [u for u in _users(self.store, self.chain) if u["role"] == "reviewer"]
        while self.made < target:
            self._study(reviewers)
            if len(self.batch.measurements) >= FLUSH_MEASUREMENTS:
                self._flush()
        self._flush()
        with self.store.engine.begin() as connection:
            connection.execute(
                update(AuditHead)
                .where(AuditHead.id == 1)
                .values(last_id=self.chain.last_id, last_hash=self.chain.last_hash)
            )
            if self.store.backend == "postgresql":  # ids were given: move the sequences on
                for table in ("users", "studies", "series", "runs", "findings", "measurements",
                              "reviews"):  # fmt: skip
                    connection.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                            f"(SELECT max(id) FROM {table}))"
                        )
                    )
            connection.execute(text("ANALYZE"))
        return self.made

    def _flush(self) -> None:
        with self.store.writer() as session:
            for table, rows in self.batch.tables():
                if rows:
                    session.execute(insert(table), rows)
            if self.chain.pending:
                session.execute(insert(AuditEvent), self.chain.pending)
            session.commit()
        self.batch = _Batch.empty()
        self.chain.pending = []

    def _study(self, reviewers: list[Row]) -> None:
        self.ids["study"] += 1
        k = self.ids["study"]
        at = START + timedelta(seconds=30 * k)
        study = {"id": k, "study_instance_uid": f"2.25.1{k}", "patient_id": f"P{k % 40_000:06d}",
                 "patient_name": None, "study_date": "20260105", "created_at": at}  # fmt: skip
        series = {
            "id": k, "study_id": k, "series_instance_uid": f"2.25.2{k}", "modality": "CT",
            "description": "", "source_format": "dicom",
            "shape": {"slices": SLICES, "rows": 512, "columns": 512},
            "spacing_mm": {"slice": 2.5, "row": 0.8, "column": 0.8},
            "sop_instance_uids": {"uids": [f"2.25.3{k}.{s}" for s in range(SLICES)],
                                  "frames": [None] * SLICES},
            "geometry": {"origin": [0.0, 0.0, 0.0], "row_direction": [1.0, 0.0, 0.0],
                         "column_direction": [0.0, 1.0, 0.0], "slice_direction": [0.0, 0.0, 1.0],
                         "spacing": [2.5, 0.8, 0.8]},
            "created_at": at,
        }  # fmt: skip
        run = {
            "id": k, "series_id": k, "model_name": "radcaliper-demo", "model_version": "0.3.4",
            "numeric_mode": "rned_corr", "checkpoint_hash": "c" * 64, "not_for_clinical_use": True,
            "settings": {"threads": 1}, "input_fingerprint": f"{k:064d}", "source": f"/data/{k}",
            "status": "done", "warnings": {"warnings": []}, "started_at": at, "finished_at": at,
        }  # fmt: skip
        findings = self._findings(k)
        self.chain.append(
            at, "cli:bench", "run.stored", "run", k,
            {"study_instance_uid": study["study_instance_uid"],
             "series_instance_uid": series["series_instance_uid"],
             "model": {"name": run["model_name"], "version": run["model_version"],
                       "numeric_mode": run["numeric_mode"], "not_for_clinical_use": True},
             "checkpoint_hash": run["checkpoint_hash"],
             "input_fingerprint": run["input_fingerprint"], "findings": len(findings),
             "rows": states_detail({"studies": [_state(study)], "series": [_state(series)],
                                    "runs": [_state(run)],
                                    "findings": [_state(f) for f in findings]})},
        )  # fmt: skip
        self.batch.studies.append(study)
        self.batch.series.append(series)
        self.batch.runs.append(run)
        self.batch.findings.extend(findings)
        for finding in findings:
            names = ("diameter",) if finding["kind"] == "vessel" else ("long_axis", "short_axis")
            for name in names:
                self._measurement(k, finding, name, at, reviewers)

    def _findings(self, run_id: int) -> list[Row]:
        findings = []
        for number in range(1, self.rng.randint(2, 4) + 1):
            self.ids["finding"] += 1
            kind = "vessel" if number == 1 else "lesion"
            x, y, z = (round(self.rng.uniform(-150, 150), 3) for _ in range(3))
            findings.append(
                {"id": self.ids["finding"], "run_id": run_id, "number": number, "kind": kind,
                 "center_x_mm": x, "center_y_mm": y, "center_z_mm": z,
                 "slice_index": self.rng.randrange(SLICES),
                 "sop_instance_uid": f"2.25.3{run_id}.{number}", "frame_number": None,
                 "axes_lps_mm": {"segments": [[[x - 5, y, z], [x + 5, y, z]]]}}
            )  # fmt: skip
        return findings

    def _measurement(
        self, run_id: int, finding: Row, name: str, at: datetime, reviewers: list[Row]
    ) -> None:
        self.ids["measurement"] += 1
        mid = self.ids["measurement"]
        value = round(self.rng.uniform(5, 60), 2)
        row = {
            "id": mid, "finding_id": finding["id"], "name": name, "value_mm": value,
            "range_low_mm": value - 2, "range_high_mm": value + 2, "coverage": 0.9, "unit": "mm",
            "qualifier": None, "reason": None, "source": "model", "status": "pending",
            "reviewed_value_mm": None, "reviewer_id": None, "reviewed_at": None, "version": 1,
        }  # fmt: skip
        self.chain.append(
            at, "cli:bench", "measurement.created", "measurement", mid,
            {"run_id": run_id, "finding": finding["number"], "state": measurement_state(
                _state(row))},
        )  # fmt: skip
        if self.rng.random() < REVIEWED:
            self._review(row, at + timedelta(minutes=5), self.rng.choice(reviewers))
        self.batch.measurements.append(row)
        self.made += 1

    def _review(self, row: Row, at: datetime, reviewer: Row) -> None:
        """An accept, as ``db.review.review_measurement`` records it."""
        self.ids["review"] += 1
        review = {"id": self.ids["review"], "measurement_id": row["id"], "action": "accept",
                  "value_mm": None, "reason": None, "reviewer_id": reviewer["id"],
                  "created_at": at}  # fmt: skip
        row.update(status="accepted", reviewer_id=reviewer["id"], reviewed_at=at, version=2)
        self.batch.reviews.append(review)
        self.chain.append(
            at, reviewer["name"], "review.accept", "review", review["id"],
            {"state": review_state(_state(review))},
        )  # fmt: skip
        self.chain.append(
            at, reviewer["name"], "measurement.accepted", "measurement", row["id"],
            {"review_id": review["id"], "state": measurement_state(_state(row))},
        )  # fmt: skip


# --- databases -----------------------------------------------------------------------------------


def _pg_admin() -> Any:
    from psycopg import connect as pg_connect

    return pg_connect(POSTGRES, autocommit=True)


def _pg_url(database: str) -> str:
    return POSTGRES.rsplit("/", 1)[0] + "/" + database


def _pg_exists(database: str) -> bool:
    with _pg_admin() as connection:
        found = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
    return found is not None


def _pg_drop(database: str) -> None:
    with _pg_admin() as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _filled(backend: str, measurements: int, cache: Path, refill: bool) -> tuple[str, str]:
    """The cached, filled database of ``backend`` (made when missing): its URL and a note."""
    name = f"bench_audit_{measurements}_v{FILL_VERSION}"
    if backend == "sqlite":
        path = cache / f"{name}.sqlite3"
        if path.exists() and not refill:
            return f"sqlite:///{path}", "cached"
        cache.mkdir(parents=True, exist_ok=True)
        for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            stale.unlink(missing_ok=True)
        url = f"sqlite:///{path}"
    else:
        database = f"radcaliper_{name}"
        if _pg_exists(database) and not refill:
            return _pg_url(database), "cached"
        _pg_drop(database)
        with _pg_admin() as connection:
            connection.execute(f'CREATE DATABASE "{database}"')
        url = _pg_url(database)
    began = time.perf_counter()
    upgrade(url)
    store = open_store(url)
    try:
        made = _Filler(store, random.Random(7)).fill(measurements)
        with store.reader() as session:
            events = session.execute(select(AuditHead.last_id)).scalar_one()
    finally:
        store.dispose()
    seconds = time.perf_counter() - began
    return url, f"filled in {seconds:.0f} s ({made:,} measurements, {events:,} events)"


def _warm(backend: str, url: str) -> float:
    """One pass over the database, so that every run sees a warm page cache: seconds."""
    began = time.perf_counter()
    if backend == "sqlite":
        with open(url.removeprefix("sqlite:///"), "rb") as database:
            while database.read(1 << 24):
                pass
    else:
        store = open_store(url)
        try:
            with store.engine.connect() as connection:
                for table in ("audit_events", "users", "studies", "series", "runs", "findings",
                              "measurements", "reviews"):  # fmt: skip
                    connection.execute(text(f"SELECT sum(length({table}::text)) FROM {table}"))
        finally:
            store.dispose()
    return time.perf_counter() - began


def _working_copy(backend: str, url: str, workdir: Path) -> tuple[str, str | None]:
    """A copy of the cached database to run on (the run appends events): URL, PG name."""
    if backend == "sqlite":
        source = Path(url.removeprefix("sqlite:///"))
        with open_store(url).engine.begin() as connection:  # fold the WAL into the file
            connection.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        target = workdir / "verify.sqlite3"
        shutil.copyfile(source, target)
        target.chmod(0o600)  # as radcaliper makes its files (it would say so, and fix it)
        os.sync()  # the copy's write-back must not slow down what is measured next
        return f"sqlite:///{target}", None
    database = f"radcaliper_bench_audit_work_{uuid.uuid4().hex[:8]}"
    with _pg_admin() as connection:
        connection.execute(f'CREATE DATABASE "{database}" TEMPLATE "{url.rsplit("/", 1)[1]}"')
    return _pg_url(database), database


# --- measuring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Timed:
    seconds: float
    own_mb: float  # the command's process: its peak RSS (VmHWM)
    tree_rss_mb: float  # with its second process: peak of the summed RSS (shared pages twice)
    tree_pss_mb: float  # the same as PSS (a shared page split between the processes)
    exit_code: int
    output: str


def _radcaliper() -> list[str]:
    script = Path(sys.executable).with_name("radcaliper")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _field_kb(path: str, name: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class _Sampler(threading.Thread):
    """Every 20 ms: the command's own peak RSS (VmHWM, which ``exec`` resets, unlike the
    ``ru_maxrss`` that ``wait4`` gives: that one keeps this script's size from before the
    ``exec``), and the summed RSS and PSS of its process tree."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.own_kb, self.rss_kb, self.pss_kb = pid, 0, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.own_kb = max(self.own_kb, _field_kb(f"/proc/{self.pid}/status", "VmHWM:"))
            tree = _tree(self.pid)
            self.rss_kb = max(
                self.rss_kb, sum(_field_kb(f"/proc/{p}/status", "VmRSS:") for p in tree)
            )
            self.pss_kb = max(
                self.pss_kb, sum(_field_kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in tree)
            )


def _timed(arguments: Sequence[str]) -> _Timed:
    """Run ``radcaliper ARGUMENTS`` as a child: wall time, peak memory, exit code, output."""
    command = [*_radcaliper(), *arguments]
    began = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    sampler = _Sampler(child.pid)
    sampler.start()
    output, _ = child.communicate()
    seconds = time.perf_counter() - began
    sampler.done.set()
    sampler.join()
    mb = 1024
    return _Timed(
        seconds,
        sampler.own_kb / mb,
        sampler.rss_kb / mb,
        sampler.pss_kb / mb,
        child.returncode,
        output.strip(),
    )


def _append_reviews(url: str, count: int) -> int:
    """``count`` events through the API: accepts of the first measurements still pending."""
    store = open_store(url)
    try:
        with store.writer() as session:
            reviewer = session.execute(select(User).where(User.name == "alice")).scalar_one()
            pending = session.execute(
                select(Measurement.id, Measurement.version)
                .where(Measurement.status == "pending")
                .order_by(Measurement.id)
                .limit(max(1, count // 2))
            ).all()
            for mid, version in pending:
                review_measurement(
                    session,
                    mid,
                    action=ReviewAction.ACCEPT,
                    reviewer=reviewer,
                    seen_version=version,
                )
            session.commit()
        return 2 * len(pending)
    finally:
        store.dispose()


def _head(output: str) -> str:
    return output.rsplit("head ", 1)[1].split()[0]


def _verdict(timed: _Timed) -> str:
    met = timed.exit_code == 0 and timed.seconds <= TARGET_S and timed.own_mb <= TARGET_MB
    return "MET" if met else "missed"


def _row(what: str, timed: _Timed, target: str) -> str:
    return (
        f"| {what} | {timed.seconds:.1f} s | {timed.own_mb:.0f} MB | {timed.tree_pss_mb:.0f} MB "
        f"| {timed.tree_rss_mb:.0f} MB | {target} |"
    )


def _checked(backend: str, what: str, timed: _Timed) -> _Timed:
    if timed.exit_code != 0:
        raise SystemExit(f"{backend}: {what} exited {timed.exit_code}: {timed.output}")
    return timed


def run_backend(backend: str, args: argparse.Namespace, workdir: Path) -> list[str]:
    url, note = _filled(backend, args.measurements, args.cache, args.refill)
    warm = _warm(backend, url)
    verify = ["audit", "verify", "--db", url]  # reads only: on the cached database itself
    full = _checked(backend, "audit verify", _timed(verify))
    alone = _checked(backend, "--processes 1", _timed([*verify, "--processes", "1"]))
    work, database = _working_copy(backend, url, workdir)
    try:
        appended = _append_reviews(work, args.appended)
        since_head = ["audit", "verify", "--db", work, "--since-head", _head(full.output)]
        since = _checked(backend, "--since-head", _timed(since_head))
    finally:
        if database is not None:
            _pg_drop(database)
    target = f"<= {TARGET_S:.0f} s, <= {TARGET_MB:.0f} MB: {_verdict(full)}"
    return [
        f"### {backend}: {args.measurements:,} measurements",
        "",
        f"- database: {note}; read once in {warm:.0f} s before the runs (a warm page cache)",
        f"- `audit verify` said: `{full.output}`",
        f"- after {appended} events appended through the API (to a copy), `--since-head` "
        f"said: `{since.output}`",
        "",
        "| command | wall time | peak RSS | with its 2nd process: PSS | summed RSS | target |",
        "|---|---|---|---|---|---|",
        _row("`audit verify` (2 processes on 2+ CPUs)", full, target),
        _row("`audit verify --processes 1`", alone, "(one process)"),
        _row(f"`audit verify --since-head HEAD` ({appended} new events)", since, "much faster"),
        "",
        "Peak RSS: the `radcaliper` process's own (VmHWM). A full verify forks a second "
        "process that shares its pages: PSS counts a shared page once (split between the "
        "two), summed RSS counts it in both; both are sampled every 20 ms.",
        "",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Fills (once) and verifies; see the module docstring for what is measured.",
    )
    parser.add_argument(
        "--measurements", type=int, default=1_000_000, help="measurements in the database"
    )
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite and/or postgresql")
    parser.add_argument(
        "--appended", type=int, default=20, help="events appended before --since-head"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=ROOT / "runs" / "bench_audit",
        help="where the filled SQLite file is kept",
    )
    parser.add_argument("--refill", action="store_true", help="fill the databases again")
    args = parser.parse_args()
    began = datetime.now(UTC)
    header = [
        f"- command: `python benchmarks/bench_audit.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- date: {began.isoformat(timespec='seconds')}",
        f"- machine: {machine()}",
        f"- load average at start: {load()}",
        "",
    ]
    body: list[str] = []
    workdir = args.cache / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        for backend in args.backends.split(","):
            body += run_backend(backend.strip(), args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n".join([*header, *body, f"- load average at end: {load()}"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
