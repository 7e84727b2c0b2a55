"""Benchmark: the measurement store with 1 million measurements, on SQLite and PostgreSQL.

Usage (from the repository root, in the project's virtualenv; PostgreSQL as for the tests)::

    python benchmarks/bench_store.py [--measurements 1000000] [--api-studies 200]
                                     [--backends sqlite,postgresql] [--repeats 30]

For each backend, in a fresh database migrated to the current schema:

1. **Insert throughput through the API**: ``--api-studies`` results (one lesion and one vessel,
   3 measurements each, as the measurer returns them) stored with ``db.store.store_result``, one
   transaction per study, audit events included.
2. **Fill to ``--measurements``** with bulk inserts (SQLAlchemy Core ``executemany``; no audit
   events, which the queries do not read): 40,000 patients with 1-3 studies each, runs spread
   over two years, 3-8 measurements per run.
3. **Audit queries** (``db.queries.measurement_query``, the query behind ``radcaliper audit
   measurements``), each timed ``--repeats`` times on random arguments, median and 95th
   percentile: by patient, and by a one-day date range of measurement time; each with its
   ``EXPLAIN`` plan (the indexes it uses). Target: <= 50 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import load, machine
from sqlalchemy import insert, text

from db.engine import Store, open_store
from db.migrate import upgrade
from db.models import Finding, Measurement, Run, Series, Study
from db.queries import MeasurementFilter, measurement_query, measurement_rows
from db.store import RunIdentity, store_result
from ingestion.geometry import Geometry
from ingestion.volume import Identifiers, Volume
from model.measurer.results import (
    FindingKind,
    MeasurementName,
    ModelInfo,
    StudyFinding,
    StudyResult,
)
from model.measurer.results import Measurement as Value

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
START = datetime(2025, 1, 1, tzinfo=UTC)
DAYS = 730
TARGET_MS = 50.0


def _volume(i: int) -> Volume:
    identifiers = Identifiers(
        study_instance_uid=f"2.25.9{i}",
        series_instance_uid=f"2.25.8{i}",
        sop_instance_uids=tuple(f"2.25.7{i}.{k}" for k in range(4)),
        frame_numbers=(None,) * 4,
        patient_id=f"API-{i}",
    )
    geometry = Geometry((0.0, 0.0, 0.0), (1.0, 0, 0), (0, 1.0, 0), (0, 0, 1.0), (2.0, 0.8, 0.8))
    import numpy as np

    return Volume.in_memory(np.zeros((4, 8, 8), np.float32), geometry, identifiers)


def _result(volume: Volume) -> StudyResult:
    ids = volume.identifiers
    lesion = StudyFinding(
        1,
        FindingKind.LESION,
        (1.0, 2.0, 3.0),
        1,
        (
            Value(MeasurementName.LONG_AXIS, 30.0, (28.0, 32.0), 0.9),
            Value(MeasurementName.SHORT_AXIS, 20.0, (19.0, 21.0), 0.9),
        ),
    )
    vessel = StudyFinding(
        2, FindingKind.VESSEL, (5.0, 5.0, 3.0), 2,
        (Value(MeasurementName.DIAMETER, 25.0, (24.0, 26.0), 0.9),),
    )  # fmt: skip
    return StudyResult(
        ids.study_instance_uid, ids.series_instance_uid, ids.patient_id or "", "bench",
        ModelInfo("radcaliper-bench", "1.0.0", "rned_corr"), (lesion, vessel),
    )  # fmt: skip


def _api_inserts(store: Store, studies: int) -> tuple[float, int]:
    began = time.perf_counter()
    for i in range(studies):
        volume = _volume(i)
        with store.writer() as session:
            store_result(
                session,
                _result(volume),
                volume,
                RunIdentity("c" * 64, f"{i:064d}", {}),
                actor="bench",
                started_at=datetime.now(UTC),
            )
            session.commit()
    return time.perf_counter() - began, 3 * studies


def _fill(store: Store, target: int, rng: random.Random) -> tuple[float, int, list[str]]:
    """Bulk rows up to ``target`` measurements; returns seconds, count and the patient ids."""
    began = time.perf_counter()
    now = datetime.now(UTC)
    patients = [f"P{k:06d}" for k in range(40_000)]
    study_id = series_id = run_id = finding_id = measurement_id = 10_000_000
    made = 0
    studies: list[dict[str, Any]] = []
    series: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    findings: list[dict[str, Any]] = []
    measurements: list[dict[str, Any]] = []

    def flush() -> None:
        with store.writer() as session:
            for table, rows in (
                (Study, studies),
                (Series, series),
                (Run, runs),
                (Finding, findings),
                (Measurement, measurements),
            ):
                if rows:
                    session.execute(insert(table), rows)
                    rows.clear()
            session.commit()

    while made < target:
        study_id += 1
        patient = patients[rng.randrange(len(patients))]
        studies.append(
            {"id": study_id, "study_instance_uid": f"2.25.1{study_id}", "patient_id": patient,
             "study_date": None, "created_at": now}
        )  # fmt: skip
        series_id += 1
        series.append(
            {"id": series_id, "study_id": study_id, "series_instance_uid": f"2.25.2{series_id}",
             "modality": "CT", "description": "", "source_format": "dicom",
             "shape": {"slices": 40, "rows": 256, "columns": 256},
             "spacing_mm": {"slice": 2.5, "row": 0.8, "column": 0.8},
             "sop_instance_uids": {"uids": [], "frames": []}, "created_at": now}
        )  # fmt: skip
        run_id += 1
        started = START + timedelta(seconds=rng.uniform(0, DAYS * 86400))
        runs.append(
            {"id": run_id, "series_id": series_id, "model_name": "radcaliper-demo",
             "model_version": rng.choice(["0.1.0", "0.2.0"]), "numeric_mode": "rned_corr",
             "checkpoint_hash": "c" * 64, "not_for_clinical_use": True, "settings": {},
             "input_fingerprint": f"{run_id:064d}", "source": "bench", "status": "done",
             "warnings": {"warnings": []}, "started_at": started, "finished_at": started}
        )  # fmt: skip
        for number in range(1, rng.randint(2, 4) + 1):
            finding_id += 1
            kind = "vessel" if number == 1 and rng.random() < 0.7 else "lesion"
            findings.append(
                {"id": finding_id, "run_id": run_id, "number": number, "kind": kind,
                 "center_x_mm": 0.0, "center_y_mm": 0.0, "center_z_mm": 0.0, "slice_index": 1,
                 "sop_instance_uid": None, "frame_number": None}
            )  # fmt: skip
            names = ("diameter",) if kind == "vessel" else ("long_axis", "short_axis")
            for name in names:
                measurement_id += 1
                value = rng.uniform(5, 60)
                status = rng.choice(["pending", "pending", "accepted", "corrected", "rejected"])
                measurements.append(
                    {"id": measurement_id, "finding_id": finding_id, "name": name,
                     "value_mm": value, "range_low_mm": value - 2, "range_high_mm": value + 2,
                     "coverage": 0.9, "unit": "mm", "qualifier": None, "reason": None,
                     "source": "model", "status": status, "reviewed_value_mm": None,
                     "reviewer_id": None, "reviewed_at": None, "version": 1}
                )  # fmt: skip
                made += 1
        if len(measurements) >= 20_000:
            flush()
    flush()
    with store.engine.begin() as connection:
        connection.execute(text("ANALYZE"))
    return time.perf_counter() - began, made, patients


def _timed(
    store: Store, filters: list[MeasurementFilter]
) -> tuple[list[float], list[float], list[int]]:
    """Per filter: ms of the database alone (execute + fetch), ms of ``measurement_rows`` (the
    rows as the CLI gets them), and the row count."""
    database, whole, sizes = [], [], []
    with store.reader() as session:
        measurement_rows(session, filters[0])  # warm the cache
        for f in filters:
            began = time.perf_counter()
            session.execute(measurement_query(f)).all()
            database.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            rows = measurement_rows(session, f)
            whole.append((time.perf_counter() - began) * 1000)
            sizes.append(len(rows))
    return database, whole, sizes


def _explain(store: Store, filters: MeasurementFilter) -> str:
    query = measurement_query(filters)
    compiled = query.compile(store.engine, compile_kwargs={"literal_binds": True})
    prefix = "EXPLAIN QUERY PLAN " if store.backend == "sqlite" else "EXPLAIN "
    with store.engine.connect() as connection:
        rows = connection.execute(text(prefix + str(compiled))).all()
    if store.backend == "sqlite":
        return "\n".join(str(r[-1]) for r in rows)
    return "\n".join(str(r[0]) for r in rows)


def _verdict(times: list[float]) -> str:
    return "MET" if statistics.median(times) <= TARGET_MS else "missed"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_backend(name: str, args: argparse.Namespace, workdir: Path) -> list[str]:
    from psycopg import connect as pg_connect

    if name == "sqlite":
        url = f"sqlite:///{workdir / 'bench.sqlite3'}"
        drop = None
    else:
        database = f"radcaliper_bench_{uuid.uuid4().hex[:8]}"
        with pg_connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{database}"')
        url = POSTGRES.rsplit("/", 1)[0] + "/" + database
        drop = database
    try:
        upgrade(url)
        store = open_store(url)
        rng = random.Random(7)
        api_seconds, api_count = _api_inserts(store, args.api_studies)
        fill_seconds, filled, patients = _fill(store, args.measurements, rng)
        by_patient = [
            MeasurementFilter(patient_id=rng.choice(patients)) for _ in range(args.repeats)
        ]
        by_day = []
        for _ in range(args.repeats):
            day = START + timedelta(days=rng.randrange(DAYS))
            by_day.append(MeasurementFilter(since=day, until=day + timedelta(days=1)))
        patient_db, patient_ms, patient_rows = _timed(store, by_patient)
        day_db, day_ms, day_rows = _timed(store, by_day)
        lines = [
            f"### {name}",
            "",
            f"- through the API: {args.api_studies} studies (3 measurements each, audit events "
            f"included, one transaction per study) in {api_seconds:.1f} s = "
            f"{args.api_studies / api_seconds:.1f} studies/s, {api_count / api_seconds:.0f} "
            "measurements/s",
            f"- bulk fill: {filled:,} measurements in {fill_seconds:.0f} s "
            f"({filled / fill_seconds:,.0f}/s)",
            "",
            "| query | database: median / p95 | rows as dicts: median / p95 | rows returned "
            "(median) | target (rows as dicts) |",
            "|---|---|---|---|---|",
            f"| by patient | {statistics.median(patient_db):.1f} / {_pct(patient_db, 0.95):.1f} ms"
            f" | {statistics.median(patient_ms):.1f} / {_pct(patient_ms, 0.95):.1f} ms | "
            f"{statistics.median(patient_rows):.0f} | <= {TARGET_MS:.0f} ms: "
            f"{_verdict(patient_ms)} |",
            f"| one day of measurements | {statistics.median(day_db):.1f} / "
            f"{_pct(day_db, 0.95):.1f} ms | {statistics.median(day_ms):.1f} / "
            f"{_pct(day_ms, 0.95):.1f} ms | {statistics.median(day_rows):.0f} | "
            f"<= {TARGET_MS:.0f} ms: {_verdict(day_ms)} |",
            "",
            "EXPLAIN, by patient:",
            "```",
            _explain(store, by_patient[0]),
            "```",
            "EXPLAIN, by date range:",
            "```",
            _explain(store, by_day[0]),
            "```",
            "",
        ]
        store.dispose()
        return lines
    finally:
        if drop is not None:
            with pg_connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{drop}" WITH (FORCE)')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=int, default=1_000_000)
    parser.add_argument("--api-studies", type=int, default=200)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    began = datetime.now(UTC)
    header = [
        f"- command: `python benchmarks/bench_store.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- date: {began.isoformat(timespec='seconds')}",
        f"- machine: {machine()}",
        f"- load average at start: {load()}",
        "",
    ]
    body: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            body += run_backend(backend.strip(), args, Path(tmp))
    print("\n".join([*header, *body, f"- load average at end: {load()}"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
