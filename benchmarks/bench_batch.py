"""Benchmark: ``radcaliper batch`` with the demo model: studies per hour, the re-run, and peak
memory as the tree grows (issue 9).

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_batch.py [--studies 200,1000] [--spec full|small] [--workers N]
                                     [--engines local,local:1,ray:2] [--cores 0,1] [--data DIR]
                                     [--json FILE]

For each tree size N (written once under ``--data``, default ``benchmarks/data/batch``, and
reused): N phantom studies (``--spec full``: the phantom spec's sizes, 224-288 pixels, 20-60
slices; ``small``: 128 x 128 x 20-24, for quick runs), each study a DICOM series with its
``truth.json``. Then, in a fresh SQLite database and a fresh work folder:

1. ``radcaliper batch TREE --report ...`` as a child process (pinned to ``--cores`` with
   ``taskset`` when given), with the demo model and ``--workers`` loader processes; wall time
   (start-up and model load included) and the batch's own time from the report; studies/hour.
2. The same command again: nothing new is stored; its wall time.

``--engines`` runs the same tree on each engine in turn: ``local`` (with ``--workers`` loader
processes and the default measuring processes), ``local:K`` (``--measurers K``; ``local:1``
measures in the batch process) and ``ray:K`` (``--engine ray --workers K``: a Ray instance
started by the batch on this machine, K measuring workers; issue 25).

Memory: the child's process tree (the batch and its loader processes; with Ray, the Ray
instance it starts and its workers) is sampled every 0.1 s from ``/proc``; the table gives the
peak of the tree's summed RSS and each process's own peak by role (the batch, loaders, Ray's
measuring workers, Ray's task workers, Ray's own services; the sampling can miss a peak shorter
than 0.1 s), and the highest RSS in each quarter of the run of the batch process and of the
largest other process (a measuring one), to see whether either still grows. Memory must not
grow with N: the file index and the report live on disk, and at most ``2 x workers`` studies
(Ray: ``2 x workers + 2``) are loaded at a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import load, machine

from ingestion.phantoms import PhantomSpec, write_phantoms

REPOSITORY = Path(__file__).resolve().parents[1]
SMALL = PhantomSpec.small()


def _tree(data: Path, n: int, spec: str) -> Path:
    """The tree of ``n`` studies (written once; a marker file says it is complete)."""
    root = data / f"{spec}-{n}"
    if (root / ".complete").is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    began = time.perf_counter()
    write_phantoms(root, n=n, seed=2027, spec=SMALL if spec == "small" else None)
    (root / ".complete").write_text("")
    print(f"wrote {n} {spec} studies in {time.perf_counter() - began:.0f} s", flush=True)
    return root


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _role(pid: int, batch: int) -> str:
    """What a process of the batch's tree is, from its command line (Ray renames workers)."""
    if pid == batch:
        return "batch"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    if not command:  # exiting (a zombie has no command line)
        return "gone"
    if "ray::MeasuringWorker" in command:
        return "ray measuring worker"
    if command.startswith("ray::"):
        return "ray task worker"
    if "multiprocessing" in command:
        return "pool process (loader or measuring)"
    return "ray service" if "ray" in command else "other"


def _by_role(sampler: _Sampler) -> dict[str, list[int]]:
    """Each process's peak RSS (MiB), highest first, by role."""
    roles: dict[str, list[int]] = {}
    for pid, kib in sampler.each_kib.items():
        roles.setdefault(sampler.roles.get(pid, "gone"), []).append(round(kib / 1024))
    return {role: sorted(peaks, reverse=True) for role, peaks in sorted(roles.items())}


def _tree_pids(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


class _Sampler(threading.Thread):
    """Peak summed RSS of a process tree and the peak of each process, sampled every 0.1 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kib = 0
        self.each_kib: dict[int, int] = {}
        self.roles: dict[int, str] = {}
        self.samples: dict[int, list[int]] = {}  # each process's RSS at every sample
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            sizes = {p: _rss_kib(p) for p in _tree_pids(self.pid)}
            self.peak_kib = max(self.peak_kib, sum(sizes.values()))
            for pid, kib in sizes.items():
                self.each_kib[pid] = max(self.each_kib.get(pid, 0), kib)
                if kib:
                    self.samples.setdefault(pid, []).append(kib)
                role = _role(pid, self.pid)  # Ray renames a worker when it takes its role
                if role != "gone" and self.roles.get(pid) != "ray measuring worker":
                    self.roles[pid] = role
            self.stop.wait(0.1)

    def quarters_mib(self, pid: int) -> list[int]:
        """A process's highest RSS in each quarter of its life (is it still growing?)."""
        samples = self.samples.get(pid, [])
        n = len(samples)
        return [round(max(samples[i * n // 4 : (i + 1) * n // 4] or [0]) / 1024) for i in range(4)]

    def largest_child(self) -> int | None:
        """The process of the tree, the batch's aside, with the highest peak (a measuring one)."""
        children = {pid: kib for pid, kib in self.each_kib.items() if pid != self.pid}
        return max(children, key=lambda pid: children[pid]) if children else None


def _run(command: list[str], cores: str | None) -> dict[str, Any]:
    if cores:
        command = ["taskset", "-c", cores, *command]
    began = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.PIPE, text=True)
    sampler = _Sampler(process.pid)
    sampler.start()
    stdout, _ = process.communicate()
    sampler.stop.set()
    sampler.join()
    peaks = sorted(sampler.each_kib.values(), reverse=True)
    largest = sampler.largest_child()
    return {
        "exit_code": process.returncode,
        "wall_s": time.perf_counter() - began,
        "peak_tree_mib": sampler.peak_kib / 1024,
        "process_peaks_mib": [round(k / 1024) for k in peaks],  # batch first, then loaders
        "peaks_by_role_mib": _by_role(sampler),
        "batch_quarters_mib": sampler.quarters_mib(process.pid),
        "largest_child_quarters_mib": sampler.quarters_mib(largest) if largest else [],
        "stdout": stdout.strip(),
    }


def bench(n: int, args: argparse.Namespace, engine: str = "local") -> dict[str, Any]:
    root = _tree(args.data, n, args.spec)
    work = Path(tempfile.mkdtemp(prefix=f"bench-batch-{n}-"))
    url = f"sqlite:///{work / 'store.sqlite3'}"
    subprocess.run(
        [sys.executable, "-m", "app.cli", "db", "upgrade", "--db", url],
        cwd=REPOSITORY,
        check=True,
        capture_output=True,
    )
    command = [sys.executable, "-m", "app.cli", "batch", str(root), "--db", url]
    if engine.startswith("local"):
        command += ["--work", str(work / "work"), "--workers", str(args.workers)]
        if ":" in engine:
            command += ["--measurers", engine.removeprefix("local:")]
    else:
        command += ["--work", str(work / "work"), "--engine", "ray"]
        command += ["--workers", engine.removeprefix("ray:")]
    first = _run([*command, "--report", str(work / "first")], args.cores)
    report = json.loads((work / "first.json").read_text())["summary"]
    again = _run([*command, "--report", str(work / "again")], args.cores)
    rerun = json.loads((work / "again.json").read_text())["summary"]
    shutil.rmtree(work)
    batch_s = report["seconds"]
    if rerun["model"] != report["model"]:
        raise SystemExit("the model changed between the two runs; run the benchmark again")
    return {
        "model": f"{report['model']['name']} {report['model']['version']}",
        "engine": engine,
        "studies": n,
        "spec": args.spec,
        "files": report["files"]["total"],
        "first": {k: v for k, v in first.items() if k != "stdout"},
        "stored": report["studies"]["stored"],
        "failed": report["studies"]["failed"],
        "batch_s": batch_s,
        "studies_per_hour": 3600 * report["studies"]["stored"] / batch_s,
        "studies_per_hour_wall": 3600 * report["studies"]["stored"] / first["wall_s"],
        "rerun": {k: v for k, v in again.items() if k != "stdout"},
        "rerun_batch_s": rerun["seconds"],
        "rerun_stored": rerun["studies"]["stored"],
        "rerun_already": rerun["studies"]["already_stored"],
        "rerun_headers_read": rerun["files"]["headers_read"],
    }


def _engine_label(engine: str) -> str:
    if engine == "local":
        return "local (default measurers)"
    if engine.startswith("local:"):
        return f"local, {engine[6:]} measuring process(es)"
    return f"ray, {engine[4:]} worker(s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", default="200,1000", help="tree sizes, comma-separated")
    parser.add_argument("--spec", choices=("full", "small"), default="full")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--engines",
        default="local",
        help="engines to compare on each tree: local, local:K (K measuring processes), "
        "ray:K (K measuring workers); "
        "comma-separated (default local)",
    )
    parser.add_argument("--cores", default=None, help="taskset CPU list, e.g. 0,1")
    parser.add_argument("--data", type=Path, default=REPOSITORY / "benchmarks" / "data" / "batch")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    command = "python benchmarks/bench_batch.py " + " ".join(sys.argv[1:])
    print(f"- command: `{command.strip()}`")
    print(f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}")
    print(f"- machine: {machine()}")
    print(f"- load average at start: {load()}")
    engines = args.engines.split(",")
    rows = [bench(int(n), args, engine) for n in args.studies.split(",") for engine in engines]
    print(f"- load average at end: {load()}")
    print(f"- model: {', '.join(sorted({r['model'] for r in rows}))}, workers {args.workers}\n")
    print(
        "| studies | engine | files | stored | batch time | studies/hour (batch) | wall time "
        "(start-up incl.) | peak RSS, whole process tree | peak per process | re-run wall "
        "(batch part) | re-run stored / already / headers read | batch RSS by quarter of the run "
        "| largest other process's RSS by quarter of its life |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        first, rerun = r["first"], r["rerun"]
        each = "; ".join(
            f"{role} {' + '.join(str(m) for m in peaks)}"
            for role, peaks in first["peaks_by_role_mib"].items()
        )
        engine = _engine_label(r["engine"])
        print(
            f"| {r['studies']} ({r['spec']}) | {engine} | {r['files']} | {r['stored']} (failed "
            f"{r['failed']}) | {r['batch_s']:.0f} s | {r['studies_per_hour']:,.0f} | "
            f"{first['wall_s']:.0f} s | {first['peak_tree_mib']:.0f} MiB | "
            f"{each} MiB | {rerun['wall_s']:.1f} s "
            f"({r['rerun_batch_s']:.2f} s) | {r['rerun_stored']} / {r['rerun_already']} / "
            f"{r['rerun_headers_read']} | {' / '.join(str(q) for q in first['batch_quarters_mib'])}"
            f" MiB | {' / '.join(str(q) for q in first['largest_child_quarters_mib'])} MiB |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
